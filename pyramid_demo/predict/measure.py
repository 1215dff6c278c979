"""Measuring a cost profile here: a cached forward of k new tokens per model, and the engine's own work around it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..core import rules
from ..core.methods import DecodeConfig
from ..core.round import decide_round, feed, record
from ..forward.cache import probe_ids
from ..forward.lm import open_lm

MAX_K = 9  # longest forward profiled one k at a time: a proposal of 8 plus the verifier's own token
TREE_K = 17  # also profiled: the pass of a 16-node tree (its root row included)
TREE_ROWS = (1, 2, 3, 4, 5, 7, 9, 13, 17)  # tree forwards profiled: a level of k rows, a pass of nodes + 1
CONTEXT = 100  # tokens already in the cache when a forward is timed


class ForwardTimer:
    """The one timing harness: cached forwards of k new (fixed) tokens after `context`, on the forward a run opens."""

    def __init__(self, model: Any, vocab_size: int, context: int = CONTEXT, runner: Any | None = None):
        self.context = context
        self.ids = probe_ids(context + MAX_K + 64, vocab_size)
        self.lm = open_lm(model, vocab_size, "timer", runner)
        self.lm.feed(self.ids[:context], 1)

    def time(self, k: int) -> float:
        """Seconds for one forward of k new tokens; the cache is cropped back to `context` after."""
        lm, t0 = self.lm, self.lm.time_s
        lm.feed(self.ids[: self.context + k], k)
        t = lm.time_s - t0
        lm.rollback(self.ids[: self.context + 1])  # keeps `context` tokens
        return t

    def time_tree(self, n: int) -> float | None:
        """Seconds for one tree forward of n rows after the context (a root and n − 1 children); None without trees."""
        lm = self.lm
        if not getattr(lm, "trees", False):
            return None
        pos, t0 = lm.cache_len, lm.time_s
        lm.forward(self.ids[pos : pos + n], pos, parents=[-1] + [0] * (n - 1))
        t = lm.time_s - t0
        lm.keep_path([])
        lm.rollback(self.ids[: self.context + 1])
        return t

    def time_feed(self) -> tuple[float, float]:
        """Seconds of a one-token feed's engine path beyond the forward, and to cut the cache back (to `context`)."""
        lm, seq = self.lm, self.ids[: self.context + 1]
        t0, m0 = time.perf_counter(), lm.time_s
        int(feed(lm, seq, 1)[0].argmax())  # the greedy pick
        extra = time.perf_counter() - t0 - (lm.time_s - m0)
        t1 = time.perf_counter()
        lm.truncate(self.context)
        return max(0.0, extra), time.perf_counter() - t1

    def time_keep(self, n: int = 2) -> float | None:
        """Seconds to compact a tree's accepted path into the cache (`keep_path`); None where it takes no trees."""
        lm = self.lm
        if not getattr(lm, "trees", False):
            return None
        pos = lm.cache_len
        lm.forward(self.ids[pos : pos + n], pos, parents=[-1] * n)
        t0 = time.perf_counter()
        lm.keep_path([n - 1])  # a root not first: its keys and values move (a chain's first row would not)
        t = time.perf_counter() - t0
        lm.rollback(self.ids[: self.context + 1])
        return t


def measure_profile(
    models: dict[str, Any],
    vocab_size: int,
    max_k: int = MAX_K,
    reps: int = 3,
    extras_out: dict | None = None,
    runners: dict[str, Any] | None = None,
) -> dict[str, dict[int, float]]:
    """{role: {k: ms}} per distinct model, k = 1 … max_k, the min over interleaved rounds; `extras_out` receives
    "tree_ms" ({role: {n: ms}}) and "engine_ms"; `runners`: each role's compiled packages (its family's plan)."""
    timers: dict[int, Any] = {}
    for role, model in models.items():
        if id(model) not in timers:  # on the forward the runs will use
            timers[id(model)] = ForwardTimer(model, vocab_size, runner=(runners or {}).get(role))
    best: dict[int, dict[int, float]] = {i: {} for i in timers}
    for _ in range(reps + 1):
        for i, timer in timers.items():
            for k in (*range(1, max_k + 1), *((TREE_K,) if max_k >= MAX_K else ())):  # a full profile: trees too
                best[i][k] = min(best[i].get(k, float("inf")), timer.time(k))
    if extras_out is not None:
        trees: dict[int, dict[int, float]] = {i: {} for i in timers}
        for _ in range(reps + 1):
            for i, timer in timers.items():
                for n in TREE_ROWS:
                    t = getattr(timer, "time_tree", lambda n: None)(n)
                    if t is not None:
                        trees[i][n] = min(trees[i].get(n, float("inf")), t)
        extras_out["tree_ms"] = {
            role: {str(n): round(1000 * v, 4) for n, v in trees[id(m)].items()}
            for role, m in models.items()
            if trees[id(m)]
        }
        extras_out["engine_ms"] = measure_engine(vocab_size, {role: timers[id(m)] for role, m in models.items()})
    return {role: {k: round(1000 * v, 4) for k, v in best[id(m)].items()} for role, m in models.items()}


