"""A compiled forward over a static cache, in gpt-fast's shape: positions, cache slots and a mask passed into every
call, a preallocated KV cache where rollback moves a length.

Why: on a CPU the eager forwards of a small model run well above the time it takes to read its weights (many
small kernels, Python between them). Inductor fuses the pointwise work and, with freezing, packs the weights for
oneDNN. Freezing's packed weights cannot go through inductor's on-disk cache, so the pass is compiled ahead of
time (AOTInductor) into one package per model, with the pass length and the cache length dynamic: compiled once
(minutes on two cores, `scripts/setup.sh` does it), loaded in a second by every later process.
A k-row pass is not bitwise k one-token steps here (one attention call over the whole cache, GEMMs that depend on
the row count): the probe measures agreement, and "lossless" means the target's distribution.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .cache import LONGEST_PASS, CachedModel, tap_layers, tap_norm, tree_seen
from .lean import rms_norm
from .lean_weights import LeanWeights, lean_weights

FORMAT = 4  # bump when the pass below changes: older packages are then stale
MIN_CAPACITY = 256  # cache slots a run starts with; doubled when outgrown
_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its loaded package (a copy of the
# model, e.g. the probe's cast candidate, has none: it is another model)
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def static_pass(w: LeanWeights, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, kv: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: tokens [k] with their RoPE rows cos/sin [k, D] written to cache `slots` [k] of kv (per layer:
    keys, values [H_kv, T, D], separate tensors so that a write stays in place); each row attends over all T
    slots through mask [k, T] (additive). Logits [k, V] of every row, and what a proposer that reads this model
    conditions on: the `tap_layers` outputs normalised, then its normed last state [k, 3·d]."""
    k_rows = tokens.shape[0]
    h_q, h_kv, d_h = w.n_heads, w.n_kv, w.head_dim
    c, s = cos[:, None], sin[:, None]  # [k, 1, D]
    half = d_h // 2
    am = mask[None, None]  # [1, 1, k, T]
    x = F.embedding(tokens, w.embed)  # [k, d]
    taps, tapped = tap_layers(len(w.layers)), []
    for li, lay in enumerate(w.layers):
        qkv = lay.qkv(rms_norm(x, lay.attn_norm, w.eps))  # [k, (H + 2·H_kv)·D]
        qk = qkv[:, : (h_q + h_kv) * d_h].view(k_rows, h_q + h_kv, d_h)
        qk = qk * c + torch.cat((qk[..., half:], qk[..., :half]), -1) * s  # RoPE on q and k at once
        v = qkv[:, (h_q + h_kv) * d_h:].view(k_rows, h_kv, d_h)
        k_all, v_all = kv[2 * li], kv[2 * li + 1]  # [H_kv, T, D]
        k_all.index_copy_(1, slots, qk[:, h_q:].transpose(0, 1))  # [H_kv, k, D] into the slots
        v_all.index_copy_(1, slots, v.transpose(0, 1))
        q = qk[:, :h_q].transpose(0, 1)[None]  # [1, H, k, D]
        a = F.scaled_dot_product_attention(q, k_all[None], v_all[None], attn_mask=am, scale=d_h ** -0.5,
                                           enable_gqa=True)  # [1, H, k, D]
        x = x + lay.o(a[0].transpose(0, 1).reshape(k_rows, h_q * d_h))  # [k, d]
        gate, up = lay.gate_up(rms_norm(x, lay.mlp_norm, w.eps)).chunk(2, -1)
        x = x + lay.down(F.silu(gate) * up)
        if li in taps:
            tapped.append(tap_norm(x, w.eps))
    h = rms_norm(x, w.norm, w.eps)  # [k, d]
    return w.head(h).float(), torch.cat([*tapped, h], -1)  # [k, V], [k, 3·d]


class _Pass(torch.nn.Module):
    """The pass as a module for torch.export (the weights ride along as constants)."""

    def __init__(self, w: LeanWeights) -> None:
        super().__init__()
        self.w = w

    def forward(self, tokens, cos, sin, slots, mask, kv):  # type: ignore[no-untyped-def]
        return static_pass(self.w, tokens, cos, sin, slots, mask, kv)


def wanted() -> bool:
    """Whether compiled packages are used at all ($PYRAMID_DEMO_COMPILED=0 keeps every model eager: the tests'
    default, so that a developer's cache does not change what they check)."""
    return os.environ.get("PYRAMID_DEMO_COMPILED", "1") != "0"


