"""The models' forwards (the core's, compiled or not; HF's; the feature draft's), their cache and weights. No rules."""
