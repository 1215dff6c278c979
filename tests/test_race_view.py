"""The race as the page shows it, from hand-built records: the replay's schedule (each token at the moment its own
lane produced it), the results table's columns, and the verdicts over repeats and their noise band. No model runs."""

from __future__ import annotations

import math
import re

import pytest
from helpers import compute_stats

from pyramid_demo import clock
from pyramid_demo.app import handlers as h
from pyramid_demo.app import race_view, render, story
from pyramid_demo.app.races import Race, Session
from pyramid_demo.app.text import INTRO, MSG, RACE_COLUMNS
from pyramid_demo.core.trace import RunResult, StageRound, Step, TokenRec

COL = {name: i for i, name in enumerate(RACE_COLUMNS)}


def checked(n: int) -> StageRound:
    """A target round that kept the first of two proposed tokens and then wrote its own (token ids from n)."""
    return StageRound(
        "target",
        "qualifier",
        "target",
        "sd",
        [
            TokenRec(n, "qualifier", "accepted"),
            TokenRec(99, "qualifier", "rejected"),
            TokenRec(n + 1, "target", "resampled"),
        ],
        1,
        parents=[-1, 0],
    )


def run(method: str, ends: list[float], per_pass: list[int] | None = None) -> RunResult:
    """A finished run whose target pass i commits per_pass[i] tokens (default 1) and ends ends[i] s after prefill;
    a pass of 2 tokens records a target round that kept one proposed token of two."""
    per_pass = per_pass or [1] * len(ends)
    steps, n = [], 0
    for i, (k, t0, t1) in enumerate(zip(per_pass, [0.0, *ends[:-1]], ends)):
        steps.append(Step(i, [], checked(n) if k == 2 else None, list(range(n, n + k)), ["target"] * k, t0, t1))
        n += k
    stats = compute_stats(method, steps, 0.05, "max_new_tokens")
    return RunResult(
        method,
        {"shape": "chain"},
        ["d", "q", "t"],
        "hi",
        [7],
        list(range(n)),
        [f"w{i} " for i in range(n)],
        ["target"] * n,
        "",
        stats,
        steps,
    )


def even(n: int, total: float, per_pass: int = 1) -> RunResult:
    """n passes of per_pass tokens, evenly spaced over `total` seconds."""
    return run("ar", [total * (i + 1) / n for i in range(n)], [per_pass] * n)


def race_of(repeats: list[dict[str, RunResult]], shown: dict[str, RunResult] | None = None) -> Race:
    lanes = tuple(repeats[0])
    race = Race(
        n=1,
        preset="tiny-random",
        models=["d", "q", "t"],
        prompt="hi",
        config={"temperature": 0.0},
        lanes=lanes,
        machine="Test CPU, 2 cores",
    )
    race.repeats = repeats
    race.results = shown or {k: repeats[0][k] for k in lanes}
    return race


# ------------------------------------------------------------------ the replay's schedule
AR_ENDS, AR_PASSES = [0.10, 0.20, 0.35, 0.50], [1, 1, 1, 1]
SD_ENDS, SD_PASSES = [0.12, 0.30, 0.41], [3, 1, 2]


def replayed(page: str, key: str) -> tuple[list[float], float]:
    """A lane's chip times and finish line, as the browser's replay reads them (data-t, data-end)."""
    lane = page.split(f'class="lane lane-{key}"')[1].split('class="lane ')[0]
    return [float(x) for x in re.findall(r'data-t="([^"]+)"', lane)], float(re.search(r'data-end="([^"]+)"', lane)[1])


def check_replay(page: str) -> None:
    """Each lane's token i appears at the end of the pass that committed it in that lane's own run (counted by hand
    from the passes built above), and the lane finishes at its last pass."""
    for key, ends, passes in (("ar", AR_ENDS, AR_PASSES), ("sd", SD_ENDS, SD_PASSES)):
        times, end = replayed(page, key)
        assert times == pytest.approx([t for t, k in zip(ends, passes) for _ in range(k)], abs=1e-4), key
        assert end == pytest.approx(ends[-1], abs=1e-4), key


def test_each_token_replays_at_its_own_lanes_recorded_time(monkeypatch):
    """Rule: in the replayed race every chip carries the end time of the target pass that committed it, in its own
    lane's run, and each lane's finish line is its last pass; a planted slip (a pass's start time, i.e. a
    timestamp off by one pass, or a lane given another lane's timestamps) fails the same check."""
    race = race_of([{"ar": run("ar", AR_ENDS, AR_PASSES), "sd": run("sd", SD_ENDS, SD_PASSES)}])
    page = race_view.race_lanes(race, played=True)
    check_replay(page)
    assert render.token_times(race.results["sd"]) == [0.12, 0.12, 0.12, 0.30, 0.41, 0.41]
    real = render.token_times
    for slip in (
        lambda r: [s.t_start for s in r.steps for _ in s.new_tokens],  # off by one pass
        lambda r: real(race.results["ar"])[: len(r.token_ids)],
    ):  # every lane at AR's timestamps
        monkeypatch.setattr(render, "token_times", slip)
        with pytest.raises(AssertionError):
            check_replay(race_view.race_lanes(race, played=True))


