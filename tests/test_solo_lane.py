"""The reference lane "the qualifier alone": it decodes exactly what AR decodes with the qualifier in the target's
slot, its record names the qualifier, the race adds it behind a switch (with where its text leaves the target's),
and the bench adds it as a reference row. Tiny-random models: seconds."""

from __future__ import annotations

import argparse
import dataclasses
import html
import warnings

import pytest
import torch
from app_server import FAST as APP_FAST

from pyramid_demo.app import charts, play_view, views
from pyramid_demo.app import handlers as h
from pyramid_demo.app.race_view import divergence_words
from pyramid_demo.app.races import Session
from pyramid_demo.bench import runner as bench
from pyramid_demo.bench.prompts import Prompt
from pyramid_demo.bench.variants import name_models
from pyramid_demo.core.engine import decode, prefill
from pyramid_demo.core.methods import LANES, DecodeConfig, lane_label, lanes
from pyramid_demo.core.run import encode_prompt, generate
from pyramid_demo.core.settings import APP_SETTINGS
from pyramid_demo.core.trace import first_divergence
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {**APP_FAST, "max_new_tokens": 6.0, "shape": "chain"}
KEY = "qualifier_alone"


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """Cost profiles are recorded in a fresh cache folder's manifest, not the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYRAMID_DEMO_CACHE", str(tmp_path_factory.mktemp("solo_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def family():
    """tiny-random with an unrelated random model as the qualifier, so its text surely leaves the target's."""
    t = tiny_random_triplet(seed=0)
    return dataclasses.replace(t, qualifier=tiny_random_triplet(seed=7).target)


def _direct(t, ids: list[int], cfg: DecodeConfig) -> list[int]:
    """AR through the engine by hand, with an LM over the qualifier in the target's slot."""
    lms = {"target": open_lm(t.qualifier, t.vocab_size, "target")}
    prefill(lms, ids)
    gen = None if cfg.greedy else torch.Generator().manual_seed(cfg.seed)
    return [x for step in decode(lms, ids, cfg, t.eos_ids, gen) for x in step.new_tokens]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_solo_lane_decodes_what_ar_with_the_qualifier_as_target_decodes(family, temperature) -> None:
    """Rule: greedy or sampled, the lane's tokens are exactly AR's with the qualifier as the target; its record
    names the qualifier (origins, forwards) and says it decoded alone."""
    cfg = DecodeConfig(method="ar", max_new_tokens=12, temperature=temperature, seed=3)
    ids = encode_prompt(family.tokenizer, "the quick brown fox")
    res = generate(family, ids, cfg, solo="qualifier")
    assert res.token_ids == _direct(family, ids, cfg) and len(res.token_ids) == 12
    assert res.token_ids != generate(family, ids, cfg).token_ids  # it is not the target decoding
    assert res.solo == "qualifier" and res.method == "ar" and set(res.origins) == {"qualifier"}
    assert set(res.stats.forward_passes) == {"qualifier"} and all(set(s.fed) == {"qualifier"} for s in res.steps)


def test_the_solo_lane_refuses_a_method_other_than_ar(family) -> None:
    with pytest.raises(ValueError, match="method 'ar'"):
        generate(family, "hi", DecodeConfig(method="sd", max_new_tokens=2), solo="qualifier")


@pytest.mark.parametrize(
    "out, ref, want",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([9, 2, 3], [1, 2, 3], 0),
        ([1, 2, 9, 4], [1, 2, 3, 4], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3, 4], [1, 2, 3], 3),
        ([5], [1, 2, 3], 0),
    ],
)
def test_first_divergence(out, ref, want) -> None:
    """Rule: the first differing position (0-based), or where the shorter ends; None only for the same tokens."""
    assert first_divergence(out, ref) == want


def test_divergence_words() -> None:
    """Rule: positions are said 1-based; an equal text says how long; under sampling AR's text is a sample."""
    assert divergence_words([1, 2, 3], [1, 2, 3]) == "writes the target's text for all 3 tokens"
    assert divergence_words([9, 2, 3], [1, 2, 3]) == "leaves the target's text at token 1"
    assert divergence_words([1, 2, 9], [1, 2, 3]) == "leaves the target's text at token 3"
    assert divergence_words([1, 2], [1, 2, 3]).startswith("writes the target's text for its 2 tokens, then ends")
    assert divergence_words([1, 2, 3, 4], [1, 2, 3]).endswith("for all 3 tokens, then goes on past its end")
    assert divergence_words([1, 9], [1, 2], greedy=False) == "leaves AR's sampled text at token 2"


def test_the_label_names_the_model_that_decodes() -> None:
    """Rule: "(quantized copy of the target)" only when the qualifier's reference is the target's int4 copy."""
    t = "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert lane_label(KEY, ("d", f"{t}@int4", t)) == "the qualifier alone (quantized copy of the target)"
    assert lane_label(KEY, ("d", f"{t}@int4g128", t)) == "the qualifier alone (quantized copy of the target)"
    assert lane_label(KEY, ("d", "other/m@int4", t)) == "the qualifier alone (quantized copy of other/m)"
    assert lane_label(KEY, ("d", "me@work/q", t)) == lane_label(KEY, ("d", "q", t)) == "the qualifier alone"
    assert lane_label("ar", ("d", f"{t}@int4", t)) == LANES["ar"].label
    assert LANES[KEY].solo == "qualifier" and LANES[KEY].method == "ar"  # a field says who decodes, not the key
    assert [x.key for x in lanes(False, True)][:2] == ["ar", KEY] and KEY not in [x.key for x in lanes(True)]


