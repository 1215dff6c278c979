"""The candidates a CPU probe compares, each built as the loader would run it: bf16 through oneDNN "packed"
(batch-invariant) where offered, else plain oneDNN, and "no-onednn"; bf16 only on native bf16 CPUs."""
from __future__ import annotations

import copy

import torch

from ...core.config import LONGEST_PASS
from ...forward.attention import use_rowwise
from ...forward.packed import available as packed_available
from ...forward.packed import bf16_linears, invariant_pad, pack_linears
from .machine import native_bf16

CANDIDATES = (("float32", "default"), ("bfloat16", "packed"), ("bfloat16", "onednn"), ("bfloat16", "no-onednn"))


def candidates(lower: bool = False) -> list[tuple[str, str]]:
    """The (dtype, backend) pairs worth timing on this CPU: the target keeps its reference precision (fp32) unless
    `lower` (asked for by name) admits bf16; lower precision is what the quantized copy is for."""
    if not lower:
        return [c for c in CANDIDATES if c[0] == "float32"]
    packed = packed_available(torch.bfloat16)
    skip = "onednn" if packed else "packed"
    return [c for c in CANDIDATES if c[0] == "float32" or (native_bf16() and c[1] != skip)]


def candidate_model(target: torch.nn.Module, dt: str, backend: str) -> tuple[torch.nn.Module, int]:
    """The target as the loader would run it under (dt, backend), and the packed linears' padding."""
    if dt == "float32":
        return target, 1
    model = copy.deepcopy(target).to(getattr(torch, dt))
    use_rowwise(model)  # as the loader runs 16-bit CPU models (see `forward.attention`)
    pad = 1
    if backend == "packed":
        pad = invariant_pad(bf16_linears([model]), LONGEST_PASS) or 1
        pack_linears([model], pad)
    return model, pad
