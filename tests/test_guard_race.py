"""Guards on what a race decides and reports, each on the smallest hand-built input that shows its rule: the noise
band from the noisiest lane, a first race's repeats within its time budget, a pass's committed text only what the
target checked, and a run that stopped early scored on what it wrote. No model runs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from test_playback import WORDS, block, decode, rnd, step
from test_race_view import even, race_of

from pyramid_demo import clock
from pyramid_demo.app import playback, races
from pyramid_demo.app.races import Race
from pyramid_demo.core.methods import DecodeConfig, lanes
from pyramid_demo.core.trace import agreement, prefix_agreement


def test_the_band_is_the_noisiest_lanes_spread():
    """Rule: with several lanes paired with AR over repeats, the band is the widest of their spreads ÷ √repeats: a
    steady lane beside a noisy one does not narrow it (else the noisy lane is called faster on noise)."""
    ar_s, steady_s, noisy_s = [1.0, 1.0, 1.0], [0.8, 0.8, 0.8], [0.5, 0.6, 0.75]
    race = race_of(
        [{"ar": even(10, a), "sd": even(10, s), "psd_a": even(10, n)} for a, s, n in zip(ar_s, steady_s, noisy_s)]
    )
    noisy = clock.relative_spread(clock.paired_ratios("psd_a", "ar", race.repeats))
    steady = clock.relative_spread(clock.paired_ratios("sd", "ar", race.repeats))
    assert steady == pytest.approx(0.0, abs=1e-3) and noisy > 0.2
    assert clock.race_noise(race.results, race.repeats) == pytest.approx(noisy / math.sqrt(3), rel=1e-3)


def test_without_ar_the_band_is_the_widest_spread_of_a_lanes_speeds():
    """Rule: with no AR lane to pair with, the band is the widest spread of any lane's speeds over repeats (÷ √ the
    fewest repeats), not the steadiest lane's."""
    race = race_of([{"sd": even(10, 0.8), "psd_a": even(10, n)} for n in (0.5, 0.6, 0.75)])
    speeds = clock.lane_speeds("psd_a", race.results, race.repeats)
    want = clock.relative_spread(speeds) / math.sqrt(3)
    assert want > 0.05
    assert clock.race_noise(race.results, race.repeats) == pytest.approx(want, rel=1e-3)


def _quiet_race(monkeypatch, lane_s: float, n_lanes: int = 2) -> tuple[int, float]:
    """A race whose every timed run takes `lane_s` s of decoding (the bench's timer stood in for): (repeats, seconds
    of decoding in all)."""
    spent: list[float] = []

    def timed(triplet, v, ids, **kw):
        spent.append(lane_s)
        return SimpleNamespace(stats=SimpleNamespace(stopped="max_new_tokens", tokens_per_s=1.0)), lane_s

    monkeypatch.setattr(clock, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(clock, "timed", timed)
    monkeypatch.setattr(races, "SETTLE_S", 0.0)
    chosen = tuple(lanes())[:n_lanes]
    race = Race(n=1, preset="tiny-random", models=[], prompt="hi", config={}, lanes=tuple(x.key for x in chosen))
    list(races.decode(None, [1], race, chosen, DecodeConfig(), lambda: False))
    return len(race.repeats), sum(spent)


@pytest.mark.parametrize("lane_s", [0.5, 2.5, 3.9, 5.5, 7.9, 12.0, 20.0])
def test_a_first_race_decodes_within_its_budget(monkeypatch, lane_s: float):
    """Rule: a press of Run race starts another repeat only while the repeats so far say it will end within
    BUDGET_S of decoding, up to MAX_REPEATS; the first repeat always runs (else nothing is shown)."""
    repeats, spent = _quiet_race(monkeypatch, lane_s)
    per_repeat = 2 * lane_s
    want = max(1, min(races.MAX_REPEATS, math.floor(races.BUDGET_S / per_repeat)))
    assert repeats == want, (repeats, spent)
    assert spent <= races.BUDGET_S or repeats == 1


def test_a_pass_commits_only_what_the_target_checked():
    """Rule: while a pyramid pass plays its stage-1 rounds, the text committed this pass stays empty (the qualifier's
    accepted guesses are not yet the target's); it grows only as the target marks tokens ✓, and ends as the pass's
    tokens."""
    q1 = rnd("qualifier", "fuzzy", [(" The", "accepted", 0.1), (" cat", "accepted", 0.1)], (" sat", "resampled"))
    t = block(rnd("target", "fuzzy", [(" The", "accepted", 0.1), (" cat", "rejected", 0.9)], (" dog", "resampled")))
    beats = playback.beats(step(t, [" The", " dog"], ["draft", "target"], [q1]), decode)
    stage1 = [b for b in beats if b.title.startswith("stage 1")]
    assert stage1 and all(b.committed == () for b in stage1), [b.committed for b in stage1]
    seen = [tuple(c.text for c in b.committed) for b in beats if not b.title.startswith("stage 1")]
    assert seen[-1] == (" The", " dog") and () in seen and ((" The",) in seen)
    assert all(w in WORDS for s in seen for w in s)


def test_a_run_that_stopped_early_is_scored_on_what_it_wrote():
    """Rule: a run that wrote the reference's first 3 of 8 tokens and stopped agrees on 3/8 of it, in place and as a
    prefix, not on all of it; a run that leaves the reference at token 3 agrees as a prefix on 2/8."""
    ref = [5, 6, 7, 8, 9, 10, 11, 12]
    assert prefix_agreement(ref[:3], ref) == pytest.approx(3 / 8)
    assert agreement(ref[:3], ref) == pytest.approx(3 / 8)
    assert prefix_agreement([5, 6, 0, 8, 9, 10, 11, 12], ref) == pytest.approx(2 / 8)
    assert prefix_agreement(ref + [13], ref) == pytest.approx(1.0) and prefix_agreement([], ref) == 0.0
