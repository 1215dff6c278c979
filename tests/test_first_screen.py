"""The first screen in plain words: the family box's budget with no figures or warnings, this machine's measured
record kept in the fold, a lane's title naming the shape it ran. Hand-built records; no model loads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import visible

from pyramid_demo.app import handlers as h
from pyramid_demo.app import race_view
from pyramid_demo.app.races import Race
from pyramid_demo.core.trace import RunResult
from pyramid_demo.models import loading, runtime
from pyramid_demo.models.presets import PRESETS

TARGET = {
    "exact": True,
    "top1": True,
    "passes": 6,
    "bitwise_passes": 6,
    "max_abs_diff": 0.0,
    "max_k": 5,
    "trees": {"exact": False, "top1": True, "passes": 4, "bitwise_passes": 2, "max_abs_diff": 3e-5},
}
QUAL = {"exact": False, "top1": True, "passes": 6, "bitwise_passes": 1, "max_abs_diff": 0.25, "max_k": 5}


def _plant(monkeypatch, record: dict | None) -> None:
    """A loaded family whose record (as `prepare` writes it) is `record` (None: the family has not loaded)."""
    t = SimpleNamespace(
        runs="target: the core pass, compiled (agrees with eager)", machine="AMD EPYC, 2 cores, AVX-512 BF16"
    )
    monkeypatch.setattr(loading, "loaded", lambda spec: t if record is not None else None)
    monkeypatch.setattr(runtime, "family_record", lambda triplet: record or None)


@pytest.mark.parametrize("preset", [*PRESETS, "custom"])
@pytest.mark.parametrize("record", [{"checks": {"target": TARGET, "qualifier": QUAL}}, {}, None])
def test_the_family_box_is_three_short_lines_without_figures(preset, record, monkeypatch):
    """Rule: the box beside the prompt is at most 3 lines and 300 visible characters, says what each model is,
    and carries no measured figure and no exactness warning (the fold holds the record: counts, max |Δlogit|)."""
    _plant(monkeypatch, record)
    box, fold, _ = h.preset_info(preset)
    named = "(AMD EPYC, 2 cores, AVX-512 BF16)" in fold
    assert named == (record is not None and preset != "custom"), "the fold names the CPU its family was planned on"
    seen = visible(box)
    assert len(seen.splitlines()) <= 3 and len(seen) <= 300, seen
    assert not any(w in box for w in ("bitwise", "logit", "passes", "6/6", "near-ties", "⚠")), box
    if preset != "custom":
        assert "Draft" in box and "qualifier" in box and "target" in box
        assert "Estimate here" in fold
        if record:  # the figures: in the fold
            assert "What runs here" in fold and "compiled" in fold
            assert "6/6 passes" in fold and "1/6 passes bitwise equal, max |Δlogit| 0.25" in fold, fold
        elif record == {}:
            assert "not measured on this machine yet" in fold
        else:
            assert "decided when the family loads" in fold


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
