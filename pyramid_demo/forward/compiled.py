"""A compiled forward over a static cache, in gpt-fast's shape: positions, cache slots and a mask passed into
every call, a preallocated KV cache where rollback moves a length, one graph per padded pass length.

Why: on a CPU the eager forwards of a small model run well above the time it takes to read its weights
(many small kernels, Python between them); inductor fuses the pointwise work and, with freezing, prepacks
the weights for oneDNN. Rows of a pass are padded up to a bucket (`K_BUCKETS`) so that a handful of graphs
serve every pass; padded rows write scratch slots past the cache's end, which no real row's mask reads.
A k-row pass is not bitwise k one-token steps here (one attention call over the whole cache, GEMMs that
depend on the row count): the probe measures agreement, and "lossless" means the target's distribution.
Compile is paid once, off the race's clock (`warm`), and cached on disk by inductor (`cache_dir`).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .cache import LONGEST_PASS, CachedModel
from .lean import rms_norm
from .lean_weights import LeanWeights, lean_weights

K_BUCKETS = (1, 2, 4, 8, 17)  # pass lengths a graph is compiled for; a pass pads up to the next (longer: eager)
T_BUCKETS = (512, 1024, 2048, 4096)  # cache capacities (keys a row attends over, masked)
_COMPILED_ATTR = "_pyramid_compiled"
_LOCK = threading.Lock()


def k_bucket(k: int) -> int:
    """The padded length of a k-row pass (a prefill longer than every bucket runs eagerly)."""
    return next((b for b in K_BUCKETS if b >= k), k)  # past the last bucket: unpadded, eager


def capacity_for(n: int) -> int:
    """The static cache capacity for a run whose sequence may reach n positions (plus a pass's scratch)."""
    need = n + LONGEST_PASS
    return next((t for t in T_BUCKETS if t >= need), -(-need // 1024) * 1024)


def cache_dir() -> Path:
    """Where inductor keeps compiled code: beside the project's other per-machine caches."""
    root = Path(os.environ.get("PYRAMID_DEMO_CACHE", Path.home() / ".cache" / "pyramid_demo"))
    return root / "inductor"


def use_disk_cache() -> None:
    """Point inductor's caches at `cache_dir` (FX graph and autograd caches on), once, before any compile."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))
    import torch._inductor.config as ic

    ic.fx_graph_cache = True
    ic.freezing = True  # weights become constants: prepacked for oneDNN, folded into the graph
    ic.cpp_wrapper = True  # the C++ wrapper: no Python between kernels


def static_pass(w: LeanWeights, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tokens: torch.Tensor,
                positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One pass: tokens [k] at `positions` [k] (RoPE) written to cache `slots` [k] of kv [L, 2, H_kv, T, D];
    each row attends over all T slots through mask [k, T] (additive). Logits [k, V] of every row."""
    k_rows = tokens.shape[0]
    h_q, h_kv, d_h = w.n_heads, w.n_kv, w.head_dim
    c, s = cos[positions][:, None], sin[positions][:, None]  # [k, 1, D]
    half = d_h // 2
    am = mask[None, None]  # [1, 1, k, T]
    x = F.embedding(tokens, w.embed)  # [k, d]
    for li, lay in enumerate(w.layers):
        qkv = lay.qkv(rms_norm(x, lay.attn_norm, w.eps))  # [k, (H + 2·H_kv)·D]
        qk = qkv[:, : (h_q + h_kv) * d_h].view(k_rows, h_q + h_kv, d_h)
        qk = qk * c + torch.cat((qk[..., half:], qk[..., :half]), -1) * s  # RoPE on q and k at once
        v = qkv[:, (h_q + h_kv) * d_h:].view(k_rows, h_kv, d_h)
        kv[li, 0, :, slots] = qk[:, h_q:].transpose(0, 1)  # [H_kv, k, D]
        kv[li, 1, :, slots] = v.transpose(0, 1)
        q = qk[:, :h_q].transpose(0, 1)[None]  # [1, H, k, D]
        a = F.scaled_dot_product_attention(q, kv[li, 0][None], kv[li, 1][None], attn_mask=am,
                                           scale=d_h ** -0.5, enable_gqa=True)  # [1, H, k, D]
        x = x + lay.o(a[0].transpose(0, 1).reshape(k_rows, h_q * d_h))  # [k, d]
        gate, up = lay.gate_up(rms_norm(x, lay.mlp_norm, w.eps)).chunk(2, -1)
        x = x + lay.down(F.silu(gate) * up)
    return w.head(rms_norm(x, w.norm, w.eps)).float()  # [k, V]


class Graphs:
    """One model's compiled passes, one per (padded rows, capacity), shared by every run over that model.
    A failed compile is remembered and the eager pass serves instead (said once, in `note`)."""

    def __init__(self, w: LeanWeights) -> None:
        self.w = w
        self.fns: dict[tuple[int, int], Callable] = {}
        self.note = ""
        self.failed = False

    def get(self, k: int, t: int) -> Callable:
        fn = self.fns.get((k, t))
        if fn is not None:
            return fn
        with _LOCK:
            if self.failed:
                return self._eager
            use_disk_cache()
            w = self.w

            def run(kv, cos, sin, tokens, positions, slots, mask):
                return static_pass(w, kv, cos, sin, tokens, positions, slots, mask)

            fn = self.fns[(k, t)] = torch.compile(run, dynamic=False, fullgraph=True)
            return fn

    def _eager(self, kv, cos, sin, tokens, positions, slots, mask):
        return static_pass(self.w, kv, cos, sin, tokens, positions, slots, mask)


def graphs_of(model: Any) -> Graphs:
    """The model's compiled passes (built over its lean weights on first use; rebuilt when those are)."""
    w = lean_weights(model)
    g = getattr(model, _COMPILED_ATTR, None)
    if g is None or g.w is not w:
        g = Graphs(w)
        setattr(model, _COMPILED_ATTR, g)
    return g


class CompiledLM(CachedModel):
    """One model's per-run state over the compiled forward: a static cache of `capacity` slots (grown to the next
    bucket if a run outgrows it, which costs a compile there), the engine's `LM` protocol. Trees are rows with
    their own positions and a mask over the cache, their ancestors and themselves."""

    trees = True

    def __init__(self, model: Any, vocab_size: int, role: str, capacity: int = T_BUCKETS[0]) -> None:
        super().__init__(role)
        self.model, self.vocab_size = model, vocab_size
        self.graphs = graphs_of(model)
        w = self.graphs.w
        self.kv = torch.zeros(len(w.layers), 2, w.n_kv, capacity, w.head_dim, dtype=w.dtype)  # [L, 2, H_kv, T, D]
        freqs = torch.arange(capacity, dtype=torch.float32)[:, None] * w.inv_freq[None]  # [T, D/2]
        emb = torch.cat((freqs, freqs), -1)
        self.cos = (emb.cos() * w.rope_scale).to(w.dtype)  # [T, D]
        sin = (emb.sin() * w.rope_scale).to(w.dtype)
        half = w.head_dim // 2
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), -1)  # rotate_half's sign folded in
        self.key = torch.arange(capacity)  # [T]

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        old, n = self, len(self.ids) + len(self.pending)
        kv, cos, sin = old.kv, old.cos, old.sin
        self.__init__(self.model, self.vocab_size, self.role, capacity_for(need))  # type: ignore[misc]
        self.kv[:, :, :, :n] = kv[:, :, :, :n]
        del cos, sin

    def _pass(self, tokens: list[int], positions: list[int], slots: list[int], seen: torch.Tensor) -> torch.Tensor:
        """Rows padded to their bucket; seen [k, T] bool: which slots each real row attends to."""
        k = len(tokens)
        kb = k_bucket(k)
        self._grow(max(slots) + 1 + (kb - k))
        t = self.capacity
        if kb != k:  # padding rows: token 0 written to the scratch slots after the last real one, seeing slot 0
            last = max(slots)
            tokens = tokens + [0] * (kb - k)
            positions = positions + [0] * (kb - k)
            slots = slots + list(range(last + 1, last + 1 + kb - k))
            pad = torch.zeros(kb - k, t, dtype=torch.bool)
            pad[:, 0] = True
            seen = torch.cat([seen, pad])
        mask = torch.zeros(kb, t, dtype=self.graphs.w.dtype).masked_fill_(~seen, float("-inf"))
        fn = self.graphs.get(kb, t) if kb <= K_BUCKETS[-1] else self.graphs._eager
        z = fn(self.kv, self.cos, self.sin, torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots),
               mask)
        return z[:k, : self.vocab_size]  # [k, V]

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        n = len(tokens)
        self._grow(pos + n + LONGEST_PASS)
        at = list(range(pos, pos + n))
        seen = self.key[None, :] <= torch.tensor(at)[:, None]  # [n, T] causal
        return self._pass(tokens, at, at, seen)[n - keep:].clone()

    def _crop(self, pos: int) -> None:
        """A length move: later feeds overwrite the slots."""

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        self.kv[:, :, :, pos: pos + len(slots)] = self.kv[:, :, :, slots]

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        new = rows[base:]
        n = len(new)
        self._grow(pos + len(rows) + LONGEST_PASS)
        seen = torch.zeros(n, self.capacity, dtype=torch.bool)
        seen[:, :pos] = True
        for i in range(n):
            j = base + i
            while j >= 0:
                seen[i, pos + j] = True
                j = rows[j][1]
        slots = list(range(pos + base, pos + base + n))
        return self._pass([r[0] for r in new], [r[2] for r in new], slots, seen).clone()


def warm(model: Any, ks: tuple[int, ...] = K_BUCKETS, capacity: int = T_BUCKETS[0]) -> float:
    """Compile (or load from inductor's disk cache) the passes a run will take; seconds spent."""
    import time

    t0 = time.perf_counter()
    lm = CompiledLM(model, 1, "warm", capacity)
    with torch.inference_mode():
        for k in ks:
            lm._pass([0] * k, list(range(k)), list(range(k)), torch.ones(k, capacity, dtype=torch.bool))
    return time.perf_counter() - t0
