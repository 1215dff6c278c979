"""The per-run state of a proposer that reads the target (EAGLE-style): its own cache and rollback.

Row i of its cache holds token x_i with the target's state at i-1 and predicts x_{i+1} (the module's
docstring, `models.feature_draft`). Where the target has scored i-1 it reads the target's own state
(`TargetStates`, written by the target's forward); past that it reads the state it predicted itself.
A row fed with a predicted state goes stale once the target's own state for that position arrives, so
`truncate` drops it: after a target pass the proposer re-reads the accepted prefix with the true states
(one multi-row forward, whose last row already gives the next draft token).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .cache import CachedModel, TargetStates


class FeatureLM(CachedModel):
    """One run's cache over a feature draft module (fc + a decoder layer + the target's norm and head)."""

    def __init__(self, module: Any, vocab_size: int, role: str, capacity: int = 256):
        super().__init__(role)
        self.m: Any = module  # a `models.feature_draft.FeatureDraft` (duck-typed: core knows no models)
        self.vocab_size = vocab_size
        self.states: TargetStates | None = None  # set by the engine (`engine.connect`) before the prefill
        self.dtype: torch.dtype = self.m.norm.dtype
        self.device: torch.device = self.m.norm.device
        kw = {"dtype": self.dtype, "device": self.device}
        self.kv = torch.zeros(2, self.m.n_kv, capacity, self.m.head_dim, **kw)  # [2, H_kv, T, D]
        self.pred = torch.zeros(capacity, self.m.d, **kw)  # [T, d]: the state each row predicted
        self._tables(capacity)
        self.true_upto = 0  # rows 0 .. true_upto-1 were fed the target's own states (or row 0's zeros)

    def _grow(self, need: int) -> None:
        cap = self.kv.shape[2]
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        kv = self.kv.new_zeros(2, self.kv.shape[1], cap, self.kv.shape[3])
        kv[:, :, : self.kv.shape[2]] = self.kv
        pred = self.pred.new_zeros(cap, self.pred.shape[1])
        pred[: self.pred.shape[0]] = self.pred
        self.kv, self.pred = kv, pred
        self._tables(cap)

    def _tables(self, capacity: int) -> None:
        cos, sin = self.m.rope_tables(capacity, self.dtype)  # [T, D] each
        self.cos, self.sin = cos.to(self.device), sin.to(self.device)

    def _known(self) -> int:
        return self.states.n if self.states is not None else 0

    def _crop(self, pos: int) -> None:
        self.true_upto = min(self.true_upto, pos)

    def truncate(self, pos: int) -> int:
        """As every cache, and also drop rows fed a predicted state the target has since scored itself."""
        if self.true_upto < len(self.ids) and self._known() >= self.true_upto:
            pos = min(pos, self.true_upto)
        return super().truncate(pos)

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        end = pos + len(tokens)
        self._grow(end)
        toks = torch.tensor(tokens, dtype=torch.long, device=self.device)
        start = pos
        while start < end:  # rows whose inputs are all known run as one chunk; a predicted input waits its row
            stop = max(start + 1, min(end, self._known() + 1))
            self._rows(toks[start - pos: stop - pos], start)
            start = stop
        z = self.m.logits_subset(self.pred[end - keep: end]).float().cpu()  # [keep, S]
        out = z.new_full((keep, self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.m.subset.cpu(), z)  # [keep, V]: -inf outside the subset

    def _rows(self, toks: torch.Tensor, start: int) -> None:
        """Rows start … start+c-1 (tokens toks [c]) through fc and the layer; their predicted states -> pred."""
        m, c, known = self.m, toks.shape[0], self._known()
        f_prev = torch.zeros(c, m.d, dtype=self.dtype, device=self.device)  # [c, d]: row r reads state start+r-1
        a = max(start - 1, 0)  # the first state index read (row 0 reads zeros)
        b = min(start - 1 + c, known)  # states the target has scored: read them
        if b > a:
            assert self.states is not None and self.states.f is not None
            f_prev[a - start + 1: b - start + 1] = self.states.f[a:b]
        for i in range(max(start, b + 1), start + c):  # rows past the target's states read this cache's own
            f_prev[i - start] = self.pred[i - 1]  # (`_run` chunks so that i-1 < start here)
        n_true = max(0, min(c, b - start + 1))  # rows that read the target's own states (row 0: zeros)
        if start == self.true_upto:
            self.true_upto = start + n_true
        x = m.inputs(f_prev, toks)[None]  # [1, c, d]
        end = start + c
        q, k, v = m.qkv(x, self.cos[start:end], self.sin[start:end])  # [1, H, c, D], [1, H_kv, c, D] ×2
        self.kv[0, :, start:end], self.kv[1, :, start:end] = k[0], v[0]
        rep = m.n_heads // m.n_kv
        keys = self.kv[0, :, :end].repeat_interleave(rep, 0)[None]  # [1, H, end, D]
        vals = self.kv[1, :, :end].repeat_interleave(rep, 0)[None]
        ar = torch.arange(end, device=self.device)
        mask = ar[None] <= ar[start:end, None]  # [c, end]: causal
        att = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)  # [1, H, c, D]
        self.pred[start:end] = m.finish(x, att)[0]
