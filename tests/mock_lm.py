"""A mock model for engine tests: next-token logits depend only on the last token (a bigram).

It follows the engine's LM interface and records what it was fed, so tests can check caches
and compute exact target distributions by hand.
"""
from __future__ import annotations

import torch


class BigramLM:
    def __init__(self, table: torch.Tensor, role: str = "target"):
        self.table = table  # [V, V] logits of the next token given the last one
        self.role = role
        self.ids: list[int] = []
        self.n_forward = 0
        self.time_s = 0.0
        self.fed: list[int] = []

    def logits(self, seq: list[int], keep: int) -> torch.Tensor:
        new = seq[len(self.ids):]
        assert new and keep <= len(new), (self.role, len(self.ids), len(seq), keep)
        self.ids.extend(new)
        self.n_forward += 1
        self.fed.append(len(new))
        return self.table[torch.tensor(seq[-keep:])].float()  # [keep, V]

    def rollback(self, seq: list[int]) -> None:
        keep = 0
        while keep < min(len(self.ids), len(seq) - 1) and self.ids[keep] == seq[keep]:
            keep += 1
        del self.ids[keep:]

    def reset_counters(self) -> None:
        self.n_forward, self.time_s, self.fed = 0, 0.0, []


def bigram_table(vocab: int, seed: int, sharpness: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return sharpness * torch.randn(vocab, vocab, generator=g)
