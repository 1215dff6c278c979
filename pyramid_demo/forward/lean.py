"""A lean decode forward for Llama-family models on the CPU (gpt-fast style): few kernel calls, fused QKV and
gate/up, RoPE tables, a preallocated KV cache (rollback moves a length), logits for the kept rows only.

Exactness: with batch-invariant linears a k-token pass equals k one-token steps bitwise. Each row is its own batch
item of one SDPA call per layer, over a key length padded to a multiple of KEY_BUCKET fixed by its position alone.
At more than one thread each thread's scratch alignment changes the kernel's rounding, so keys are also padded to
align it (`scratch_pad`); where that cannot hold (over KV_SPLIT keys) each row gets a step's own call (`batched`).
Only a pass longer than ROWWISE_MAX (a prefill, the same for every method) runs one masked call.
Covered: Llama 2/3.x, SmolLM2, Qwen2, Mistral (`lean_weights.supports_lean`); anything else runs HF's forward.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .backend import backend_flags
from .cache import LONGEST_PASS, CachedModel, tap_norm
from .lean_weights import lean_weights

ROWWISE_MAX = LONGEST_PASS  # passes up to the longest verification: padded per-row attention (a long prefill: not)
KEY_BUCKET = 64  # a query at position p attends over a multiple of 64 keys counted from p + 1 + TREE_SLACK:
# a tree row's scratch slots then lie inside the keys a step at its position reads (the step's shapes exactly)
TREE_SLACK = LONGEST_PASS - 1
KV_SPLIT = 512  # torch's CPU flash attention takes keys in blocks of at most 512 (its kv_split_size)
SCRATCH_ALIGN = 16  # fp32 elements in 64 bytes: the alignment each thread's scratch needs (`scratch_pad`)
ATTENTIONS = ("auto", "rows")  # `set_attention`: batched where invariant (auto), or one call per row always
_ATTENTION_ATTR = "_pyramid_lean_attention"


def bucket(p: int) -> int:
    """The multiple of KEY_BUCKET a query at position p attends up to (room for a tree's slots included)."""
    return -(-(p + 1 + TREE_SLACK) // KEY_BUCKET) * KEY_BUCKET


def key_len(p: int, pad: int = 0) -> int:
    """The padded key length of a query at position p: fixed by the position alone, whatever the pass."""
    return bucket(p) + pad


def scratch_pad(q_rows: int, head_dim: int) -> int:
    """Extra keys that make torch's CPU flash attention scratch 64-byte aligned in every thread: each thread
    holds q_rows·(t + 2 + head_dim) fp32 values, one after another, so with that a multiple of SCRATCH_ALIGN
    a row's result no longer depends on which thread computed it. q_rows: the GQA group (at most 32)."""
    q = min(q_rows, 32)
    return next(d for d in range(SCRATCH_ALIGN) if q * (KEY_BUCKET + d + 2 + head_dim) % SCRATCH_ALIGN == 0)


def scratch_aligned(t: int, q_rows: int, head_dim: int) -> bool:
    """Whether a batched attention call over t keys computes every (item, head) at one scratch alignment."""
    return t <= KV_SPLIT and min(q_rows, 32) * (t + 2 + head_dim) % SCRATCH_ALIGN == 0


def set_attention(model: torch.nn.Module, kind: str) -> None:
    """How the lean forward attends (the probe's choice): "auto" batches rows where invariant, "rows" never does."""
    if kind not in ATTENTIONS:
        raise ValueError(f"unknown lean attention {kind!r}; choose one of {', '.join(ATTENTIONS)}")
    setattr(model, _ATTENTION_ATTR, kind)


def attention_of(model: Any) -> str:
    """The lean attention set for `model` (`set_attention`; "auto" when none was)."""
    return getattr(model, _ATTENTION_ATTR, "auto")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama RMSNorm: normalise in fp32, cast back (`tap_norm`), then scale. x [n, d] -> [n, d]."""
    return w * tap_norm(x, eps)


class LeanLM(CachedModel):
    """One model's per-run decoding state over the lean forward (the engine's `LM` protocol). Tree rows attend
    over a copy of the cache with their ancestors moved to the slots a step along their path would read."""

    trees = True  # its forward takes tree rows (`_run_tree`)

    def __init__(self, model: Any, vocab_size: int, role: str, backend: str = "default", capacity: int = 256):
        super().__init__(role)
        self.w = lean_weights(model)
        self.model, self.vocab_size, self.backend = model, vocab_size, backend
        self._plans: dict[tuple[int, int], list] = {}  # (pos, n) -> padded attention's key plan
        w = self.w
        self.attention = attention_of(model)  # "auto" | "rows" (`set_attention`)
        self.key_pad = scratch_pad(w.n_heads // w.n_kv, w.head_dim)  # keys past the bucket: aligned scratch
        self.kv = torch.zeros(len(w.layers), 2, w.n_kv, capacity, w.head_dim, dtype=w.dtype)  # [L, 2, H_kv, T, D]
        self._rope(capacity)

    # ------------------------------------------------------------------ state
    def _rope(self, capacity: int) -> None:
        """cos/sin tables for positions < capacity, as HF computes them, in the model's dtype."""
        w = self.w
        freqs = torch.arange(capacity, dtype=torch.float32)[:, None] * w.inv_freq[None]  # [T, D/2]
        emb = torch.cat((freqs, freqs), -1)  # [T, D]
        self.cos = (emb.cos() * w.rope_scale).to(w.dtype)  # [T, D]
        sin = (emb.sin() * w.rope_scale).to(w.dtype)
        half = w.head_dim // 2
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), -1)  # [T, D]: rotate_half's sign folded in

    def _grow(self, need: int) -> None:
        cap = self.kv.shape[3]
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        kv = self.kv.new_zeros(*self.kv.shape[:3], cap, self.kv.shape[4])
        kv[:, :, :, : self.kv.shape[3]] = self.kv  # every slot: pending tree rows past the cache's end too
        self.kv = kv
        self._rope(cap)

    def _crop(self, pos: int) -> None:
        """A length move: the preallocated cache keeps its rows, later feeds overwrite them."""

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        self.kv[:, :, :, pos: pos + len(slots)] = self.kv[:, :, :, slots]  # the RHS gather copies first

    def _gathered(self, k_all: torch.Tensor, v_all: torch.Tensor, m: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """m copies of the cache's first t keys and values [m, H_kv, t, D], laid out with the cache's own strides
        (a row every D, a head every T slots): a step's SDPA call reads its keys with those strides, and the
        kernel's arithmetic may depend on them (a contiguous copy was not bitwise equal on an AMD EPYC)."""
        cap = k_all.shape[1]
        buf = getattr(self, "_gbuf", None)
        if buf is None or buf.shape[1] < m or buf.shape[3] != cap:
            buf = self._gbuf = k_all.new_empty(2, max(m, 17), *k_all.shape)  # [2, m, H_kv, T, D]
        k, v = buf[0, :m, :, :t], buf[1, :m, :, :t]
        k.copy_(k_all[None, :, :t].expand(m, -1, -1, -1))
        v.copy_(v_all[None, :, :t].expand(m, -1, -1, -1))
        return k, v

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        new = rows[base:]
        self._grow(key_len(pos + len(rows), self.key_pad))
        anc = []  # per new row: its ancestors' row indices, root first, itself last
        for j in range(base, len(rows)):
            a, k = [], j
            while k >= 0:
                a.append(k)
                k = rows[k][1]
            anc.append(a[::-1])
        plan = self._tree_plan([r[2] for r in new], anc, rows, pos, base)
        with backend_flags(self.backend):
            return self._forward(torch.tensor([r[0] for r in new], dtype=torch.long), pos + base, len(new),
                                 plan, torch.tensor([r[2] for r in new]))

    def _tree_plan(self, positions: list[int], anc: list[list[int]], rows: list[tuple[int, int, int]],
                   pos: int, base: int) -> list[tuple]:
        """Tree rows grouped by key length: (first row, end row, t, mask [m, 1, 1, t], gather (batch, destination,
        source) slots that lay each row's ancestors out as a step along its path finds them)."""
        w, plan, i, n = self.w, [], 0, len(positions)
        while i < n:
            t = key_len(positions[i], self.key_pad)
            j = i + 1
            while j < n and key_len(positions[j], self.key_pad) == t:
                j += 1
            key = torch.arange(t)[None]  # [1, t]
            q_pos = torch.tensor(positions[i:j])[:, None]  # [m, 1]
            seen = key <= q_pos  # [m, t]: a step's own mask
            if w.window is not None:
                seen &= key > q_pos - w.window
            b, dst, src = [], [], []
            for r in range(i, j):
                for a in anc[r]:
                    b.append(r - i)
                    dst.append(rows[a][2])
                    src.append(pos + a)
            gather = (torch.tensor(b), torch.tensor(dst), torch.tensor(src))
            mask = torch.zeros(j - i, 1, 1, t, dtype=w.dtype).masked_fill_(~seen[:, None, None], float("-inf"))
            plan.append((i, j, t, mask, gather))
            i = j
        return plan

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        self._grow(pos + len(tokens))
        with backend_flags(self.backend):
            return self._forward(torch.tensor(tokens, dtype=torch.long), pos, keep)

    def _key_plan(self, pos: int, n: int) -> list[tuple[int, int, int, torch.Tensor]]:
        """Rows pos … pos+n-1 grouped by padded key length: (first row, end row, t, mask [rows, 1, 1, t]), each
        row's t and mask fixed by its position alone, never by the pass it is in."""
        w, plan, i = self.w, [], 0
        while i < n:
            edge = bucket(pos + i)
            t = edge + self.key_pad
            j = min(n, edge - TREE_SLACK - pos)  # rows whose position p < edge − TREE_SLACK share this length
            key = torch.arange(t)[None]  # [1, t]
            q_pos = torch.arange(pos + i, pos + j)[:, None]  # [m, 1]
            seen = key <= q_pos  # [m, t]
            if w.window is not None:
                seen &= key > q_pos - w.window
            mask = torch.zeros(j - i, 1, 1, t, dtype=w.dtype).masked_fill_(~seen[:, None, None], float("-inf"))
            plan.append((i, j, t, mask))
            i = j
        return plan

    def batched(self, t: int) -> bool:
        """Whether a pass's rows over t keys share one attention call: at one thread (one scratch buffer), or where
        every thread's scratch has one alignment (`scratch_aligned`); else each row gets a step's own call."""
        if self.attention == "rows":
            return False
        return torch.get_num_threads() == 1 or scratch_aligned(t, self.w.n_heads // self.w.n_kv, self.w.head_dim)

    def _attend(self, q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, pos: int,
                plan: list[tuple[int, int, int, torch.Tensor]] | None = None) -> torch.Tensor:
        """q [n, H, D] at positions pos … pos+n-1 over k_all/v_all [H_kv, T, D] -> [n, H·D]; heads grouped by KV
        head (no repeated keys). With a `plan` each row is a batch item over its padded keys; without, one call."""
        w = self.w
        n, rep, scale, win = q.shape[0], w.n_heads // w.n_kv, w.head_dim ** -0.5, w.window
        if plan is not None:
            outs = []
            for entry in plan:
                i, j, t, mask = entry[:4]
                gather = entry[4:]  # tree rows: [(batch, destination, source)]; chains: []
                m = j - i
                k, v = (c[None, :, :t].expand(m, -1, -1, -1) for c in (k_all, v_all))  # [m, H_kv, t, D], no copy
                if gather:  # tree rows: each its own keys, ancestors where a step has them
                    b, dst, src = gather[0]
                    k, v = self._gathered(k_all, v_all, m, t)
                    k[b, :, dst], v[b, :, dst] = k_all[:, src].transpose(0, 1), v_all[:, src].transpose(0, 1)
                qg = q[i:j].view(m, w.n_kv, rep, w.head_dim)  # [m, H_kv, rep, D]
                if m == 1 or self.batched(t):
                    outs.append(F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale))
                else:  # each row a step's call: a batch of one over its own keys and mask
                    outs += [F.scaled_dot_product_attention(qg[r: r + 1], k[r: r + 1], v[r: r + 1],
                                                            attn_mask=mask[r: r + 1], scale=scale) for r in range(m)]
            return (outs[0] if len(outs) == 1 else torch.cat(outs)).view(n, -1)  # [n, H·D]
        end = pos + n
        qg = q.view(n, w.n_kv, rep, w.head_dim).transpose(0, 1).reshape(1, w.n_kv, n * rep, w.head_dim)
        key_pos = torch.arange(end)  # [end]
        q_pos = torch.arange(pos, end).repeat_interleave(rep)  # [n·rep]
        mask = key_pos[None] <= q_pos[:, None]  # [n·rep, end]
        if win is not None:
            mask &= key_pos[None] > q_pos[:, None] - win
        out = F.scaled_dot_product_attention(qg, k_all[None, :, :end], v_all[None, :, :end], attn_mask=mask,
                                             scale=scale)  # [1, H_kv, n·rep, D]
        return out.view(w.n_kv, n, rep, w.head_dim).transpose(0, 1).reshape(n, -1)  # [n, H·D]

    @torch.inference_mode()
    def check_attention(self, pos: int, k: int, seed: int = 0) -> dict[str, Any]:
        """This forward's attention alone, bitwise: a k-row pass at pos … pos+k-1 against k steps, random queries,
        keys and values in this LM's layer-0 cache (overwritten: a scratch LM); a record as `pass_vs_steps`."""
        w, g = self.w, torch.Generator().manual_seed(seed)
        self._grow(key_len(pos + k, self.key_pad) + 1)
        k_all, v_all = self.kv[0, 0], self.kv[0, 1]  # [H_kv, T, D] each
        k_all.copy_(torch.randn(k_all.shape, generator=g))
        v_all.copy_(torch.randn(v_all.shape, generator=g))
        q = torch.randn(k, w.n_heads, w.head_dim, generator=g).to(w.dtype)  # [k, H, D]
        plans = [self._key_plan(pos, k)] + [self._key_plan(pos + i, 1) for i in range(k)]
        z = self._attend(q, k_all, v_all, pos, plans[0])  # [k, H·D]
        ref = torch.cat([self._attend(q[i: i + 1], k_all, v_all, pos + i, plans[i + 1]) for i in range(k)])
        diff = (z.float() - ref.float()).abs()
        return {"k": k, "context": pos, "bitwise": bool(torch.equal(z, ref)), "top1": bool(torch.equal(
            z.argmax(-1), ref.argmax(-1))), "max_abs_diff": float(diff.max())}

    def _forward(self, tokens: torch.Tensor, pos: int, keep: int, plan: list | None = None,
                 positions: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [n] into slots pos … pos+n-1 -> last `keep` logits [keep, V] fp32 (tree rows: `positions`, `plan`)."""
        w, n = self.w, tokens.shape[0]
        if plan is None and n <= ROWWISE_MAX:
            plan = self._plans.get((pos, n))
            if plan is None:  # a position's masks are the same on every visit: built once per run
                plan = self._plans[(pos, n)] = self._key_plan(pos, n)
            self._grow(plan[-1][2])  # the padded keys must exist (masked, whatever they hold)
        h_q, h_kv, d_h = w.n_heads, w.n_kv, w.head_dim
        at = slice(pos, pos + n) if positions is None else positions
        cos = self.cos[at, None]  # [n, 1, D]
        sin = self.sin[at, None]
        half = d_h // 2
        x = F.embedding(tokens, w.embed)  # [n, d]
        taps, tapped = (self.publish.taps if self.publish is not None else ()), []
        for li, lay in enumerate(w.layers):
            qkv = lay.qkv(rms_norm(x, lay.attn_norm, w.eps))  # [n, (H + 2·H_kv)·D]
            qk = qkv[:, : (h_q + h_kv) * d_h].view(n, h_q + h_kv, d_h)  # [n, H + H_kv, D]
            qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), -1) * sin  # RoPE on q and k at once
            v = qkv[:, (h_q + h_kv) * d_h:].view(n, h_kv, d_h)  # [n, H_kv, D]
            k_all, v_all = self.kv[li, 0], self.kv[li, 1]  # [H_kv, T, D] each
            k_all[:, pos: pos + n] = qk[:, h_q:].transpose(0, 1)
            v_all[:, pos: pos + n] = v.transpose(0, 1)
            x = x + lay.o(self._attend(qk[:, :h_q], k_all, v_all, pos, plan))  # [n, d]
            gate, up = lay.gate_up(rms_norm(x, lay.mlp_norm, w.eps)).chunk(2, -1)  # [n, I] each
            x = x + lay.down(F.silu(gate) * up)
            if li in taps:
                tapped.append(tap_norm(x, w.eps))
        if self.publish is not None:  # a proposer reads the target's normed state at every row
            h = rms_norm(x, w.norm, w.eps)  # [n, d]
            self.feats = torch.cat([*tapped, h], -1)  # [n, d·(taps + 1)]
            h = h[n - keep:]
        else:
            h = rms_norm(x[n - keep:], w.norm, w.eps)  # [keep, d]: the kept rows only
        return w.head(h)[:, : self.vocab_size].float()  # [keep, V] (a reduced head gives -inf outside its subset)
