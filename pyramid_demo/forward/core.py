"""The one forward of Llama-family models (SmolLM2, Qwen2, Llama 3.x, Mistral), in gpt-fast's shape: a static KV
cache where rollback moves a length, and every row carries its token, its position and its cache slot, and sees the
slots its mask names (the cache, its ancestors, itself): a prefill, a chain and a tree of candidates are one pass.
Eager on any device; on a CPU compiled (`forward.compiled`) where a package agrees with it (`models.runtime`).
Whether a many-row pass gives the logits of one-row steps is measured (`models.checks`), never assumed."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .cache import FEW_ROWS, LONGEST_PASS, LONGEST_PREFILL, CachedModel, grown, tap_layers, tap_norm, tree_seen
from .weights import Layer, Weights

MIN_CAPACITY = 256  # cache slots a run starts with; doubled when outgrown


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama RMSNorm: normalise in fp32, cast back (`tap_norm`), then scale. x [n, d] -> [n, d]."""
    return w * tap_norm(x, eps)


def rope_table(
    inv_freq: torch.Tensor, n: int, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, D] for positions 0 … n-1 as HF computes them, with rotate_half's sign folded into sin (so a
    rotation is `x·cos + swap_halves(x)·sin`); the one rotary table of every forward and the feature draft."""
    freqs = torch.arange(n, dtype=torch.float32, device=inv_freq.device)[:, None] * inv_freq[None]  # [n, D/2]
    emb = torch.cat((freqs, freqs), -1)  # [n, D]
    cos, sin = (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
    half = inv_freq.shape[0]
    return cos, torch.cat((-sin[:, :half], sin[:, half:]), -1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [.., D] rotated by cos/sin [.., D] from `rope_table` (broadcast over heads)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin


def project(
    lay: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, w: Weights
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's attention inputs: rows x [.., k, d] at RoPE rows cos/sin [k, 1, D] -> q [.., H, k, D], keys and
    values [.., H_kv, k, D] (q and k rotated). Every forward's layers start here, whatever cache they attend over."""
    h_q, h_kv, d_h = w.n_heads, w.n_kv, w.head_dim
    qkv = lay.qkv(rms_norm(x, lay.attn_norm, w.eps))  # [.., k, (H + 2·H_kv)·D]
    split = (h_q + h_kv) * d_h
    qk = rotate(qkv[..., :split].unflatten(-1, (h_q + h_kv, d_h)), cos, sin)  # RoPE on q and k at once
    v = qkv[..., split:].unflatten(-1, (h_kv, d_h))  # [.., k, H_kv, D]
    return qk[..., :h_q, :].transpose(-3, -2), qk[..., h_q:, :].transpose(-3, -2), v.transpose(-3, -2)


def finish(lay: Layer, x: torch.Tensor, a: torch.Tensor, eps: float) -> torch.Tensor:
    """A layer's rest: rows x [.., k, d] plus the attention's output a [.., H, k, D] through o, then the MLP."""
    x = x + lay.o(a.transpose(-3, -2).flatten(-2))  # [.., k, d]
    gate, up = lay.gate_up(rms_norm(x, lay.mlp_norm, eps)).chunk(2, -1)  # [.., k, I] each
    return x + lay.down(F.silu(gate) * up)


def stack(
    w: Weights,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor | None,
    kv: list[torch.Tensor],
    taps: tuple[int, ...] = (),
) -> torch.Tensor:
    """Input rows x [k, d] at RoPE rows cos/sin [k, D] through every layer of `w`: each writes its keys/values to
    `slots` [k] of kv (per layer: keys, values [H_kv, T, D]) and attends over the first t slots where mask [k, t]
    (bool; None: all T of them), so a pass reads the slots in use, not the cache's size. Returns the `taps` layers'
    outputs normalised, then the normed last state [k, (len(taps) + 1)·d]. A model's pass (`body`) and the feature
    draft's one layer over its verifier's states run here."""
    t = kv[0].shape[1] if mask is None else mask.shape[1]  # the slots this pass reads
    torch._check(t <= kv[0].shape[1])
    c, s = cos[:, None], sin[:, None]  # [k, 1, D]
    am = None if mask is None else mask[None, None]  # [1, 1, k, t]
    tapped = []
    for li, lay in enumerate(w.layers):
        q, k, v = project(lay, x, c, s, w)  # [H, k, D], [H_kv, k, D] ×2
        k_all, v_all = kv[2 * li], kv[2 * li + 1]  # [H_kv, T, D]
        k_all.index_copy_(1, slots, k)
        v_all.index_copy_(1, slots, v)
        a = F.scaled_dot_product_attention(
            q[None],
            k_all[None, :, :t],
            v_all[None, :, :t],
            attn_mask=am,
            scale=w.head_dim**-0.5,
            enable_gqa=w.n_heads != w.n_kv,
        )  # [1, H, k, D]
        x = finish(lay, x, a[0], w.eps)
        if li in taps:
            tapped.append(tap_norm(x, w.eps))
    return torch.cat([*tapped, rms_norm(x, w.norm, w.eps)], -1)