def _race(session, **kw) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request is a plain UserWarning
        return list(h.race_event("hello", "tiny-random", "", "", "", session, **FAST, **kw))


def test_the_race_switch_adds_the_lane_and_its_divergence_line() -> None:
    """Rule: with the switch on the race has the reference lane right after AR, its lane says where its text
    leaves AR's, it never wins, and the charts, inspector, statistics, player and export all take it."""
    session = Session()
    outs = _race(session, qualifier_alone=True)
    race = session.races[0]
    assert race.lanes[:2] == ("ar", KEY) and set(race.results) == set(race.lanes)
    solo, ar = race.results[KEY], race.results["ar"]
    assert solo.solo == "qualifier" and solo.stats.stopped and set(solo.origins) == {"qualifier"}
    status, lane_html, fig, table = outs[-1][:4]
    body = lane_html.split(f"lane-{KEY}")[1].split('class="lane ')[0]
    assert "the qualifier alone" in body and html.escape(divergence_words(solo.token_ids, ar.token_ids)) in body
    assert "tok/s" in body and "vs AR" in body
    assert "the qualifier alone" not in status.split("finished")[1]  # a reference, not a contender
    assert any(row[1] == KEY for row in table) and len(charts.race_figure(race.results).data) == len(race.lanes)
    picked = views.pick_race(session)  # inspector choices, statistics tab, histogram
    assert KEY in [v for _, v in picked[1]["choices"]] and "Q alone" in picked[9]
    chips, *_ = views.inspect_round(session, race.n, KEY, 1, 0.4, 0.5, 1)
    assert chips
    _, ps, beat, _ = play_view.pick_lane(session, KEY)
    assert ps.beats and "the qualifier alone writes" in beat
    assert all(p is not None for p in h.export_files(session))


def test_the_race_without_the_switch_has_no_reference_lane() -> None:
    session = Session()
    outs = _race(session)
    race = session.races[0]
    assert KEY not in race.lanes and KEY not in race.results and f"lane-{KEY}" not in outs[-1][1]
    assert all(r.solo is None for r in race.results.values())


def _args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(["--models", "tiny-random", "--no-progress", *extra])


def test_bench_solo_adds_a_reference_row_with_its_agreement() -> None:
    """Rule: --solo qualifier adds one reference row after AR (never lossless, never a baseline), labelled after
    the family; it runs the qualifier alone and reports its agreement with AR's text like the other rows."""
    with pytest.raises(ValueError, match="--solo draft"):
        bench.build_variants(_args("--solo", "draft"))
    vs = bench.build_variants(
        _args("--methods", "ar,sd", "--solo", "qualifier", "--peers", "none", "--max-new-tokens", "6")
    )
    assert [(v.method, v.kind) for v in vs] == [("ar", "engine"), ("ar", "reference"), ("sd", "engine")]
    assert not vs[1].lossless and vs[1].solo == "qualifier"
    named = name_models(vs, ("d", "t@int4", "t"))
    assert named[1].label == "the qualifier alone (quantized copy of the target)" and named[0] == vs[0]
    res = bench.run_bench(
        tiny_random_triplet(), vs, [Prompt("the quick brown fox", "test")], progress=False, warmup_tokens=2
    )
    rows = {r["variant"]: r for r in res["runs"]}
    ref = rows["the qualifier alone"]
    assert ref["kind"] == "reference" and ref["solo"] == "qualifier" and ref["fwd_qualifier"] and not ref["fwd_target"]
    assert ref["agreement"] is not None and ref["speedup_vs_ar"] is not None and rows["sd"]["agreement"] == 1.0
    assert rows["ar"]["speedup_vs_ar"] == 1.0


def test_the_lane_has_its_own_colour_and_counts_in_the_gpu_budget() -> None:
    """Rule: the reference lane's colour is its own (not AR's grey); a ZeroGPU allocation counts it as a lane."""
    from pyramid_demo.app import hosting
    from pyramid_demo.app.render import METHOD_COLOURS

    assert METHOD_COLOURS[KEY] == LANES[KEY].colour != METHOD_COLOURS["ar"]
    kw = {k: FAST[k] for k in APP_SETTINGS}
    on = hosting.plan_budget("tiny-random", len(lanes(False, True)), 6).duration_s
    assert hosting.race_duration("hi", "tiny-random", qualifier_alone=True, **kw) == on


def test_the_player_names_who_decodes_alone() -> None:
    """Rule: a pass with no round is played as one model alone, the one its origins name (AR: the target)."""
    from pyramid_demo.app import playback
    from pyramid_demo.core.trace import Step

    def say(origin: str) -> str:
        return playback.beats(Step(0, [], None, [5], [origin], 0.0, 0.1), lambda t: " cat")[0].sentence

    assert say("target") == "the target alone writes ‘ cat’ — one token per pass"
    assert say("qualifier") == "the qualifier alone writes ‘ cat’ — one token per pass"