def cache_dir() -> Path:
    """Where compiled packages live: beside the project's other per-machine caches."""
    root = os.environ.get("PYRAMID_DEMO_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "pyramid_demo") / "compiled"


def cpu_line(cpuinfo: str, arch: str) -> str:
    """The CPU's instruction-set line ("flags" on x86, "Features" on ARM) and its architecture: two machines
    whose kernels differ never share a package name."""
    line = next((x.split(":", 1)[1].strip() for x in cpuinfo.splitlines()
                 if x.lower().startswith(("flags", "features"))), "")
    return f"{arch}|{line}"


def _weights(model: Any) -> Any:
    """(name, tensor) of every weight a pass reads: parameters, buffers, and fbgemm's packed fp16 weights."""
    yield from model.named_parameters()
    yield from model.named_buffers()
    for name, m in model.named_modules():
        if callable(getattr(m, "unpacked", None)) and getattr(m, "packed", None) is not None:
            w, b = m.unpacked()  # [out, in] fp16 values; a packed fbgemm weight is no tensor to read
            yield f"{name}.fp16", w
            if b is not None:
                yield f"{name}.fp16_bias", b


def fingerprint(model: Any) -> str:
    """What a package was built from: this pass's format, torch's build, the CPU, the model's config, its layers'
    kinds and every weight's bytes (a changed weight, dtype, format or machine gives another name: a stale
    package is never loaded). Bytes are read in place: no copy of a weight is made."""
    from platform import machine

    lean_weights(model)  # its fused layers are part of the model once built: name it as it runs
    h = hashlib.sha256()
    info = Path("/proc/cpuinfo")
    cpu = cpu_line(info.read_text(errors="replace") if info.exists() else "", machine())
    cfg = model.config.to_dict() if hasattr(model, "config") else {}
    kinds = [type(m).__name__ for m in model.modules()]
    h.update(json.dumps([FORMAT, torch.__version__, cpu, cfg, kinds], sort_keys=True, default=str).encode())
    with torch.inference_mode():
        for name, t in _weights(model):
            t = t if t.layout == torch.strided else t.to_dense()
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:20]


def package_path(model: Any) -> Path:
    return cache_dir() / f"{type(model).__name__}-{fingerprint(model)}.pt2"


def _exportable(model: Any) -> list[tuple[Any, str, Any]]:
    """Swap every layer that cannot be exported (oneDNN's packed weights, fbgemm's fp16) for its `exportable()`
    equivalent, in place; returns the swaps, which the caller undoes."""
    swaps = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if hasattr(child, "exportable"):
                swaps.append((parent, name, child))
                setattr(parent, name, child.exportable())
    return swaps


def build(model: Any, path: Path | None = None) -> Path:
    """Compile `model`'s pass into a package (minutes on two cores); returns its path. Written under a temporary
    name and moved into place, so a half-written package is never found."""
    path = path or package_path(model)
    swaps = _exportable(model)
    try:
        return _build(model, path)
    finally:
        for parent, name, child in swaps:
            setattr(parent, name, child)


