"""The per-run cache of a proposer that reads the target (EAGLE-style). Row i holds x_i with the target's state at i-1
(its own prediction past what the target scored); a row fed a predicted state goes stale once the target's own arrives,
so `truncate` drops it and the accepted prefix is re-read with the true states in one forward."""

from __future__ import annotations

from typing import Any

import torch

from .cache import CachedModel, VerifierStates, grown, tree_seen
from .core import MIN_CAPACITY, rope_table, stack


class FeatureLM(CachedModel):
    """One run's cache over a feature draft module (fc + a decoder layer + the target's norm and head): the layer
    runs on the core's pass (`core.stack`), its cache laid out as the core's."""

    trees = True  # its forward takes tree rows (`_run_tree`)
    feeds_chains = False  # a feed advances what it has read of its verifier's states: pending rows never feed

    def __init__(self, module: Any, vocab_size: int, role: str, capacity: int = MIN_CAPACITY):
        super().__init__(role)
        self.m: Any = module  # a `models.feature_draft.FeatureDraft` (duck-typed: core knows no models)
        with torch.no_grad():  # its joined weights, shared by every run (`FeatureDraft.joint_weights`)
            self.w = module.weights()  # one layer of the core's (`core.stack`), its inputs the draft's own
        self.vocab_size = vocab_size
        self.states = VerifierStates(getattr(module, "taps", ()))  # its verifier publishes here (`engine.connect`)
        self.dtype: torch.dtype = self.w.dtype
        self.device: torch.device = self.w.norm.device
        kw = {"dtype": self.dtype, "device": self.device}
        self.kv = [torch.zeros(self.w.n_kv, capacity, self.w.head_dim, **kw) for _ in range(2)]  # keys, values
        self.pred = torch.zeros(capacity, self.m.d, **kw)  # [T, d]: the state each row predicted
        self._tables(capacity)
        self.true_upto = 0  # rows 0 .. true_upto-1 were fed the verifier's own states (or row 0's zeros)

    def _grow(self, need: int) -> None:
        if need > self.pred.shape[0]:
            self.kv = [grown(c, 1, need) for c in self.kv]
            self.pred = grown(self.pred, 0, self.kv[0].shape[1])
            self._tables(self.kv[0].shape[1])

    def _tables(self, capacity: int) -> None:
        w = self.w
        self.cos, self.sin = rope_table(w.inv_freq.to(self.device), capacity, self.dtype, w.rope_scale)  # [T, D]

    def _crop(self, pos: int) -> None:
        self.true_upto = min(self.true_upto, pos)

    def truncate(self, pos: int) -> int:
        """As every cache, and also drop rows fed a predicted state the target has since scored itself."""
        if self.true_upto < len(self.ids) and self.states.n >= self.true_upto:
            pos = min(pos, self.true_upto)
        return super().truncate(pos)

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        for c in self.kv:
            c[:, pos : pos + len(slots)] = c[:, slots]  # the RHS gather copies first
        self.pred[pos : pos + len(slots)] = self.pred[slots]

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        end = pos + len(tokens)
        self._grow(end)
        toks = torch.tensor(tokens, dtype=torch.long, device=self.device)
        start = pos
        while start < end:  # rows whose inputs are all known run as one chunk; a predicted input waits its row
            stop = max(start + 1, min(end, self.states.n + 1))
            self._chain_rows(toks[start - pos : stop - pos], start)
            start = stop
        return self._logits(self.pred[end - keep : end])

    def _logits(self, f: torch.Tensor) -> torch.Tensor:
        z = self.m.logits_subset(f).float().cpu()  # [n, S]
        out = z.new_full((f.shape[0], self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.m.subset.cpu(), z)  # [n, V]: -inf outside the subset

    def _chain_rows(self, toks: torch.Tensor, start: int) -> None:
        """Rows start … start+c-1 (tokens toks [c]) through fc and the layer; their predicted states -> pred."""
        m, c, known = self.m, toks.shape[0], self.states.n
        f_prev = torch.zeros(c, m.d, dtype=self.dtype, device=self.device)  # [c, d]: row r reads state start+r-1
        a = max(start - 1, 0)  # the first state index read (row 0 reads zeros)
        b = min(start - 1 + c, known)  # states the target has scored: read them
        if b > a:
            assert self.states.f is not None
            f_prev[a - start + 1 : b - start + 1] = m.reduce(self.states.f[a:b].to(self.dtype))  # [b - a, d]
        for i in range(max(start, b + 1), start + c):  # rows past the target's states read this cache's own
            f_prev[i - start] = self.pred[i - 1]  # (`_run` chunks so that i-1 < start here)
        n_true = max(0, min(c, b - start + 1))  # rows that read the verifier's own states (row 0: zeros)
        if start == self.true_upto:
            self.true_upto = start + n_true
        seen = None  # one row sees every slot before it and itself: no mask to build or apply
        if c > 1:
            ar = torch.arange(start + c, device=self.device)
            seen = ar[None] <= ar[start:, None]  # causal [c, start + c]
        self._rows(toks, f_prev, start, seen)

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        """Tree rows (a grown tree's level) in one pass: a root reads the state at pos − 1, another its parent's."""
        new, end = rows[base:], pos + len(rows)
        self._grow(end)
        f_prev = torch.zeros(len(new), self.m.d, dtype=self.dtype, device=self.device)  # [c, d]
        for i, (_, par, _) in enumerate(new):
            if par >= 0:
                f_prev[i] = self.pred[pos + par]
            elif pos > 0 and self.states.n >= pos:  # the verifier's own state at pos − 1
                assert self.states.f is not None
                f_prev[i] = self.m.reduce(self.states.f[pos - 1 : pos].to(self.dtype))[0]
            elif pos > 0:
                f_prev[i] = self.pred[pos - 1]
        seen = tree_seen(rows, base, pos).to(self.device)  # [c, end]
        toks = torch.tensor([r[0] for r in new], dtype=torch.long, device=self.device)
        self._rows(toks, f_prev, pos + base, seen, torch.tensor([r[2] for r in new]))
        return self._logits(self.pred[pos + base : end])

    def _rows(
        self,
        toks: torch.Tensor,
        f_prev: torch.Tensor,
        first: int,
        seen: torch.Tensor | None,
        at: torch.Tensor | None = None,
    ) -> None:
        """Rows toks [c] with input states f_prev [c, d] into cache slots first … first+c-1 (RoPE at positions `at`,
        default the slots), attending where `seen` [c, first+c] (None: every slot up to theirs); predicted states ->
        pred[slots]."""
        end = first + toks.shape[0]
        slots = torch.arange(first, end)
        at = slots if at is None else at
        kv = [c[:, :end] for c in self.kv]
        x = self.m.inputs(f_prev, toks)  # [c, d]
        self.pred[slots] = stack(self.w, x, self.cos[at], self.sin[at], slots.to(self.device), seen, kv)