def test_the_page_says_it_replays_measured_timings_and_names_the_machine():
    """Rule: only the latest race is played: its lanes sit in a `replay playing` block under a line that says the
    lanes replay measured timings (each lane's median of n repeats) and names the CPU, with the speed control
    (×1, slow motion) and a replay button the page's script reads; an earlier race is drawn still, every chip shown."""
    race = race_of([{"ar": even(4, 0.4), "sd": even(2, 0.3, 2)}] * 3)
    page = race_view.race_lanes(race, played=True)
    assert '<div class="replay playing">' in page and "Replaying measured timings" in page
    assert "median run of 3" in page and "timed on Test CPU, 2 cores" in page
    assert [float(x) for x in re.findall(r'data-speed="([^"]+)"', page)] == [1.0, 0.5, 0.25]
    assert 'data-replay="1"' in page and "data-t=" in page
    still = race_view.race_lanes(race)
    lanes = still.split('<div class="lanes">')[1]
    assert 'class="replay' not in still and "data-t=" not in still and lanes.count('class="tok o-target') == 8
    for needle in ("dataset.t", "dataset.end", "dataset.speed", "data-replay", "watch('value'", ".live", "playing"):
        assert needle in race_view.JS, needle


def test_before_a_race_the_first_screen_warns_of_nothing():
    """Rule: before any race the page shows no exactness warning nor near-tie talk; a finished race's exactness
    note sits under its lanes (with the one-time costs), never in the note above them."""
    first = race_view.race_lanes(None) + INTRO + MSG["idle"]
    assert not any(w in first.lower() for w in ("near-tie", "exact", "bitwise", "may differ"))
    race = race_of([{"ar": even(2, 0.2)}])
    race.exact_note, race.note, race.setup = MSG["trees_not_exact"], "family note", "One-time costs: …"
    page = race_view.race_lanes(race, played=True)
    head, foot = page.split('class="lanes-foot"')
    assert "near-ties" not in head and "near-ties" in foot and "One-time costs" in foot and "family note" in head


def test_the_outputs_before_the_clocks_are_the_empty_lanes_and_the_earlier_races():
    """Rule: what is big and fixed (the earlier races, the coming race's empty lanes, an empty chart) is sent before
    any lane is timed; the table waits for the end."""
    old = race_of([{"ar": even(3, 0.3)}])
    session = Session(races=[old], next=2)
    upcoming = Race(2, "tiny-random", ["d", "q", "t"], "hello", {}, lanes=("ar",))
    status, lanes, fig, table, earlier, _ = race_view.before_race(session, upcoming, session.races, "loading")
    assert "Race 2" in lanes and "waiting" in lanes and "Race 1" in earlier and "Race 2" not in earlier
    assert not fig.data and isinstance(table, dict) and table.get("__type__") == "update"


# ------------------------------------------------------------------ the table and the verdicts over repeats
AR_S = [1.0, 1.1, 0.9]  # each repeat's decode seconds for 10 tokens
PSD_S = [0.8, 0.85, 0.75]


def three_repeats(psd_s: list[float] = PSD_S) -> Race:
    """AR and PSD_A timed three times each (10 tokens; PSD_A commits 2 per pass)."""
    return race_of(
        [
            {"ar": even(10, a), "psd_a": run("psd_a", [p * (i + 1) / 5 for i in range(5)], [2] * 5)}
            for a, p in zip(AR_S, psd_s)
        ]
    )


def iqr_over_median(xs: list[float]) -> float:
    """By hand for three values: the quartiles sit halfway between the middle one and each end."""
    lo, mid, hi = sorted(xs)
    return ((mid + hi) / 2 - (lo + mid) / 2) / mid


