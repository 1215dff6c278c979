"""A mock model for engine tests: next-token logits depend only on the last token (a bigram).

It is a `CachedModel` like every real model (the same bookkeeping and checks), so tests can check
caches and compute exact target distributions by hand.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from pyramid_demo.forward.cache import CachedModel


class BigramLM(CachedModel):
    trees = True  # its forward takes tree rows (`_run_tree`)

    def __init__(self, table: torch.Tensor, role: str = "target"):
        super().__init__(role)
        self.table = table  # [V, V] logits of the next token given the last one
        self.vocab_size = table.shape[0]

    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        return self.table[torch.tensor(tokens[-keep:])].float()  # [keep, V]

    def _crop(self, pos: int) -> None:
        """Nothing to drop: the bigram keeps no keys or values."""

    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        """A tree row's logits depend on its own token only (a bigram), whatever its ancestors."""
        return self.table[torch.tensor([r[0] for r in rows[base:]])].float()  # [n, V]

    def _compact(self, pos: int, slots: list[int]) -> None:
        """Nothing to move: the bigram keeps no keys or values."""


class SubsetHead(nn.Module):
    """A head over a token subset, as the feature draft's: `lm_head`'s logits on `ids`, −inf elsewhere, at the
    full vocabulary width (`vocab`). It holds a copy of those rows: the source head is never changed."""

    def __init__(self, lm_head: nn.Module, ids: torch.Tensor):
        super().__init__()
        w = lm_head.weight.detach()  # [V, D]
        self.vocab = int(w.shape[0])
        self.register_buffer("ids", torch.as_tensor(ids, dtype=torch.long).flatten())
        self.register_buffer("rows", w[self.ids].clone())  # [N, D]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = h.new_full((*h.shape[:-1], self.vocab), float("-inf"))  # [.., V]
        return out.index_copy_(-1, self.ids, F.linear(h, self.rows))


def bigram_table(vocab: int, seed: int, sharpness: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return sharpness * torch.randn(vocab, vocab, generator=g)


def as_run(cfg):
    """A config as the run layer hands it to the engine: shape "auto" settled (here: to the chain), as
    `run.shape_to_run` does when nobody priced it."""
    return dataclasses.replace(cfg, shape="chain") if cfg.shape == "auto" else cfg
