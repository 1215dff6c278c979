"""Time every candidate on the real target and check its exactness: the measurements a choice rests on.

Speed: cached forwards of k = 1 and k = VERIFY_K new tokens, weighted as a race spends them. Exactness
(`core.exactness`): k-token passes against one-token steps, k = 2 … the longest pass the settings allow, over
several contexts. The fastest exact candidate wins; if none is exact, the fastest whose top-1 always matched."""
from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch

from ...core import costs, exactness
from ...core.config import LONGEST_PASS
from ...core.lean import supports_lean
from ...core.lm import open_lm
from .build import candidate_model, candidates
from .record import Choice

VERIFY_K = 5  # a verification pass: a proposal of 4 plus the verifier's own token
REPS = 4
# A race's target forwards: AR's N one-token steps, and four speculative methods that each verify
# about once per 1.4 tokens (the offline family's acceptance, α ≈ 0.3 at γ 4: E = 1.43), ≈ 2.8N passes
SCORE_WEIGHTS = {1: 1.0, VERIFY_K: 3.0}
# exactness plan: (context length, pass lengths k); the first context's steps reach the longest pass
EXACT_PLAN = ((100, (*range(2, 10), 17, 33, LONGEST_PASS)), (60, tuple(range(2, 10))), (140, tuple(range(2, 10))))
make_timer = costs.ForwardTimer  # tests replace this timer (the cost profile's too: `warm`)


def new_timer(*args: Any, **kw: Any) -> Any:
    """A forward timer from `make_timer`, read at call time: a test's replacement reaches the cost profile
    (`warm`) too, which imports this function, not the package."""
    return make_timer(*args, **kw)


def score(timings: dict[str, float]) -> float:
    """A candidate's weighted forward time, as a race spends it (SCORE_WEIGHTS)."""
    return sum(w * timings[str(k)] for k, w in SCORE_WEIGHTS.items())


def pick(timings: dict[str, dict[str, float]], records: dict[str, dict]) -> str:
    """The fastest exact candidate; else the fastest whose top-1 always matched; else the fastest."""
    pool = ([c for c in timings if records.get(c, {}).get("exact")]
            or [c for c in timings if records.get(c, {}).get("top1")] or list(timings))
    return min(pool, key=lambda c: score(timings[c]))


def check_triplet(triplet: Any) -> dict:
    """The exactness record of a loaded family's target as it runs (its device, dtype and backend)."""
    return exactness.check_model(
        lambda: open_lm(triplet.target, triplet.vocab_size, "probe", triplet.backend, triplet.path),
        triplet.vocab_size, EXACT_PLAN)


def probe_target(target: torch.nn.Module, vocab_size: int, check_all: bool = False) -> Choice:
    """Time each candidate (dtype, backend, forward path; k=1 and k=VERIFY_K), then check exactness from
    the fastest down until one is exact (`check_all`: every candidate, for a full table), and `pick`.

    Candidates are timed in interleaved rounds (each round: every candidate, every k), min over rounds,
    so a machine that gets busier during the probe penalises all alike."""
    t0 = time.perf_counter()
    runs, timers = {}, {}
    lean = supports_lean(target)
    for dt, backend in candidates():
        model, pad = candidate_model(target, dt, backend)
        for path in ("lean", "hf") if lean else ("hf",):
            c = f"{dt}/{backend}/{path}"
            runs[c] = (model, pad, backend, path)
            timers[c] = make_timer(model, vocab_size, backend, path=path)
    best_s: dict[str, dict[int, float]] = {c: {} for c in timers}
    for _ in range(REPS + 1):  # the first round warms up; min() keeps the best
        for c, timer in timers.items():
            for k in SCORE_WEIGHTS:
                best_s[c][k] = min(best_s[c].get(k, float("inf")), timer.time(k))
    timings = {c: {str(k): round(1000 * v, 3) for k, v in ks.items()} for c, ks in best_s.items()}
    records: dict[str, dict] = {}
    for c in sorted(timings, key=lambda c: score(timings[c])):
        model, pad, backend, path = runs[c]
        records[c] = exactness.check_model(partial(open_lm, model, vocab_size, "probe", backend, path),
                                           vocab_size, EXACT_PLAN, pad)
        if records[c]["exact"] and not check_all:
            break
    dt, backend, path = pick(timings, records).split("/")
    return Choice(dt, backend, "probe", timings, round(time.perf_counter() - t0, 2), records, path,
                  {} if lean else {"target": type(target).__name__})


def table(got: Choice) -> str:
    """The probe's candidates as a markdown table: speed, exactness, padding, the pick."""
    head = ("| candidate (dtype / backend / forward) | k=1 ms | k=5 ms | weighted | bitwise passes | max diff "
            "| top-1 equal | pad rows | chosen |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    for c, t in sorted(got.timings_ms.items(), key=lambda ct: score(ct[1])):
        r = got.exactness.get(c)
        ex = (f"{r['bitwise_passes']}/{r['passes']}", f"{r['max_abs_diff']:.2g}", "yes" if r["top1"] else "no",
              str(r["pad_rows"])) if r else ("not checked",) + ("–",) * 3
        rows.append(f"| {c} | {t['1']:.1f} | {t[str(VERIFY_K)]:.1f} | {score(t):.1f} | " + " | ".join(ex)
                    + f" | {'**yes**' if c == got.key else ''} |")
    return "\n".join([head, *rows])