def _build(model: Any, path: Path) -> Path:
    w = lean_weights(model)
    t, k = 96, 4
    ex = (torch.zeros(k, dtype=torch.long), torch.ones(k, w.head_dim, dtype=w.dtype),
          torch.zeros(k, w.head_dim, dtype=w.dtype), torch.arange(k), torch.zeros(k, t, dtype=w.dtype),
          [torch.zeros(w.n_kv, t, w.head_dim, dtype=w.dtype) for _ in range(2 * len(w.layers))])
    kd, td = torch.export.Dim("k", min=1, max=LONGEST_PASS), torch.export.Dim("t", min=LONGEST_PASS + 1, max=1 << 16)
    dyn = ({0: kd}, {0: kd}, {0: kd}, {0: kd}, {0: kd, 1: td}, [{1: td}] * len(ex[5]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.pt2")
    try:
        with torch.inference_mode(False), torch.no_grad():
            ep = torch.export.export(_Pass(w), ex, dynamic_shapes=dyn, strict=False)
            torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs={"freezing": True})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(model: Any) -> bool:
    """Load `model`'s compiled package if one was built for exactly this model here; False (and a one-line log)
    where none is, or it does not load (then it is removed, to be rebuilt)."""
    if model in _RUNNERS:
        return True
    path = package_path(model)
    if not path.exists():
        return False
    try:
        runner = torch._inductor.aoti_load_package(str(path))
    except Exception as e:  # a corrupt or foreign file: drop it, run eager
        log.warning("compiled forward %s did not load (%s); removed, the eager forward runs", path.name, e)
        path.unlink(missing_ok=True)
        return False
    _RUNNERS[model] = runner
    return True


def ensure(model: Any) -> tuple[bool, str]:
    """Load `model`'s package, building it first where missing; (ready, a one-line note). A failed compile leaves
    the eager forward in place and says so."""
    with _LOCK:
        if load(model):
            return True, "compiled forward"
        t0 = time.perf_counter()
        try:
            build(model)
        except Exception as e:
            return False, f"compile failed ({type(e).__name__}: {str(e)[:120]}); the eager forward runs"
        return load(model), f"compiled in {time.perf_counter() - t0:.0f} s"


def runner_of(model: Any) -> Any | None:
    """The loaded package of `model`, if any (`load`)."""
    return _RUNNERS.get(model)


def attach(model: Any, runner: Any | None) -> None:
    """Run `model` on `runner` (its loaded package), or on its eager forward with None (the package is dropped)."""
    if runner is None:
        _RUNNERS.pop(model, None)
    else:
        _RUNNERS[model] = runner


class CompiledLM(CachedModel):
    """One model's per-run state over its compiled pass (`load` first): its own static cache, the engine's `LM`
    protocol. Trees are rows with their own positions and a mask over the cache, their ancestors and themselves."""

    trees = True

    def __init__(self, model: Any, vocab_size: int, role: str, backend: str = "default",
                 capacity: int = MIN_CAPACITY) -> None:
        super().__init__(role)  # `backend`: open_lm's signature; the package's kernels were chosen when it was built
        runner = runner_of(model)
        if runner is None:
            raise RuntimeError(f"{role}: no compiled forward is loaded for this model")
        self.run, self.vocab_size = runner, vocab_size
        w = self.w = lean_weights(model)
        self.kv = self._cache(capacity)
        self.inv_freq = w.inv_freq

    def _cache(self, capacity: int) -> list[torch.Tensor]:
        w = self.w
        return [torch.zeros(w.n_kv, capacity, w.head_dim, dtype=w.dtype) for _ in range(2 * len(w.layers))]

    @property
    def capacity(self) -> int:
        return self.kv[0].shape[1]

    def _grow(self, need: int) -> None:
        cap = self.capacity
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        n = len(self.ids) + len(self.pending)
        new = self._cache(cap)
        for a, b in zip(new, self.kv):
            a[:, :n] = b[:, :n]
        self.kv = new

    def _rope(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [k, D] at `positions`, as HF computes them (rotate_half's sign folded into sin)."""
        w = self.w
        freqs = torch.tensor(positions, dtype=torch.float32)[:, None] * w.inv_freq[None]  # [k, D/2]
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = (emb.cos() * w.rope_scale).to(w.dtype), (emb.sin() * w.rope_scale).to(w.dtype)
        half = w.head_dim // 2
        return cos, torch.cat((-sin[:, :half], sin[:, half:]), -1)

    def _pass(self, tokens: list[int], positions: list[int], slots: list[int],
              seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """seen [k, T] bool: the slots each row attends to. Logits [k, V] and the states a reader asked for
        [k, d·(taps + 1)] (the final one alone [k, d] when it reads no taps)."""
        mask = torch.zeros(seen.shape, dtype=self.w.dtype).masked_fill_(~seen, float("-inf"))
        cos, sin = self._rope(positions)
        z, h = self.run(torch.tensor(tokens), cos, sin, torch.tensor(slots), mask, self.kv)
        if self.publish is None or not self.publish.taps:
            h = h[:, -self.w.embed.shape[1]:]  # [k, d]
        else:
            assert self.publish.taps == tap_layers(len(self.w.layers)), "a package publishes `tap_layers` only"
        return z[:, : self.vocab_size], h

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        n = len(tokens)
        self._grow(max(pos + n, LONGEST_PASS + 1))
        key = torch.arange(self.capacity)
        zs, hs = [], []
        for i in range(0, n, LONGEST_PASS):  # a prefill longer than a package's passes runs in chunks
            at = list(range(pos + i, pos + min(n, i + LONGEST_PASS)))
            z, h = self._pass(tokens[i: i + len(at)], at, at, key[None, :] <= torch.tensor(at)[:, None])
            zs.append(z)
            hs.append(h)
        if self.publish is not None:
            self.feats = torch.cat(hs)  # [n, d]
        return torch.cat(zs)[n - keep:]

    def _crop(self, pos: int) -> None:
        """A length move: later feeds overwrite the slots."""

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        idx = torch.tensor(slots)
        for c in self.kv:
            c[:, pos: pos + len(slots)] = c[:, idx]  # the gather copies first

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        new = rows[base:]
        n = len(new)
        self._grow(max(pos + len(rows), LONGEST_PASS + 1))
        seen = torch.zeros(n, self.capacity, dtype=torch.bool)
        seen[:, : pos + len(rows)] = tree_seen(rows, base, pos)  # the cache, each row's ancestors and itself
        z, h = self._pass([r[0] for r in new], [r[2] for r in new], list(range(pos + base, pos + base + n)), seen)
        if self.publish is not None:
            self.feats = h  # [n, d]
        return z
