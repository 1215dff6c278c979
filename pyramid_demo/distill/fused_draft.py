"""An EAGLE-3-style input for the feature draft, for an offline comparison (not used at run time).

EAGLE-3 (arXiv 2503.01840) feeds its head a fusion of the target's low, middle and high layers' states
instead of the last state alone. Here the fusion is residual: the head reads

    g_{i-1} = f_{i-1} + W [rms(h^a_{i-1}) ; rms(h^b_{i-1})]

where f is the target's final normed state (what today's head reads), h^a and h^b the outputs of two lower
decoder layers (`features.generate(layers=...)` keeps them), rms a weightless RMS norm and W starts at zero,
so a fused head starts as the head it is initialised from (e.g. the shipped one) and the comparison at equal
CPU time on the same data isolates what the lower layers add. Rows fed a predicted state (draft position 2
on) read the head's own predicted f, as today's head does; only the first drafted position can read the
target's lower layers, since only there has the target run.

Using it in the engine needs the target's forward to hand out those layers' states too (core/, not here).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models.feature_draft import FeatureDraft


class FusedDraft(FeatureDraft):
    fused = True

    def __init__(self, target: nn.Module, subset: torch.Tensor, n_layers: int = 2):
        super().__init__(target, subset)
        self.fuse_w = nn.Parameter(torch.zeros(self.d, n_layers * self.d, dtype=self.fc_w.dtype))

    def fuse(self, f_prev: torch.Tensor, l_prev: torch.Tensor) -> torch.Tensor:
        """f_prev [B, T, d] and the lower layers' states l_prev [B, T, k, d] -> the fused input [B, T, d]."""
        lf = l_prev.float()
        ln = (lf * torch.rsqrt(lf.pow(2).mean(-1, keepdim=True) + self.eps)).to(f_prev.dtype)
        return f_prev + F.linear(ln.flatten(-2), self.fuse_w)

    def forward_train(self, f_prev: torch.Tensor, tokens: torch.Tensor, passes: int = 1,
                      l_prev: torch.Tensor | None = None) -> list[torch.Tensor]:
        if l_prev is not None:
            f_prev = self.fuse(f_prev, l_prev.to(f_prev.dtype))
        return super().forward_train(f_prev, tokens, passes)

    def load(self, path: str | Path) -> FusedDraft:
        """A plain feature draft's file (fuse_w stays zero) or a fused one's."""
        from safetensors import safe_open
        with safe_open(str(path), "pt") as fh:
            sd = {k: fh.get_tensor(k).to(self.norm.dtype) for k in fh.keys()}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"fuse_w"}:
            raise ValueError(f"{path}: missing {missing}, unexpected {unexpected}")
        return self
