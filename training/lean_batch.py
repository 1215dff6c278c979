"""A batched lean forward of the target for data generation: B sequences in one preallocated KV cache.

Why: the engine's `forward.core.CoreLM` decodes one sequence (its exactness rules are about one-token steps
against k-token passes); a corpus is made fastest by many sequences at once, since a one-row step on a CPU
pays per-call cost and reads every weight for one token. Here every row has its own position (no left
padding: row b's tokens sit in cache slots 0 … n_b − 1), a finished row is refilled with the next prompt
(continuous batching: no step is spent on rows that are done), and the same weights
(`forward.weights.weights`:
fused QKV and gate/up) are read once per step for all rows. Exactness across batch sizes is not needed here:
the data is the target's own samples, and the draft's training states are recomputed by `states` anyway.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pyramid_demo.forward.cache import tap_norm
from pyramid_demo.forward.core import finish, project, rms_norm, rope_table
from pyramid_demo.forward.weights import weights


class BatchedLean:
    """`rows` sequences of at most `capacity` tokens each over one target (a Llama-family model on the CPU)."""

    def __init__(self, model: Any, rows: int, capacity: int, rowwise: bool | None = None):
        self.w = w = weights(model)
        self.rowwise = rowwise  # decode attention row by row (None: when it reads fewer keys, see `step`)
        self.rows, self.capacity = rows, capacity
        self.kv = torch.zeros(len(w.layers), 2, rows, w.n_kv, capacity, w.head_dim, dtype=w.dtype)  # [L,2,B,Hkv,T,D]
        self.cos, self.sin = rope_table(w.inv_freq, capacity, w.dtype, w.rope_scale)  # [T, D]: the core's table
        self.pos = torch.zeros(rows, dtype=torch.long)  # [B] the next free slot of each row

    @torch.inference_mode()
    def set_prefix(self, ids: list[int]) -> None:
        """Keep the keys and values of a prefix most prompts share (the chat template's system turn): a prompt
        that starts with it, and is longer, gets them copied instead of computed (`prefill`)."""
        one = BatchedLean.__new__(BatchedLean)
        one.w, one.rows, one.capacity, one.rowwise = self.w, 1, len(ids), None
        one.kv = self.kv.new_zeros(*self.kv.shape[:2], 1, self.kv.shape[3], len(ids), self.kv.shape[5])
        one.cos, one.sin, one.pos = self.cos, self.sin, torch.zeros(1, dtype=torch.long)
        one._prefill([0], [ids], False)
        self.prefix, self.prefix_kv = list(ids), one.kv[:, :, 0].clone()  # [L, 2, Hkv, P0, D]

    @torch.inference_mode()
    def prefill(
        self, slots: list[int], prompts: list[list[int]], states: bool = False, taps: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """Write each prompt into its row's cache from slot 0 (right padded, causal) -> the logits after each
        prompt's last token [len(slots), V] fp32, or with `states` the normed final state at every position
        [len(slots), P, d] (row b valid for its first len(prompts[b]) positions). For logits the prompts run in
        groups of similar length (sorted; a group's padding stays under a quarter of its tokens), since every
        padded position costs a full forward, and a prompt starting with the `set_prefix` prefix runs only its
        tokens past it."""
        if states:
            return self._prefill(slots, prompts, states, taps=taps)
        p0 = len(getattr(self, "prefix", ()))
        pre = {i for i, p in enumerate(prompts) if p0 and len(p) > p0 and p[:p0] == self.prefix}
        out: torch.Tensor | None = None
        for start, idx in ((p0, sorted(pre)), (0, [i for i in range(len(prompts)) if i not in pre])):
            order = sorted(idx, key=lambda i: len(prompts[i]))
            i = 0
            while i < len(order):
                j, tot = i + 1, len(prompts[order[i]])
                while j < len(order) and len(prompts[order[j]]) * (j - i + 1) <= 1.25 * (tot + len(prompts[order[j]])):
                    tot += len(prompts[order[j]])
                    j += 1
                part = order[i:j]
                lg = self._prefill([slots[k] for k in part], [prompts[k] for k in part], False, start)  # [j-i, V]
                if out is None:
                    out = lg.new_empty(len(slots), lg.shape[1])
                out[torch.tensor(part)] = lg
                i = j
        assert out is not None
        return out

    def _prefill(
        self, slots: list[int], prompts: list[list[int]], states: bool, start: int = 0, taps: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """Positions start … of each prompt (slots < start: the prefix, copied from `prefix_kv`). With `states`
        and `taps`, the state is wide: each tapped layer's output RMS-normalised (`tap_norm`), then the normed
        final state [n, P, (len(taps) + 1)·d]."""
        w = self.w
        n, P = len(slots), max(len(p) for p in prompts)
        if P > self.capacity:
            raise ValueError(f"a prompt of {P} tokens does not fit a cache of {self.capacity}")
        m = P - start  # positions run
        ids = torch.zeros(n, m, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, : len(p) - start] = torch.tensor(p[start:])
        rows = torch.tensor(slots)
        if start:
            self.kv[:, :, rows, :, :start] = self.prefix_kv.unsqueeze(2)  # [L, 2, n, Hkv, start, D]
        x = F.embedding(ids, w.embed)  # [n, m, d]
        at = torch.arange(start, P)
        c, s = self.cos[at][:, None], self.sin[at][:, None]  # [m, 1, D]
        mask = torch.arange(P)[None] <= at[:, None] if start else None  # [m, P]: the prefix and causal
        tapped = []
        for li, lay in enumerate(w.layers):
            q, k, v = project(lay, x, c, s, w)  # [n, H, m, D], [n, Hkv, m, D] ×2
            self.kv[li, 0, rows, :, start:P] = k
            self.kv[li, 1, rows, :, start:P] = v
            if start:
                k, v = self.kv[li, 0, rows, :, :P], self.kv[li, 1, rows, :, :P]  # [n, Hkv, P, D] prefix included
            att = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=w.n_heads != w.n_kv
            )  # [n, H, m, D]
            x = finish(lay, x, att, w.eps)
            if li in taps:
                tapped.append(tap_norm(x, w.eps))
        self.pos[rows] = torch.tensor([len(p) for p in prompts])
        if states:
            return torch.cat([*tapped, rms_norm(x, w.norm, w.eps)], -1)  # [n, P, (taps + 1)·d] (start is 0 here)
        last = x[torch.arange(n), torch.tensor([len(p) - 1 - start for p in prompts])]  # [n, d]
        return w.head(rms_norm(last, w.norm, w.eps)).float()  # [n, V]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (tokens [B]) at each row's next slot -> logits [B, V] fp32."""
        w = self.w
        B, pos = self.rows, self.pos
        if int(pos.max()) >= self.capacity:
            raise ValueError("a row has filled its cache")
        hq, hk, dh = w.n_heads, w.n_kv, w.head_dim
        rep, t = hq // hk, int(pos.max()) + 1
        lens = (pos + 1).tolist()
        # one masked call reads every row's keys up to the longest row; row by row reads each row's own only
        # (one SDPA call per row and layer): that pays once the lengths differ widely (a long prompt in the batch)
        by_row = self.rowwise if self.rowwise is not None else B * t > 2 * sum(lens)
        mask = (torch.arange(t)[None] <= pos[:, None])[:, None, None]  # [B, 1, 1, t]: each row's own keys
        rows = torch.arange(B)
        x = F.embedding(tokens, w.embed)  # [B, d]
        c, s = self.cos[pos][:, None], self.sin[pos][:, None]  # [B, 1, D]: each row at its own position
        for li, lay in enumerate(w.layers):
            q, k, v = project(lay, x, c, s, w)  # [H, B, D], [Hkv, B, D] ×2: the rows as one sequence
            kc, vc = self.kv[li, 0], self.kv[li, 1]  # [B, Hkv, T, D]
            kc[rows, :, pos] = k.transpose(0, 1)
            vc[rows, :, pos] = v.transpose(0, 1)
            q = q.transpose(0, 1).reshape(B, hk, rep, dh)  # [B, Hkv, rep, D]: the rep query heads of a KV head as rows
            if by_row:
                att = torch.cat(
                    [
                        F.scaled_dot_product_attention(q[b : b + 1], kc[b : b + 1, :, :n], vc[b : b + 1, :, :n])
                        for b, n in enumerate(lens)
                    ]
                )  # [B, Hkv, rep, D]
            else:
                att = F.scaled_dot_product_attention(q, kc[:, :, :t], vc[:, :, :t], attn_mask=mask)
            x = finish(lay, x, att.reshape(B, hq, dh).transpose(0, 1), w.eps)  # [B, d]
        self.pos = pos + 1
        return w.head(rms_norm(x, w.norm, w.eps)).float()  # [B, V]


@torch.inference_mode()
def states(
    model: Any, seqs: list[list[int]], max_tokens: int = 16384, taps: tuple[int, ...] = ()
) -> list[torch.Tensor]:
    """The target's normed final state at every position of each sequence ([len(s), d] each, the model's
    dtype; with `taps` the tapped layers' normalised outputs first, [len(s), (len(taps) + 1)·d]), by one
    teacher-forced pass per sequence, batched by length so each pass holds ≤ max_tokens."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[torch.Tensor | None] = [None] * len(seqs)
    i = 0
    while i < len(order):
        P = len(seqs[order[i]])
        j = i + 1
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= max_tokens:
            j += 1
        group = [seqs[k] for k in order[i:j]]
        P = max(len(s) for s in group)
        lm = BatchedLean(model, len(group), P)
        f = lm.prefill(list(range(len(group))), group, states=True, taps=taps)  # [n, P, d·(taps + 1)]
        for b, k in enumerate(order[i:j]):
            out[k] = f[b, : len(seqs[k])].clone()
        i = j
    return [o for o in out if o is not None]
