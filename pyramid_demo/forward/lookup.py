"""Prompt lookup (PLD, Saxena 2023): a proposer with no model. It continues the most recent earlier occurrence of the
text's last n tokens (n from its longest n-gram down to 1), in the prompt and the text written so far. Its proposal
is one-hot (logits 0 at the token, −inf elsewhere): the exact rule stays lossless, a fuzzy rule sees a certainty."""

from __future__ import annotations

import re
import time

import numpy as np
import torch

from .cache import CachedModel

NGRAM = 3  # the field's longest n-gram (transformers' `max_matching_ngram_size` default is 2; PLD's own code 3)
NAME = "pld"  # how a family names it in a slot: "pld", or "pld:N" for a longest n-gram of N


def lookup(tokens: list[int], ngram: int, n: int, shortest: int = 1) -> list[int]:
    """Up to n tokens that followed the most recent earlier occurrence of `tokens`' last g tokens, the longest g ≤
    ngram that occurs earlier first, down to g = `shortest`; the copy stops at the end of the text; [] when no such
    suffix occurs earlier. (One vectorised scan: a long prompt costs microseconds, not a draft pass.)"""
    a = np.asarray(tokens, dtype=np.int64)
    ends = np.flatnonzero(a[:-1] == a[-1]) if len(a) > 1 else a[:0]  # earlier places of the last token
    best, g = -1, 0
    while len(ends) and g < ngram:  # ends: where the last g + 1 tokens occurred earlier, in order
        best, g = int(ends[-1]), g + 1
        ends = ends[ends >= g]
        ends = ends[a[ends - g] == a[-g - 1]]  # the last g + 1 tokens: one more to the left
    return tokens[best + 1 : best + 1 + n] if g >= max(shortest, 1) else []


def parse(ref: str) -> int | None:
    """The longest n-gram a slot reference asks prompt lookup for ("pld": NGRAM, "pld:N": N), None for a model."""
    m = re.fullmatch(rf"{NAME}(?::(\d+))?", ref.strip().lower())
    if m is None:
        return None
    g = int(m.group(1) or NGRAM)
    if not 1 <= g <= 16:
        raise ValueError(f"prompt lookup's longest n-gram must be 1 to 16, not {g} ({ref!r})")
    return g


class PromptLookup(torch.nn.Module):
    """Prompt lookup in a family's slot, where a draft model would be: its one setting, no weights. (A module so the
    family holds it like any model; the tokens it proposes per round are the stage's length setting.)"""

    def __init__(self, ngram: int = NGRAM) -> None:
        super().__init__()
        self.ngram = ngram

    @property
    def ref(self) -> str:
        return NAME if self.ngram == NGRAM else f"{NAME}:{self.ngram}"

    def extra_repr(self) -> str:
        return f"ngram={self.ngram}"


def one_hot(tokens: list[int], vocab_size: int) -> torch.Tensor:
    """Logits [n, V] that give each token all the probability (0 there, −inf elsewhere)."""
    z = torch.full((len(tokens), vocab_size), float("-inf"))
    z[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 0.0
    return z


class LookupLM(CachedModel):
    """One run's prompt lookup: `chain_after` reads the sequence it is given (it keeps no cache). A plain feed (prefill,
    the setup's checks and timers) answers each row with the lookup's next token, uniform where nothing matches."""

    def __init__(self, model: PromptLookup, vocab_size: int, role: str) -> None:
        super().__init__(role)
        self.ngram = model.ngram
        self.vocab_size = vocab_size

    def chain_after(self, seq: list[int], n: int) -> tuple[list[int], torch.Tensor]:
        """The lookup's chain after `seq`: up to n tokens and their one-hot logits [k, V]; counted as one call."""
        t0 = time.perf_counter()
        x = lookup(seq, self.ngram, n)
        z = one_hot(x, self.vocab_size)
        self.time_s += time.perf_counter() - t0
        self.n_forward += 1
        self.fed.append(len(seq) - len(self.ids))
        return x, z

    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        ctx = self.ids + tokens
        z = torch.zeros(keep, self.vocab_size)
        for row, end in enumerate(range(len(ctx) - keep + 1, len(ctx) + 1)):
            nxt = lookup(ctx[:end], self.ngram, 1)
            if nxt:
                z[row] = one_hot(nxt, self.vocab_size)[0]
        return z

    def _crop(self, pos: int) -> None:
        """Nothing is cached: the lookup reads the sequence itself."""
