"""The models' forwards: one cache bookkeeping (`cache`), HF's forward (`lm.CachedLM`), the lean forward
(`lean`), the feature draft's (`feature_lm`), and the weights and kernels they read. Knows no decoding rule."""
