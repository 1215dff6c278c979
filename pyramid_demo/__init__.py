"""PyramidSD Explorer: speculative decoding with a draft, a qualifier and a target, made visible."""

from .core.methods import METHODS, DecodeConfig

__all__ = ["METHODS", "DecodeConfig"]
