"""The CPU matmul backend a forward runs under, shared by `lm` and `lean` without importing each other."""
from __future__ import annotations

import contextlib

import torch

BACKENDS = ("default", "onednn", "no-onednn", "packed")  # packed: linears packed at load (forward.packed)


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
