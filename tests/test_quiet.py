"""The race's quiet decode (`app/races.py`) through the handler, on tiny-random (seconds): nothing reaches the page
while a lane is timed, lanes are warmed and interleaved with the bench's own code, Stop ends at once and keeps what
finished, "Race again" adds repeats, and the race's records count what the bench's rows count."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest
from app_server import FAST

from pyramid_demo import clock
from pyramid_demo.app import handlers as h
from pyramid_demo.app import race_view, races
from pyramid_demo.app.races import Race, Session
from pyramid_demo.app.text import MSG, RACE_COLUMNS
from pyramid_demo.bench import runner
from pyramid_demo.bench.variants import Variant
from pyramid_demo.core.methods import DecodeConfig, lanes
from pyramid_demo.core.run import prepare_prompt
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = FAST
KEYS = [lane.key for lane in lanes()]


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    """No pause after a progress line (the browser is not there)."""
    monkeypatch.setattr(races, "SETTLE_S", 0.0)


def race(session, prompt: str = "hello", **over) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request is a plain UserWarning
        return list(h.race_event(prompt, "tiny-random", "", "", "", session, **{**SETTINGS, **over}))


def spy(monkeypatch, events: list, on_pass=None) -> None:
    """Log every timed lane's passes ("pass", run, lane method) and every warm-up run ("warm", method, tokens)."""
    real_stream, real_generate, runs = clock.stream, clock.generate, itertools.count()

    def stream(triplet, ids, cfg, **kw):
        n = next(runs)
        for k, snap in enumerate(real_stream(triplet, ids, cfg, **kw), 1):
            events.append(("pass", n, cfg.method))
            if on_pass:
                on_pass(cfg.method, k)
            yield snap

    def generate(triplet, ids, cfg, **kw):
        events.append(("warm", cfg.method, cfg.max_new_tokens))
        return real_generate(triplet, ids, cfg, **kw)

    monkeypatch.setattr(clock, "stream", stream)
    monkeypatch.setattr(clock, "generate", generate)


def test_nothing_reaches_the_page_while_a_lane_is_timed(monkeypatch):
    """Rule: between a timed lane's first and last target pass the handler yields nothing (every pass of one run
    is contiguous in the log of passes and page updates), and once the clocks start, until the race ends, every
    update is the status line alone (lanes, chart, table and earlier races skipped)."""
    events: list = []
    spy(monkeypatch, events)
    session = Session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for out in h.race_event("hello", "tiny-random", "", "", "", session, **SETTINGS):
            events.append(("ui", out))
    passes = [i for i, e in enumerate(events) if e[0] == "pass"]
    runs = {e[1] for e in events if e[0] == "pass"}
    assert len(runs) == races.MAX_REPEATS * len(KEYS)
    for n in runs:
        at = [i for i in passes if events[i][1] == n]
        assert len(at) >= 2 and at == list(range(at[0], at[-1] + 1)), f"run {n}: the page was updated mid-lane"
    during = [e[1] for e in events[passes[0] : passes[-1]] if e[0] == "ui"]
    assert len(during) == len(runs) - 1
    assert all(all(isinstance(x, dict) and x.get("__type__") == "update" for x in out[1:5]) for out in during)
    assert "decoding" in during[0][0] and "finished" in events[-1][1][0]


def test_lanes_are_warmed_then_interleaved_with_the_benchs_own_code(monkeypatch):
    """Rule: the race runs `clock.warm_up` (each lane once, 8 tokens at most, untimed) and then
    `clock.timed` for every lane, the lanes taking turns (A B C … A B C …) for MAX_REPEATS repeats, or one
    when a repeat would pass the time budget."""
    events: list = []
    spy(monkeypatch, events)
    shared = []
    warm_up = clock.warm_up
    monkeypatch.setattr(
        clock, "warm_up", lambda t, vs, *a, **k: shared.append([v.label for v in vs]) or warm_up(t, vs, *a, **k)
    )
    race(Session())
    methods = [lane.method for lane in lanes()]
    warm = [e for e in events if e[0] == "warm"]
    assert shared == [KEYS] and [e[1] for e in warm] == methods[::-1] and all(e[2] == 8 for e in warm)
    assert events.index(warm[-1]) < min(i for i, e in enumerate(events) if e[0] == "pass")
    timed = [m for _, m in dict.fromkeys((e[1], e[2]) for e in events if e[0] == "pass")]
    assert timed == methods * races.MAX_REPEATS
    monkeypatch.setattr(races, "BUDGET_S", 0.0)
    events.clear()
    session = Session()
    race(session)
    assert len({e[1] for e in events if e[0] == "pass"}) == len(KEYS) and len(session.races[0].repeats) == 1


