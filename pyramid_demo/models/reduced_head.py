"""A proposer's LM head over a subset of the vocabulary (FR-Spec, arXiv 2502.14856).

A student's head is most of its time (49,152 × 576 for SmolLM2). `ReducedHead` keeps a copy of
the N rows of the target's head for the tokens the target writes most often
(`weights/vocab.safetensors`, made by `python -m training distill vocab`) and scatters their
logits into a full-vocabulary row with −inf elsewhere, so the engine, the inspector's top-5 and
the charts see ordinary [.., V] logits, and the proposer's distribution is 0 outside the subset.
SD stays lossless with such a proposer (the residual norm(max(0, p − q)) covers the rest); the
fuzzy divergences need a rule for its zeros (`core.rules.support_divergence`).

    from pyramid_demo.models.reduced_head import ReducedHead
    student.lm_head = ReducedHead(target.lm_head, ids)   # never mutates target.lm_head

The projection is an ordinary `nn.Linear` of N rows (`proj`), so `core.packed.pack_linears`
packs it like any other bf16 linear. `weight` [N, D] and `ids` [N] are public (a lean forward
may compute `h @ weight.T` itself and scatter to `ids`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

FORMAT = "pyramid-vocab-subset-v1"


class ReducedHead(nn.Module):
    """Logits [.., V] that are −inf outside `ids`; inside, exactly `lm_head`'s rows `ids`."""

    def __init__(self, lm_head: nn.Module, ids: torch.Tensor):
        super().__init__()
        w = lm_head.weight.detach()  # [V, D]
        ids = torch.as_tensor(ids, dtype=torch.long, device=w.device).flatten()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= w.shape[0]:
            raise ValueError(f"ids must be a non-empty subset of 0..{w.shape[0] - 1}")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("ids must not repeat")
        bias = getattr(lm_head, "bias", None)
        self.vocab, self.in_features = w.shape[0], w.shape[1]
        self.proj = nn.Linear(w.shape[1], ids.numel(), bias=bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(w[ids])  # a copy: the target's head is left as it is
            if bias is not None:
                self.proj.bias.copy_(bias.detach()[ids])
        self.weight = self.proj.weight  # the same parameter, kept when pack_linears swaps `proj`
        self.register_buffer("ids", ids)

    @property
    def n(self) -> int:
        return self.ids.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.proj(h)  # [.., N]
        out = z.new_full((*z.shape[:-1], self.vocab), float("-inf"))  # [.., V]
        return out.index_copy_(-1, self.ids, z)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, n={self.n}, vocab={self.vocab}"


def reduce_head(model: nn.Module, ids: torch.Tensor) -> nn.Module:
    """Give `model` its own `ReducedHead` built from its current `lm_head` (which may be shared with
    another model: it is replaced on `model` only, never changed). Returns `model`."""
    model.lm_head = ReducedHead(model.lm_head, ids)
    return model


def save_subset(path: str | Path, ids: torch.Tensor, meta: dict) -> int:
    """Write the ranked ids (int32) with `meta` (json values); returns the file size."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = {"format": FORMAT, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}}
    save_file({"ids": ids.to(torch.int32).contiguous()}, str(path), metadata=md)
    return path.stat().st_size


def load_subset(path: str | Path) -> tuple[torch.Tensor, dict]:
    """The ranked ids (LongTensor [N]) and their metadata."""
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        ids = f.get_tensor("ids").long()
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    return ids, meta
