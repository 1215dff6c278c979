"""Prediction, measurement and explanation: cost profiles, the speed models, noise, the insertion test. Reads the
loop's records; the loop never imports it."""
