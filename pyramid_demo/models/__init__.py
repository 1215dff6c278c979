"""Model loading: presets, the bundled offline target, shipped students, tiny-random models and tokenizer checks."""
