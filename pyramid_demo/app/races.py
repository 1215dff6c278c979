"""A visitor's races (the page's gr.State), mutated in place: Stop and Clear reach the running race's own object. A
race's one-time stages (convert, load, warm) report progress; then it is timed as the bench times (`clock`): lanes
interleaved over repeats, nothing drawn while a clock runs; the page hears a progress line between lanes and replays
the records afterwards (`race_view.JS`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field, replace
from typing import Any

from .. import clock
from ..core.methods import DecodeConfig, Lane, lanes
from ..core.trace import RunResult
from .text import MSG


@dataclass
class Race:
    """One race: every method on one prompt with one family and one configuration."""

    n: int
    preset: str
    models: list[str]
    prompt: str
    config: dict[str, Any]
    lanes: tuple[str, ...] = tuple(lane.key for lane in lanes())  # its lanes' keys (`methods.LANES`), in order
    results: dict[str, RunResult] = field(default_factory=dict)  # lane key -> its median run (what every view reads)
    vocab: dict[int, str] = field(default_factory=dict)  # token id -> text, for the inspector (no tokenizer)
    stopped: bool = False  # stopped by the user before every method ran
    note: str = ""  # shown above the lanes (family, budget cut)
    profile: dict | None = None  # the cost profile taken before the clocks started
    setup: str = ""  # the one-time costs (load, warm-up, profile), shown under the finished race's lanes
    repeats: list[dict[str, RunResult]] = field(default_factory=list)  # each repeat: lane key -> its finished run
    machine: str = ""  # the CPU the lanes were timed on, named under the replay
    exact_note: str = ""  # whether lossless lanes must write AR's text here: shown with the results, not above


@dataclass
class Session:
    """A visitor's races, oldest first, and the flags of the race that runs now."""

    races: list[Race] = field(default_factory=list)
    next: int = 1  # the next race's number
    busy: bool = False  # a race is running
    stop: bool = False  # Stop (or Clear) was asked for the running race
    exports: Any = None  # a TemporaryDirectory for this visitor's downloads, made at the first export

    @property
    def latest(self) -> Race | None:
        return self.races[-1] if self.races else None

    def find(self, n: Any) -> Race | None:
        """The race numbered `n` (as the dropdown sends it), else the latest."""
        return next((r for r in self.races if str(r.n) == str(n)), self.latest)


# ------------------------------------------------------------------ before the clocks
# the first race's one-time stages (convert, load, warm), with progress as elapsed time against the usual time
# (the status line, what the stage usually takes on 2 cores, in seconds)
STAGES = {
    "convert": ("Converting the bundled SmolLM2 GGUF into a cached copy (first run on this machine only)", 40.0),
    "load": ("Loading the three models", 8.0),
    "warm": ("Warming up every model (not counted in any lane)", 4.0),
}
POLL_S = 0.5


def loading_stage(preset: str) -> str:
    """Which stage a load of `preset` is in now: convert or load."""
    from ..models import bundled

    return "convert" if preset == "smollm2-offline" and not bundled.is_converted() else "load"


def run_staged(work: Callable[[], Any], stage: Callable[[], str]) -> Iterator[tuple[str, float, float]]:
    """Run `work` in a thread, yielding (status, progress 0..1, elapsed s) every POLL_S; returns (raises) its result."""
    done: Future = Future()

    def target() -> None:
        try:
            done.set_result(work())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread by done.result()
            done.set_exception(e)

    t0, since, current = time.perf_counter(), time.perf_counter(), None
    threading.Thread(target=target, daemon=True).start()
    while wait([done], POLL_S).not_done:  # a family already loaded is named no stage
        name = stage()
        if name != current:
            current, since = name, time.perf_counter()
        text, usual = STAGES[name]
        spent = time.perf_counter() - since
        yield f"⏳ {text}… {spent:.0f} s", min(0.95, spent / usual), time.perf_counter() - t0
    return done.result()


# ------------------------------------------------------------------ the clocks
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