def test_stop_during_the_quiet_decode_ends_at_once_and_shows_what_finished(monkeypatch):
    """Rule: Stop pressed during SD's 2nd target pass (the 2nd lane of the 1st repeat) ends the race after that
    pass: no further pass or lane runs; AR (finished) and SD (its 2 passes, "stopped by user") are shown."""
    session = Session()
    events: list = []

    def press_stop(method: str, k: int) -> None:
        if method == "sd" and k == 2:
            assert h.stop_race(session)[0] == MSG["stopping"]

    spy(monkeypatch, events, press_stop)
    outs = race(session)
    assert [e[2] for e in events if e[0] == "pass"][-3:] == ["ar", "sd", "sd"]
    status, lanes_html, _, table, *_ = outs[-1]
    assert status == MSG["stopped"].format(n=1) and session.races[0].stopped and not session.busy
    stopped = RACE_COLUMNS.index("stopped")
    assert [(row[1], row[stopped]) for row in table] == [("ar", "max_new_tokens"), ("sd", "stopped by user")]
    assert len(session.races[0].results["sd"].steps) == 2 and "lane-sd" in lanes_html


def test_race_again_adds_repeats_to_the_same_race():
    """Rule: Run race again with the same prompt and settings adds MAX_REPEATS repeats to the finished race (same
    number, one table row per lane); another prompt starts race 2, and race 1's runs not shown then keep their
    statistics and timings but not their rounds."""
    session = Session()
    race(session)
    outs = race(session)
    first = session.races[0]
    assert len(session.races) == 1 and len(first.repeats) == 2 * races.MAX_REPEATS
    assert f"timed {2 * races.MAX_REPEATS}×" in outs[-1][0] and len(outs[-1][3]) == len(KEYS)
    assert {row[RACE_COLUMNS.index("repeats")] for row in outs[-1][3]} == {2 * races.MAX_REPEATS}
    race(session, prompt="another")
    assert [r.n for r in session.races] == [1, 2]
    hidden = [r for rep in first.repeats for k, r in rep.items() if r is not first.results[k] and k != "ar"]
    assert hidden and all(s.target_round is None and s.fed for r in hidden for s in r.steps)
    assert all(s.target_round is not None for k, r in first.results.items() if k != "ar" for s in r.steps)


def test_the_race_and_the_bench_count_alike():
    """Rule: on the same family, prompt and settings, each race lane's record and the bench's row for that method
    agree on the tokens, the target passes, the forwards per model and the acceptance counts, and both define
    tok/s as new tokens ÷ decode seconds on the engine clock (prefill apart), which the race table shows."""
    triplet = dataclasses.replace(tiny_random_triplet(), eos_ids=())
    base = DecodeConfig(max_new_tokens=10, gamma=3, l_d=2, l_q=4, shape="chain")
    ids = prepare_prompt(triplet, "hello", base)
    r = Race(1, "tiny-random", list(triplet.names), "hello", base.to_dict(), lanes=tuple(KEYS))
    list(races.decode(triplet, ids, r, lanes(), base, lambda: False, max_repeats=1))
    tok_s = RACE_COLUMNS.index("tok/s")
    table = {row[1]: row for row in race_view.race_rows([r])}
    for v in races.variants(lanes(), base):
        row, toks = runner.run_variant(triplet, Variant(v.label, v.method, v.cfg, v.solo), ids, True)
        rec = r.results[v.label].stats
        assert toks == r.results[v.label].token_ids and row["n_new_tokens"] == rec.n_new_tokens == len(toks)
        assert row["target_passes"] == rec.target_passes == len(r.results[v.label].steps)
        for role in ("draft", "qualifier", "target"):
            assert row.get(f"fwd_{role}") == rec.forward_passes.get(role), (v.label, role)
        for stage in ("qualifier", "target"):
            assert row.get(f"accepted_{stage}") == rec.accepted.get(stage), (v.label, stage)
        assert row["tokens_per_s"] == pytest.approx(row["n_new_tokens"] / row["decode_s"], rel=1e-3)
        assert rec.tokens_per_s == pytest.approx(rec.n_new_tokens / rec.decode_s, rel=1e-3)
        assert table[v.label][tok_s] == round(rec.tokens_per_s, 1)


def test_a_race_keeps_only_its_latest_repeats(monkeypatch):
    """Rule: Race again past KEEP_REPEATS drops the oldest repeats (a visitor's memory stays bounded) and the shown
    run of each lane is one of the kept repeats' runs."""
    monkeypatch.setattr(races, "KEEP_REPEATS", races.MAX_REPEATS + 1)
    session = Session()
    race(session)
    newest = list(session.races[0].repeats)[-1:]
    race(session)
    kept = session.races[0].repeats
    assert len(kept) == races.MAX_REPEATS + 1 and kept[0] is newest[0]
    assert all(any(r is rep.get(k) for rep in kept) for k, r in session.races[0].results.items())
