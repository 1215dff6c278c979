"""PyramidSD Explorer: speculative decoding with a draft, a qualifier and a target, made visible."""

from .core.config import METHODS, DecodeConfig

__all__ = ["METHODS", "DecodeConfig"]
