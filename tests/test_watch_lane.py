"""What the reference lane "the qualifier alone" can get wrong besides its tokens: a field of its record still
naming the target, its title losing the family's names, and where its text leaves the target's said at the wrong
token or against the wrong text, in the race and in the bench. Hand-built records, and tiny-random runs (seconds)."""

from __future__ import annotations

import argparse

import pytest

from pyramid_demo.app import race_view, render
from pyramid_demo.app.races import Race
from pyramid_demo.bench import runner as bench
from pyramid_demo.bench.prompts import Prompt
from pyramid_demo.core.methods import LANES, DecodeConfig
from pyramid_demo.core.run import stream
from pyramid_demo.core.trace import RunResult, Stats
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "qualifier_alone"
SOLO = LANES[KEY].solo
PROMPT = "hello world"  # tiny-random (seed 0): its qualifier writes the target's first 4 tokens, then leaves them


def first_left(out: list[int], ref: list[int]) -> int:
    """By hand: the first index where out and ref differ (both as long, and they must differ)."""
    assert len(out) == len(ref)
    return [a == b for a, b in zip(out, ref)].index(False)


def result(method: str, tokens: list[int], stopped: str = "max_new_tokens", solo: str | None = None) -> RunResult:
    """A finished run's record with only what a lane's headline reads."""
    n = len(tokens)
    stats = Stats(method, n, 0.1, 1.0, float(n), n, {}, {}, {}, 0.0, 1.0, [n], {}, {}, {}, 0.0, stopped)
    return RunResult(method, {"shape": "chain"}, [], "", [], list(tokens), [], [], "", stats, [], solo=solo)


def race_of(ar: list[int], solo: list[int], temperature: float = 0.0, ar_stopped: str = "max_new_tokens") -> Race:
    race = Race(
        n=1,
        preset="p",
        models=["d", "t@int4", "t"],
        prompt="hi",
        config={"temperature": temperature},
        lanes=("ar", KEY),
    )
    race.results = {"ar": result("ar", ar, ar_stopped), KEY: result("ar", solo, solo=SOLO)}
    return race


def test_every_field_of_every_snapshot_names_the_qualifier() -> None:
    """Rule: in every snapshot of the lane (not only the last) each token's origin is the qualifier, one origin per
    token; every step's forward times, counts and fed tokens, and the statistics' forward counts and times, are
    keyed by the qualifier alone; and each chip the lane draws carries the qualifier's colour class."""
    family = tiny_random_triplet(seed=0)
    snaps = list(stream(family, PROMPT, DecodeConfig(method="ar", max_new_tokens=6), solo=SOLO))
    assert len(snaps) == 6
    for i, r in enumerate(snaps, 1):
        assert r.origins == [SOLO] * i == [SOLO] * len(r.token_ids), f"snapshot {i}: origins {r.origins}"
        for s in r.steps:
            assert s.origins == [SOLO] * len(s.new_tokens)
            assert set(s.time_s) == set(s.n_forward) == set(s.fed) == {SOLO}, f"pass {s.index + 1} names the target"
        assert set(r.stats.forward_passes) == set(r.stats.forward_time_s) == {SOLO}
    chips = render.coloured_tokens(snaps[-1])
    assert chips.count(f"o-{SOLO}") == 6 and "o-target" not in chips
    assert [f"{SOLO} · target pass {k}" in chips for k in range(1, 7)] == [True] * 6


def test_the_lanes_title_names_the_model_from_the_races_family() -> None:
    """Rule: the race draws the reference lane's title from its family's names, before it runs and after: "the
    qualifier alone (quantized copy of the target)" when the qualifier is the target's int4 copy."""
    want = "the qualifier alone (quantized copy of the target)"
    race = race_of([1, 2, 3], [1, 2, 3])
    body = race_view.race_lanes(race).split(f"lane-{KEY}")[1]
    assert want in body
    race.results.pop(KEY)
    assert want in race_view.race_lanes(race).split(f"lane-{KEY}")[1]


@pytest.mark.parametrize(
    "solo, words",
    [
        ([5, 6, 7, 1, 9, 10], "leaves the target's text at token 4"),
        ([1, 6, 7, 8, 9, 10], "leaves the target's text at token 1"),
        ([5, 6, 7, 8, 9, 1], "leaves the target's text at token 6"),
        ([5, 6, 7], "writes the target's text for its 3 tokens, then ends while the target's text goes on"),
        ([5, 6, 7, 8, 9, 10, 11], "writes the target's text for all 6 tokens, then goes on past its end"),
    ],
)
def test_the_headline_says_where_the_lanes_text_leaves_ars(solo, words) -> None:
    """Rule: a finished reference lane's headline says, 1-based, the first token where its text leaves AR's
    ([5, 6, 7, 8, 9, 10]), the lane's text first (a shorter lane ends, a longer one goes on), once."""
    race = race_of([5, 6, 7, 8, 9, 10], solo)
    head = race_view.headline(KEY, race.results[KEY], race)
    assert head.endswith(" · " + words) and head.count("text") == words.count("text")


def test_the_headline_names_the_reference_it_compares_with() -> None:
    """Rule: under sampling the reference is AR's sampled text, not the target's; AR's own lane, and the reference
    lane while AR has not finished, say nothing about leaving a text."""
    race = race_of([5, 6, 7], [5, 9, 7], temperature=0.8)
    assert race_view.headline(KEY, race.results[KEY], race).endswith(" · leaves AR's sampled text at token 2")
    assert "text" not in race_view.headline("ar", race.results["ar"], race)
    unfinished = race_of([5, 6, 7], [5, 9, 7], ar_stopped="")
    assert "text" not in race_view.headline(KEY, unfinished.results[KEY], unfinished)


def _args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(["--models", "tiny-random", "--no-progress", *extra])


def test_the_bench_row_says_where_the_qualifier_leaves_the_targets_text(monkeypatch) -> None:
    """Rule: the bench's reference row measures its text against AR's on the same prompt: its prefix agreement
    is exactly the first token where its text leaves AR's (counted by hand from both runs' tokens) over AR's
    length, its agreement the share of positions they share; AR's own row agrees fully."""
    tokens: dict[str, list[int]] = {}
    run = bench.run_variant

    def spy(triplet, v, ids, chat, profile=None):
        row, toks = run(triplet, v, ids, chat, profile)
        tokens[v.label] = toks
        return row, toks

    monkeypatch.setattr(bench, "run_variant", spy)
    vs = bench.build_variants(
        _args("--methods", "ar", "--solo", "qualifier", "--peers", "none", "--max-new-tokens", "12")
    )
    res = bench.run_bench(tiny_random_triplet(seed=0), vs, [Prompt(PROMPT, "test")], progress=False, warmup_tokens=2)
    rows = {r["variant"]: r for r in res["runs"]}
    ref, ar = rows["the qualifier alone"], rows["ar"]
    out, want = tokens["the qualifier alone"], tokens["ar"]
    k = first_left(out, want)
    assert 0 < k < len(want), "the check needs a text that leaves the target's after its start"
    assert ref["solo"] == SOLO and ref["prefix_agreement"] == k / len(want)
    assert ref["agreement"] == sum(a == b for a, b in zip(out, want)) / len(want)
    assert ar["prefix_agreement"] == ar["agreement"] == 1.0