def body(
    w: Weights,
    tokens: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor | None,
    kv: list[torch.Tensor],
) -> torch.Tensor:
    """A model's pass over rows tokens [k] (`stack` over their embeddings): what a reader of this model conditions
    on, the `tap_layers` outputs normalised, then the normed last state [k, 3·d]."""
    return stack(w, F.embedding(tokens, w.embed), cos, sin, slots, mask, kv, tap_layers(len(w.layers)))


def core_pass(
    w: Weights,
    tokens: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor | None,
    kv: list[torch.Tensor],
    kept: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`body`, then the head on the rows `kept` [n] alone (a prefill asks for its last row's logits, and the head is
    the largest GEMM of a small model): logits [n, V] fp32 and the states [k, 3·d] (what a package compiles)."""
    h = body(w, tokens, cos, sin, slots, mask, kv)
    return w.head(h[kept, -w.embed.shape[1] :]).float(), h


def visible(
    slots: list[int],
    positions: list[int],
    t: int,
    window: int | None,
    seen: torch.Tensor | None = None,
    cached: int | None = None,
) -> torch.Tensor | None:
    """Which of the first t slots each row sees [k, t] bool: `seen` (a tree's rows: the cache, their ancestors,
    themselves), else every slot up to its own (a chain). A sliding window hides keys more than `window` positions
    back, among the first `cached` slots, where slot = position (a chain's every slot, a tree's cache). None where
    every row sees every slot (a one-row step: no mask to build or apply)."""
    if seen is None:
        if len(slots) == 1 and slots[0] == t - 1 and (window is None or t <= window):
            return None
        seen = torch.arange(t)[None] <= torch.tensor(slots)[:, None]  # [k, t]
        cached = t
    if window is not None:
        n = t if cached is None else min(t, cached)
        seen[:, :n] &= torch.arange(n)[None] > torch.tensor(positions)[:, None] - window
    return seen


class CoreLM(CachedModel):
    """One run's state over a model's core weights `w` (`weights.weights`; the engine's `LM`): its own static cache;
    `runner` the compiled packages of these weights (`compiled.Runner`; None: eager)."""

    trees = True

    def __init__(
        self, w: Weights, vocab_size: int, role: str, runner: Any | None = None, capacity: int = MIN_CAPACITY
    ) -> None:
        super().__init__(role)
        self.w, self.vocab_size, self.run = w, vocab_size, runner
        self.device = w.embed.device
        cap = max(capacity, LONGEST_PASS + 1)
        self.kv = [  # keys, values [H_kv, T, D] per layer
            torch.zeros(w.n_kv, cap, w.head_dim, dtype=w.dtype, device=self.device) for _ in range(2 * len(w.layers))
        ]
        self._table()

    @property
    def capacity(self) -> int:
        return self.kv[0].shape[1]

    def _table(self) -> None:
        w = self.w
        self.cos, self.sin = rope_table(w.inv_freq.to(self.device), self.capacity, w.dtype, w.rope_scale)  # [T, D]

    def _grow(self, need: int) -> None:
        """The cache's one growth (`cache.grown`): every written slot kept, pending tree rows included."""
        if need > self.capacity:
            self.kv = [grown(c, 1, need) for c in self.kv]
            self._table()

    def _pass(
        self,
        tokens: list[int],
        positions: list[int],
        slots: list[int],
        seen: torch.Tensor | None,
        keep: int,
        cached: int | None = None,
    ) -> torch.Tensor:
        """Rows (token, position, slot) seeing the slots `seen` [k, t] names (None: a chain's causal rows); logits
        of the last `keep` rows [keep, V] fp32 on the CPU, and the states of every row when this model publishes."""
        t = max(slots) + 1  # the slots this pass reads
        self._grow(t)
        mask = visible(slots, positions, t, self.w.window, seen, cached)  # [k, t] bool; None: every row sees all
        dev, d = self.device, self.w.embed.shape[1]
        tok, sl = torch.tensor(tokens, device=dev), torch.tensor(slots, device=dev)
        at = torch.tensor(positions, device=dev)
        kept = torch.arange(len(tokens) - keep, len(tokens), device=dev)  # [keep] the rows whose logits are asked
        cos, sin = self.cos[at], self.sin[at]  # [k, D]
        if self.run is not None:  # the package takes the whole cache and a mask over the slots it reads
            mask = torch.ones(len(tokens), t, dtype=torch.bool) if mask is None else mask  # [k, t]
            few = self.run.few is not None and len(tokens) <= FEW_ROWS  # `compiled.Runner`: by row count
            if self.run.head is None:
                z, h = (self.run.few if few else self.run.many)(tok, cos, sin, sl, mask, self.kv, kept)
            else:  # the package returns the states; the head's own kernel runs on the rows kept
                h = self.run.many(tok, cos, sin, sl, mask, self.kv)[0]
                z = self.run.head(h[kept, -d:])  # a gather: contiguous, as fbgemm needs
        else:
            mask = None if mask is None else mask.to(dev)
            z, h = core_pass(self.w, tok, cos, sin, sl, mask, [c[:, :t] for c in self.kv], kept)
        if self.publish is not None:
            self.feats = h if self.publish.taps else h[:, -d:]  # [k, d·(taps + 1)]
        return z[:, : self.vocab_size].float().cpu()

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        """A chain's rows at their positions, in one pass up to LONGEST_PREFILL rows (the weights read once); each
        part asks for the logits of its rows among the last `keep`, at least one (dropped where it is not)."""
        zs, feats, first_kept = [], [], len(tokens) - keep
        for i in range(0, len(tokens), LONGEST_PREFILL):
            at = list(range(pos + i, pos + min(len(tokens), i + LONGEST_PREFILL)))
            zs.append(self._pass(tokens[i : i + len(at)], at, at, None, max(1, i + len(at) - max(i, first_kept))))
            feats.append(self.feats)
        if self.publish is not None and len(feats) > 1:
            self.feats = torch.cat(feats)  # type: ignore[arg-type]
        return (zs[0] if len(zs) == 1 else torch.cat(zs))[-keep:]

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        new = rows[base:]
        slots = list(range(pos + base, pos + len(rows)))
        return self._pass([r[0] for r in new], [r[2] for r in new], slots, tree_seen(rows, base, pos), len(new), pos)

    def same_cache(self, other: Any) -> bool:
        """Whether `other` is a core forward whose cache has this one's shapes (layers, heads, head size, rotary
        table): its keys and values could stand in for this model's own."""
        a, b = self.w, getattr(other, "w", None)
        return (
            isinstance(other, CoreLM)
            and (len(a.layers), a.n_kv, a.head_dim, a.window, a.rope_scale)
            == (len(b.layers), b.n_kv, b.head_dim, b.window, b.rope_scale)
            and torch.equal(a.inv_freq.cpu(), b.inv_freq.cpu())
        )

    @torch.inference_mode()
    def adopt(self, other: CoreLM) -> None:
        """Take `other`'s cached keys and values (and tokens) as this model's own, in place of feeding them: one
        prefill for two models of the same shapes (`engine.prefill`). Its states are not this model's to publish."""
        if not self.same_cache(other) or self.ids:
            raise ValueError(f"{self.role}: cannot adopt the cache of {other.role}")
        n = len(other.ids)
        self._grow(n)
        for mine, theirs in zip(self.kv, other.kv):
            mine[:, :n] = theirs[:, :n]  # [H_kv, n, D], cast to this model's dtype
        self.ids = list(other.ids)

    def _crop(self, pos: int) -> None:
        """A length move: later feeds overwrite the slots."""

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        idx = torch.tensor(slots, device=self.device)
        for c in self.kv:
            c[:, pos : pos + len(slots)] = c[:, idx]  # the gather copies first
