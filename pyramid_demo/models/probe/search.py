"""Time every candidate on the real target and check exactness: the fastest exact wins, else the fastest top-1."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ...core.config import LONGEST_PASS
from ...core.engine import connect
from ...forward.cache import TargetStates
from ...forward.lean import attention_of, set_attention
from ...forward.lean_weights import supports_lean
from ...forward.lm import LM, open_lm
from ...predict import measure
from .build import candidate_model, candidates
from .exactness import PASS_CHECKS, check_model
from .record import Choice

VERIFY_K = 5  # a verification pass: a proposal of 4 plus the verifier's own token
REPS = 4
# a race's target forwards: AR's N one-token steps, and ≈ 2.8N passes from four methods verifying every ~1.4 tokens
SCORE_WEIGHTS = {1: 1.0, VERIFY_K: 3.0}
# exactness plan: (context length, pass lengths k), up to the longest pass; the last two put 17-token passes deep
# into the cache, the last past the attention kernel's key split (`lean.KV_SPLIT`)
EXACT_PLAN = ((100, (*range(2, 10), 17, 33, LONGEST_PASS)), (60, tuple(range(2, 10))), (140, tuple(range(2, 10))),
              (300, (5, 17)), (450, (9, 17)))
TREE_PLAN = (EXACT_PLAN[0], EXACT_PLAN[-1])  # tree passes: near the start, and past the key split
make_timer = measure.ForwardTimer  # tests replace this timer (the cost profile's too: `warm`)


def new_timer(*args: Any, **kw: Any) -> Any:
    """A forward timer from `make_timer`, read at call time, so a test's replacement reaches `warm` too."""
    return make_timer(*args, **kw)


def score(timings: dict[str, float]) -> float:
    """A candidate's weighted forward time, as a race spends it (SCORE_WEIGHTS)."""
    return sum(w * timings[str(k)] for k, w in SCORE_WEIGHTS.items())


def pick(timings: dict[str, dict[str, float]], records: dict[str, dict]) -> str:
    """The fastest exact candidate; else the fastest whose top-1 always matched; else the fastest."""
    pool = ([c for c in timings if records.get(c, {}).get("exact")]
            or [c for c in timings if records.get(c, {}).get("top1")] or list(timings))
    return min(pool, key=lambda c: score(timings[c]))


def reads_target(models: dict[str, Any]) -> bool:
    """Whether a proposer of the family reads the target's states (its target's forward then hands them out)."""
    return any(getattr(m, "reads_target", False) for r, m in models.items() if r != "target")


def role_opener(models: dict[str, Any], role: str, vocab_size: int, backend: str, path: str,
                publish: bool | None = None) -> Callable[[list[int]], LM]:
    """`role`'s LM opened as a run opens it (`check_model(..., with_ids=True)`): the target publishing its states
    when a proposer reads them, such a proposer given the target's states over the checked ids."""
    publish = reads_target(models) if publish is None else publish

    def open_for(ids: list[int]) -> LM:
        lm = open_lm(models[role], vocab_size, role, backend, path)
        if role == "target":
            lm.publish = TargetStates() if publish else None
        elif getattr(models[role], "reads_target", False):
            target = open_lm(models["target"], vocab_size, "target", backend, path)
            connect({"target": target, role: lm})
            target.forward(ids, 0, 1)  # the target's states at every checked position
        return lm

    return open_for


def check_family(models: dict[str, Any], vocab_size: int, backend: str, path: str, plan: Any = None) -> dict[str, dict]:
    """Every role's exactness record on the forward it runs (the target's decides the lossless claim)."""
    plan = EXACT_PLAN if plan is None else plan
    kinds = tuple(k for k in PASS_CHECKS if k != "tree")  # trees: on the target's chosen forward
    return {role: check_model(role_opener(models, role, vocab_size, backend, path), vocab_size, plan,
                                        with_ids=True, kinds=kinds)
            for role in models}


def check_triplet(triplet: Any) -> dict[str, dict]:
    """`check_family` for a loaded family as it runs (its device, dtype, backend and forward)."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    return check_family(models, triplet.vocab_size, triplet.backend, triplet.path)


def probe_target(target: torch.nn.Module, vocab_size: int, check_all: bool = False, publish: bool = False) -> Choice:
    """Time each candidate (interleaved rounds, min over rounds: a machine growing busy penalises all alike), check
    exactness from the fastest down until one is exact (`check_all`: all), and `pick`."""
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
        if path == "lean":
            choose_attention(model, vocab_size, backend, publish)
        opener = role_opener({"target": model}, "target", vocab_size, backend, path, publish)
        records[c] = check_model(opener, vocab_size, EXACT_PLAN, pad, with_ids=True, kinds=("attention", "chain"))
        records[c]["lean_attention"] = attention_of(model) if path == "lean" else None
        if records[c]["exact"] and not check_all:
            break
    chosen = pick(timings, records)
    attention = "auto"
    if chosen in records:  # tree passes, on the chosen forward only: whether the tree methods are lossless here
        model, pad, backend, path = runs[chosen]
        if path == "lean":
            attention = records[chosen]["lean_attention"]
            set_attention(model, attention)  # as it was checked (a candidate sharing the model may have changed it)
        opener = role_opener({"target": model}, "target", vocab_size, backend, path, publish)
        records[chosen]["trees"] = check_model(opener, vocab_size, TREE_PLAN, pad, with_ids=True,
                                                         kinds=("tree",)).get("trees")
    dt, backend, path = chosen.split("/")
    return Choice(dt, backend, "probe", timings, round(time.perf_counter() - t0, 2), records, path,
                  {} if lean else {"target": type(target).__name__}, attention=attention)


def choose_attention(model: torch.nn.Module, vocab_size: int, backend: str, publish: bool = False) -> str:
    """Set and return `model`'s lean attention at this thread count: "auto" where bitwise steps' here, else "rows"."""
    set_attention(model, "auto")
    opener = role_opener({"target": model}, "target", vocab_size, backend, "lean", publish)
    if not check_model(opener, vocab_size, EXACT_PLAN, with_ids=True, kinds=("attention",))["exact"]:
        set_attention(model, "rows")
    return attention_of(model)


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
