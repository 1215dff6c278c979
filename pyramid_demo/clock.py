"""The clock the race (`app/races.py`) and the bench (`bench/runner.py`) time runs with (warm-up first, shape settled
before the clock), and how repeats are read: median speeds, paired speed-ups and their noise band."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .core.methods import LANES, DecodeConfig
from .core.run import generate, stream, takes_trees
from .core.trace import RunResult, Step
from .forward.lm import ModelTriplet
from .predict.expected import resolve_shape


@dataclass(frozen=True)
class Run:
    """One timed setting: a label, the engine's config, and (a reference run) the member that decodes alone."""

    label: str
    method: str
    cfg: DecodeConfig
    solo: str | None = None


def timed(
    triplet: ModelTriplet,
    v: Run,
    ids: list[int],
    chat: bool = True,
    profile: dict | None = None,
    text: str | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[RunResult | None, float]:
    """One engine run timed as the bench's rows and the app's race are, the shape settled first: (record, wall s).
    With `stop`: full records, `stop` polled after every target pass, the passes so far kept (None before one)."""
    cfg, why = resolve_shape(v.cfg, profile, takes_trees(triplet, v.cfg.method))  # before the clock
    t0 = time.perf_counter()
    if stop is None:
        res: RunResult | None = generate(
            triplet, ids, cfg, chat=chat, text=text, full_records=False, shape_why=why, solo=v.solo
        )
    else:
        res, runs = None, stream(triplet, ids, cfg, chat=chat, text=text, shape_why=why, solo=v.solo)
        with contextlib.closing(runs):  # a stopped run's full records are built as its stream closes
            for res in runs:  # noqa: B007
                if stop():
                    break
    return res, time.perf_counter() - t0


def warm_up(
    triplet: ModelTriplet,
    runs: Sequence[Run],
    ids: list[int],
    chat: bool = True,
    profile: dict | None = None,
    tokens: int = 8,
    run: Callable[[Run], object] | None = None,
) -> None:
    """One short untimed run of each label, last first, so no timed run pays a first call (`run`: default `timed`)."""
    for r in {r.label: r for r in reversed(runs)}.values():
        short = dataclasses.replace(r, cfg=dataclasses.replace(r.cfg, max_new_tokens=min(tokens, r.cfg.max_new_tokens)))
        if run is None:
            timed(triplet, short, ids, chat, profile)
        else:
            run(short)


Repeats = list[dict[str, RunResult]]  # a race's repeats, each lane key -> its run to the end (`Race.repeats`)


def ratio(a: float | None, b: float | None) -> float | None:
    """a ÷ b, None where either is missing or b is 0: the one ratio of speeds."""
    return a / b if a is not None and b else None


def lane_speeds(key: str, results: dict[str, RunResult], repeats: Repeats | None = None) -> list[float]:
    """A lane's tok/s in each repeat that ran it to its end; a lane without one, its record's."""
    return [rep[key].stats.tokens_per_s for rep in repeats or () if key in rep] or [results[key].stats.tokens_per_s]


def speed(key: str, results: dict[str, RunResult], repeats: Repeats | None = None) -> float:
    """A lane's speed as the bench states one: the median tok/s over its repeats."""
    return statistics.median(lane_speeds(key, results, repeats))


def paired_ratios(key: str, base: str, repeats: Repeats | None) -> list[float]:
    """key's tok/s ÷ base's in each repeat that ran both to the end: a repeat the machine slowed throughout cancels."""
    return [
        x
        for rep in repeats or ()
        if key in rep and base in rep
        if (x := ratio(rep[key].stats.tokens_per_s, rep[base].stats.tokens_per_s)) is not None
    ]


def speed_ratio(key: str, base: str, results: dict[str, RunResult], repeats: Repeats | None = None) -> float | None:
    """key's speed ÷ base's as the bench states it: the median of `paired_ratios` (no repeats: of the records)."""
    xs = paired_ratios(key, base, repeats) or paired_ratios(key, base, [results])
    return statistics.median(xs) if xs else None


def race_noise(results: dict[str, RunResult], repeats: Repeats | None = None) -> float | None:
    """The race's relative noise band: the widest spread of a lane's ratio to its repeat's AR run, ÷ √repeats; without
    two paired repeats, the spread of same-size forwards and of each lane's speeds. None: nothing to read."""
    reps, base = repeats or [], baseline_lane("ar", results)
    if base and (paired := [x for k in results if k != base if len(x := paired_ratios(k, base, reps)) >= 2]):
        return max(relative_spread(x) or 0.0 for x in paired) / math.sqrt(min(map(len, paired)))
    groups = same_k_forwards(s for rep in reps or [results] for r in rep.values() for s in r.steps)
    speeds = [lane_speeds(k, results, repeats) for k in results]
    spreads = [timing_noise(groups), *(relative_spread(x) for x in speeds)]
    worst = max((x for x in spreads if x is not None), default=None)
    return None if worst is None else worst / math.sqrt(min(len(x) for x in speeds))


def within_noise(x: float | None, spread: float | None) -> bool:
    """True when a speed ratio x is within the noise band of 1 (never when either is unknown)."""
    return x is not None and spread is not None and compare(x, 1.0, spread) == 0


def baseline_lane(method: str, results: dict[str, RunResult]) -> str | None:
    """The lane a speed-up is measured against: the method's own lane, or side by side its chain's (from `LANES`)."""
    if method in results:
        return method
    return next((k for k in results if k in LANES and LANES[k].method == method and LANES[k].shape == "chain"), None)


# ---------------------------------------------------------------- timing noise: is one method faster than another?
MIN_GROUP = 5  # same-k forwards needed before a group's spread counts


def relative_spread(times: list[float]) -> float | None:
    """Interquartile range ÷ median of repeated timings of the same work (None for fewer than 2)."""
    if len(times) < 2:
        return None
    q25, med, q75 = np.quantile(times, (0.25, 0.5, 0.75)).tolist()  # numpy's linear interpolation
    return (q75 - q25) / med if med > 0 else None


def same_k_forwards(steps: Iterable[Step]) -> dict[tuple[str, int], list[float]]:
    """Seconds of single forwards by (role, new tokens k), from steps where that role made exactly one forward."""
    out: dict[tuple[str, int], list[float]] = {}
    for s in steps:
        for role, ks in s.fed.items():
            t = s.time_s.get(role)
            if len(ks) == 1 and t is not None and t > 0:
                out.setdefault((role, ks[0]), []).append(t)
    return out


def timing_noise(groups: dict[tuple[str, int], list[float]]) -> float | None:
    """The run's relative timing noise: groups' spreads weighted by size, over groups of ≥ MIN_GROUP (else None)."""
    sized = [(relative_spread(times), len(times)) for times in groups.values() if len(times) >= MIN_GROUP]
    n = sum(k for spread, k in sized if spread is not None)
    return sum(spread * k for spread, k in sized if spread is not None) / n if n else None


def compare(a: float, b: float, noise: float) -> int:
    """1 when speed a beats b by more than the noise (a > b·(1 + noise)), −1 when b beats a so, 0 for a tie."""
    return 1 if a > b * (1 + noise) else -1 if b > a * (1 + noise) else 0


def leaders(speeds: dict[str, float], noise: float) -> list[str]:
    """The fastest method and every other within noise of it, fastest first (several: a tie within noise)."""
    best = max(speeds.values(), default=0.0)
    return sorted((m for m, v in speeds.items() if compare(best, v, noise) == 0), key=lambda m: -speeds[m])
