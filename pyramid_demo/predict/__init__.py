"""Prediction, measurement, explanation: cost profiles, speed models, noise, the insertion test (the loop's readers)."""
