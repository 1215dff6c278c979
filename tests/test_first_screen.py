"""The first screen in plain words: the family box's budget, the probe's figures kept in the fold, a lane's title
naming the shape it ran. Hand-built records and a planted probe choice; no model loads."""
from __future__ import annotations

import pytest

from pyramid_demo.app import family, race_view
from pyramid_demo.app import handlers as h
from pyramid_demo.app.session import Race
from pyramid_demo.core.trace import RunResult
from pyramid_demo.models import probe
from pyramid_demo.models.presets import PRESETS
from pyramid_demo.models.probe import Choice

RECORD = {"exact": True, "top1": True, "passes": 6, "bitwise_passes": 6, "max_abs_diff": 0.0, "max_k": 5,
          "trees": {"exact": False, "top1": True, "passes": 4, "bitwise_passes": 2, "max_abs_diff": 3e-5}}


def cached(record: dict | None):
    """A probe choice as the cache would give it, with `record` as its exactness record (None: no record)."""
    return Choice("bfloat16", "no-onednn", "cached", exactness={"bfloat16/no-onednn/hf": record} if record else {})


@pytest.mark.parametrize("preset", [*PRESETS, "custom"])
@pytest.mark.parametrize("record", [RECORD, {**RECORD, "exact": False}, None])
def test_the_family_box_is_three_short_lines_without_figures(preset, record, monkeypatch):
    """Rule: the box beside the prompt is at most 3 lines and 300 visible characters, says what each model is and
    whether SD writes AR's text exactly here, and carries none of the probe's figures (bitwise counts, max logit
    difference), which the fold holds."""
    monkeypatch.setattr(probe, "cached_choice", lambda name: cached(record))
    box, fold, _ = h.preset_info(preset)
    seen = family.visible(box)
    assert len(seen.splitlines()) <= family.BOX_LINES and len(seen) <= family.BOX_CHARS, seen
    assert not any(w in box for w in ("bitwise", "logit", "passes checked", "6/6")), box
    if preset != "custom":
        assert "Draft" in box and "qualifier" in box and "target" in box and "AR's text" in box
        assert "Estimate here" in fold
        if record:  # the figures: in the fold
            assert "6/6 passes" in fold and "max logit difference 3e-05" in fold, fold
        else:
            assert "exactness not checked" in fold


def test_the_box_says_plainly_whether_sd_is_exact_here(monkeypatch):
    """Rule: exact → SD writes AR's text exactly (tree lanes flagged when only they are not); not exact → it may
    differ at near-ties; no record → not checked; no probe yet → checked at the first load."""
    lines = {}
    for name, choice in (("exact", cached(RECORD)), ("inexact", cached({**RECORD, "exact": False})),
                         ("unchecked", cached(None)), ("none", None)):
        monkeypatch.setattr(probe, "cached_choice", lambda _, c=choice: c)
        lines[name] = family.visible(h.preset_info("smollm2")[0]).splitlines()[1]
    assert lines == {
        "exact": "✓ On this machine SD writes exactly AR's text at temperature 0 (tree lanes may differ at near-ties).",
        "inexact": "⚠ On this machine SD may differ from AR's text at near-ties (checking many tokens at once "
                   "rounds differently).",
        "unchecked": "Not checked on this machine: SD may differ from AR's text at near-ties.",
        "none": "Whether SD writes exactly AR's text here is checked when the family first loads on a CPU.",
    }


def _run(method: str, **config) -> RunResult:
    return RunResult(method, config, [], "", [], [], [], [], "", None, [])  # type: ignore[arg-type]


def test_a_lanes_title_names_the_shape_it_ran_not_the_predictor():
    """Rule: a lane's title is its method and the shape it ran (tree budget and depth, or the chain's length from
    the stage that takes the shape); its figures never carry the predictor's reasoning (`shape_why`)."""
    tree = _run("psd_a", shape="tree", tree_nodes=8, tree_depth=2, l_d=4, l_q=8)
    assert race_view.lane_title("psd_a", tree) == "PSD_A (assisted pyramid) · tree of 8 (depth 2)"
    assert race_view.lane_title("sd+chain", _run("sd", shape="chain", gamma=5)) == "SD (draft → target) · chain of 5"
    assert race_view.lane_title("psd_f", _run("psd_f", shape="chain", l_d=3)) == "PSD_F (fuzzy pyramid) · chain of 3"
    assert race_view.lane_title("ar", _run("ar", shape="chain")) == "AR (target only)"
    assert race_view.lane_title("fsd+tree", None) == "FSD (fuzzy draft → target) · tree"  # before it runs
    race = Race(n=1, preset="tiny-random", models=[], prompt="hi", config={}, lanes=("psd_a",))
    from helpers import compute_stats

    tree.stats = compute_stats("psd_a", [], 0.0, "max_new_tokens")
    tree.shape_why = "auto: a tree of 8 nodes (depth 2, 2 children), predicted 9.0 tok/s against the best chain's"
    race.results["psd_a"] = tree
    lanes = race_view.race_lanes(race)
    assert "PSD_A (assisted pyramid) · tree of 8 (depth 2)" in lanes and "predicted" not in lanes
