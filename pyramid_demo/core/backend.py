"""The CPU matmul backend a forward runs under, and the cache-prefix helper both LM paths share.

Its own module so that `lm` (HF's forward) and `lean` (the lean forward) use the same flags
without importing each other (the import rules forbid cycles, lazy ones included).
"""
from __future__ import annotations

import contextlib

import torch

BACKENDS = ("default", "onednn", "no-onednn", "packed")  # packed: linears packed at load (core.packed)


def new_tokens(ids: list[int], seq: list[int], keep: int, role: str) -> list[int]:
    """What a cached forward must feed: the tokens of `seq` past the cached `ids`, at least `keep` of them."""
    new = seq[len(ids):]
    if not new or keep > len(new):
        raise ValueError(f"{role}: asked for {keep} logits but only {len(new)} new tokens")
    return new


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@contextlib.contextmanager
def _onednn(enabled: bool):
    set_flags = torch.backends.mkldnn.set_flags  # only the enabled flag (mkldnn.flags() also sets TF32)
    old = set_flags(_enabled=enabled, _fp32_precision=None)[0]
    try:
        yield
    finally:
        set_flags(_enabled=old, _fp32_precision=None)


def backend_flags(backend: str = "default") -> contextlib.AbstractContextManager:
    """The CPU backend for the forwards run inside: oneDNN on or off ("default": leave torch's setting)."""
    if backend not in ("onednn", "no-onednn"):
        return contextlib.nullcontext()
    return _onednn(backend == "onednn")
