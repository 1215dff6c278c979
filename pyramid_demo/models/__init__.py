"""Model loading: presets, the bundled offline family, tiny-random models and tokenizer checks."""
