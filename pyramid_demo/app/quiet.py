"""The race timed as the bench times (`clock`): lanes interleaved over repeats, nothing drawn while a clock runs; the
page hears a progress line between lanes and replays the records afterwards (`replay`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from .. import clock
from ..core.config import DecodeConfig
from ..core.methods import Lane
from ..core.trace import RunResult
from .session import Race
from .text import MSG

BUDGET_S = 32.0  # a press of Run race starts another repeat only while its decoding should stay within this: four
# repeats of the offline family on 2 cores (~7.5 s each, full records built), so one disturbed repeat moves no median
MAX_REPEATS = 4  # repeats per press; "Race again" (the same prompt and settings) adds as many
KEEP_REPEATS = 12  # a race keeps its latest repeats (a visitor's memory stays bounded)
SETTLE_S = 0.05  # after a progress line, before the next clock: the browser draws it in no lane's time
SAME = ("preset", "models", "prompt", "config", "lanes")  # what two races share when the second adds repeats


def variants(lanes: tuple[Lane, ...], base: DecodeConfig) -> list[clock.Run]:
    """The race's lanes as timed runs on the race's settings (one seed: repeats differ by timing alone)."""
    return [
        clock.Run(lane.key, lane.method, replace(base, method=lane.method, shape=lane.shape or base.shape), lane.solo)
        for lane in lanes
    ]


def decode(
    triplet: Any,
    ids: list[int],
    race: Race,
    lanes: tuple[Lane, ...],
    base: DecodeConfig,
    stop: Callable[[], bool],
    max_repeats: int | None = None,
) -> Iterator[str]:
    """Warm every lane up, then time repeats of every lane in turn (MAX_REPEATS, fewer past BUDGET_S), yielding a
    progress line before each lane, never inside one; `race.results` then holds each lane's median run."""
    vs, most = variants(lanes, base), MAX_REPEATS if max_repeats is None else max_repeats
    profile = race.profile if race.profile and "ms" in race.profile else None  # as the bench reads it
    try:
        yield MSG["warming"].format(n=race.n, k=len(vs))
        clock.warm_up(triplet, vs, ids, profile=profile)
        spent, done = 0.0, 0
        while not stop() and done < most and (done == 0 or spent * (done + 1) / done <= BUDGET_S):
            rep: dict[str, RunResult] = {}
            race.repeats.append(rep)
            for i, (lane, v) in enumerate(zip(lanes, vs)):
                yield MSG["running"].format(n=race.n, label=lane.short, i=i + 1, total=len(vs), r=len(race.repeats))
                time.sleep(SETTLE_S)
                res, wall = clock.timed(triplet, v, ids, profile=profile, text=race.prompt, stop=stop)
                spent += wall
                if res is not None and res.stats.stopped:
                    rep[lane.key] = res
                elif res is not None and not any(lane.key in r for r in race.repeats):
                    race.results[lane.key] = res  # Stop came before this lane ever finished: its passes so far
                if stop():
                    return
            done += 1
    finally:
        settle(race)


def median_run(runs: list[RunResult]) -> RunResult:
    """The run of median speed (the slower middle of an even count): the one its lane replays and every view reads."""
    return sorted(runs, key=lambda r: r.stats.tokens_per_s)[(len(runs) - 1) // 2]


def settle(race: Race) -> None:
    """Keep the latest KEEP_REPEATS repeats that ran something, and show each lane's median run, in lane order."""
    race.repeats[:] = [rep for rep in race.repeats if rep][-KEEP_REPEATS:]
    runs = {k: [rep[k] for rep in race.repeats if k in rep] for k in race.lanes}
    race.results = {
        k: median_run(runs[k]) if runs[k] else race.results[k] for k in race.lanes if runs[k] or k in race.results
    }


def slim(race: Race) -> None:
    """A race no longer the latest: its runs not shown keep statistics and timings but not rounds (bounded memory)."""
    for rep in race.repeats:
        for k, r in rep.items():
            if r is not race.results.get(k):
                rep[k] = replace(r, steps=[replace(s, qualifier_rounds=[], target_round=None) for s in r.steps])


def same_work(a: Race | None, b: Race) -> bool:
    """Whether race b times what the finished race a timed: then b's repeats add to a's ("Race again")."""
    return a is not None and not a.stopped and all(getattr(a, k) == getattr(b, k) for k in SAME)