def test_every_column_of_the_results_table_from_hand_built_repeats():
    """Rule: a lane's row gives its repeats, its tokens, the median decode time and median tok/s over its repeats,
    × AR as the median of the same repeat's ratios, × SD blank without an SD lane, acceptance, tokens per target
    pass, agreement with AR at T=0 and why it stopped; a lane Stop cut before it ever finished says so."""
    race = three_repeats()
    ar_tps, psd_tps = [10 / s for s in AR_S], [10 / s for s in PSD_S]
    rows = {row[COL["method"]]: row for row in race_view.race_rows([race])}
    ar, psd = rows["ar"], rows["psd_a"]
    assert [ar[COL[c]] for c in ("race", "repeats", "tokens", "time (s)", "tok/s", "× AR", "× SD")] == [
        1,
        3,
        10,
        1.0,
        round(sorted(ar_tps)[1], 1),
        1.0,
        None,
    ]
    assert psd[COL["time (s)"]] == 0.8 and psd[COL["tok/s"]] == round(sorted(psd_tps)[1], 1) == 12.5
    assert psd[COL["× AR"]] == round(sorted(p / a for p, a in zip(psd_tps, ar_tps))[1], 2) == 1.25
    assert psd[COL["tokens / target pass"]] == 2.0 and ar[COL["tokens / target pass"]] == 1.0
    assert psd[COL["acceptance"]] == "target 50%" and ar[COL["acceptance"]] == "—"
    assert psd[COL["agreement (T=0)"]] == ar[COL["agreement (T=0)"]] == "100%"
    assert psd[COL["stopped"]] == ar[COL["stopped"]] == "max_new_tokens"
    cut = run("psd_a", [0.1, 0.2])
    cut.stats.stopped = ""
    race.results["psd_a"], race.repeats = cut, [{"ar": rep["ar"]} for rep in race.repeats]
    row = {r[COL["method"]]: r for r in race_view.race_rows([race])}["psd_a"]
    assert row[COL["repeats"]] == 0 and row[COL["tokens"]] == 2 and row[COL["stopped"]] == "stopped by user"


def test_the_noise_band_comes_from_the_repeats_and_narrows_with_more():
    """Rule: the band is the widest spread (interquartile range ÷ median) of a lane's ratio to the AR run of the same
    repeat, ÷ √repeats; a machine that slows both runs of each repeat alike does not widen it; without a paired lane
    it is the spread of a lane's speeds, and six repeats as spread as three (quartiles 9.5 and 10.5 about 10 tok/s)
    narrow it by √2."""
    race = three_repeats()
    want = iqr_over_median([a / p for a, p in zip(AR_S, PSD_S)]) / math.sqrt(3)
    assert clock.race_noise(race.results, race.repeats) == pytest.approx(want, rel=1e-3)  # tok/s: 3 decimals
    assert want < iqr_over_median([10 / s for s in AR_S]) / math.sqrt(3)  # AR's own speeds wobble more
    drifting = race_of([{"ar": even(10, a), "psd_a": even(10, 0.8 * a)} for a in (1.0, 2.0, 3.0)])
    assert clock.race_noise(drifting.results, drifting.repeats) == pytest.approx(0.0, abs=1e-3)

    def band(speeds: list[float]) -> float:
        r = race_of([{"ar": even(10, 10 / v)} for v in speeds])
        return clock.race_noise(r.results, r.repeats)

    assert band([9, 10, 11]) == pytest.approx(0.1 / math.sqrt(3), rel=1e-3)
    assert band([9, 9.5, 9.5, 10.5, 10.5, 11]) == pytest.approx(0.1 / math.sqrt(6), rel=1e-3)


def test_a_method_is_called_faster_only_outside_the_band():
    """Rule: PSD_A at a median of 1.25× AR over three repeats with a band of about 2% is named the winner, beyond
    the band, in the status line and called faster in the Statistics story; at a median of 1.04× with repeats of
    0.95–1.15× (inside its band) the status line says tie and the story says a tie with AR; with one repeat and no
    forwards to measure, no band: the winner is named as unsure."""
    race = three_repeats()
    band = clock.race_noise(race.results, race.repeats)
    said = h.winner_line(race)
    assert "**PSD_A (assisted pyramid)** won: 12.5 tok/s, ×1.25 vs AR" in said and f"({band:.0%})" in said
    row = {r["method"]: r for r in story.rows(race.results, None, race.repeats)}["psd_a"]
    assert row["x_ar"] == pytest.approx(1.25) and row["verdict"].startswith("**faster** than AR (1.25×")
    close = three_repeats([a / x for a, x in zip(AR_S, (0.95, 1.04, 1.15))])  # band ≈ 5.6%
    assert "Tie within this race's noise band" in h.winner_line(close) and "PSD_A, AR" in h.winner_line(close)
    row = {r["method"]: r for r in story.rows(close.results, None, close.repeats)}["psd_a"]
    assert row["verdict"].startswith("**a tie with AR** within noise (1.04×")
    one = race_of([{"ar": even(10, 1.0), "psd_a": even(5, 0.8, 2)}])
    assert "too few forwards and repeats" in h.winner_line(one)


def test_the_shown_run_is_each_lanes_median():
    """Rule: every view reads each lane's run of median speed (the slower middle of an even count), so the replay,
    the chart and the inspector show one measured run, not an average no run had."""
    from pyramid_demo.app import races

    runs = [even(10, s) for s in (1.0, 1.3, 0.9, 1.1)]
    race = race_of([{"ar": r} for r in runs])
    races.settle(race)
    assert race.results["ar"] is runs[3]  # 9.1 tok/s: the slower middle of 7.7, 9.1, 10.0 and 11.1