def _best_ms(f: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return round(1000 * best, 5)


def measure_engine(vocab_size: int, timers: dict[str, Any], reps: int = 20) -> dict[str, Any]:
    """The engine's own work per unit in ms (`costs.UNITS`, "keep" per role): real functions, this vocabulary."""
    g = torch.Generator().manual_seed(0)
    z_p = torch.randn(5, vocab_size, generator=g)  # [5, V]: a verifier's rows for 4 proposals
    z_q = torch.randn(4, vocab_size, generator=g)  # [4, V]
    z_q[:, torch.randperm(vocab_size, generator=g)[: vocab_size * 5 // 6]] = float("-inf")  # a reduced head
    x = [int(t) for t in z_q.argmax(-1)]
    cfg = DecodeConfig(method="sd", div_support="subset")

    def feed() -> None:
        z = z_p[:1]
        bool(torch.isfinite(z.amax(-1)).all())
        int(z[0].argmax())

    def one_round() -> None:
        record(decide_round(z_p, rules.chain(x, z_q), "sd", None, cfg, None, "draft", "target"), cfg, False)

    def expand() -> None:
        z = z_p[0].float()
        torch.topk(z, 4)
        torch.logsumexp(z, -1)

    out: dict[str, Any] = {
        "feed": _best_ms(feed, reps),
        "round": _best_ms(one_round, reps),
        "div": round(_best_ms(lambda: rules.support_divergence_logits(z_p[:4], z_q, "js", "subset"), reps) / 4, 5),
        "div1": _best_ms(lambda: rules.support_divergence_logits(z_p[:1], z_q[:1], "js", "subset"), reps),
        "expand": _best_ms(expand, reps),
    }
    target = timers.get("target")
    if hasattr(target, "time_feed"):
        try:
            fed = [target.time_feed() for _ in range(reps)]
            out["feed"] = round(1000 * min(f for f, _ in fed), 5)
            out["step"] = round(1000 * min(c for _, c in fed), 5)
        except (ImportError, TypeError, AttributeError):  # an engine that feeds otherwise: the loop's prices
            pass
    keep: dict[str, float] = {}
    for role, timer in timers.items():
        ts = [getattr(timer, "time_keep", lambda: None)() for _ in range(4)]
        if all(t is not None for t in ts):
            keep[role] = round(1000 * min(t for t in ts if t is not None), 5)
    if keep:
        out["keep"] = keep
    return out


def linear_bytes(model: Any) -> tuple[int, Any]:
    """Bytes of every linear's weight a step streams (a tied head as a linear), and the largest layer."""
    sizes: dict[Any, int] = {}
    for m in model.modules():  # each module once
        n = _weight_bytes(m) if hasattr(m, "in_features") and hasattr(m, "out_features") else None
        if n is not None:
            sizes[m] = n
    return sum(sizes.values()), max(sizes, key=lambda m: sizes[m], default=None)


def _weight_bytes(m: Any) -> int | None:
    """Bytes a linear's weight occupies as stored: a quantized layer says so itself (`weight_bytes`)."""
    if hasattr(m, "weight_bytes"):
        return int(m.weight_bytes)
    w = getattr(m, "packed", None) if hasattr(m, "packed") else getattr(m, "weight", None)
    return None if w is None else m.in_features * m.out_features * w.element_size()


def memory_floor_ms(model: Any, reps: int = 15) -> dict[str, float]:
    """The step's floor here: the largest matrix's one-row product time (min of `reps`), scaled to every weight byte."""
    total, largest = linear_bytes(model)
    if largest is None:
        return {}
    w = getattr(largest, "packed", None)
    w = getattr(largest, "weight", None) if w is None else w
    floating = isinstance(w, torch.Tensor) and w.is_floating_point()
    x = torch.randn(1, largest.in_features).to(w.dtype if floating and w is not None else torch.float32)  # [1, in]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            largest(x)
            best = min(best, time.perf_counter() - t0)
    mine = _weight_bytes(largest) or 1
    return {
        "floor_ms": round(1000 * best * total / mine, 3),
        "gemv_ms": round(1000 * best, 3),
        "gb_per_s": round(mine / best / 1e9, 2),
        "mb": round(total / 1e6, 1),
    }


def warm_up(
    models: dict[str, Any], vocab_size: int, prompt_ids: list[int], runners: dict[str, Any] | None = None
) -> float:
    """One short run through each distinct model before any clock (first-call costs), on the forward its family's
    plan names (`runners`: role -> compiled packages); returns its seconds."""
    t0 = time.perf_counter()
    seen: set[int] = set()
    ids = list(prompt_ids[-32:]) or [1]
    for role, model in models.items():
        if id(model) in seen:
            continue
        seen.add(id(model))
        lm = open_lm(model, vocab_size, role, (runners or {}).get(role))
        seq = ids + [int(lm.feed(ids, 1)[0].argmax())]
        seq.append(int(lm.feed(seq, 1)[0].argmax()))
        lm.feed(seq + seq[-3:], 3)
    return time.perf_counter() - t0
