"""Accepted tokens per target pass, one panel per method: readable with five chains and four trees."""

from __future__ import annotations

from pyramid_demo.app import pass_hist
from pyramid_demo.app.render import METHOD_COLOURS
from pyramid_demo.core.trace import RunResult, Stats

CHAINS = ("ar", "sd", "fsd", "psd_a", "psd_f")
TREES = ("sd+tree", "fsd+tree", "psd_a+tree", "psd_f+tree")  # lane keys: what the lane runs is in its record
LANES = {**{m: (m, "chain") for m in CHAINS}, **{t: (m, "tree") for t, m in zip(TREES, CHAINS[1:])}}


def result(lane: str, hist: list[int]) -> RunResult:
    method, shape = LANES[lane]
    passes = sum(hist)
    mean = sum(k * v for k, v in enumerate(hist)) / passes
    stats = Stats(method, 0, 0.0, 1.0, 0.0, passes, {}, {}, {}, mean, mean + 1, hist, {}, {}, {}, 0.0, "eos")
    return RunResult(method, {"shape": shape}, [], "", [], [], [], [], "", stats, [])


def race(methods: tuple[str, ...]) -> dict[str, RunResult]:
    """AR accepts nothing; every other lane a histogram of its own shape (lane i peaks at k = i % 4)."""
    return {m: result(m, [9] if m == "ar" else [1 + 3 * (k == i % 4) for k in range(5)]) for i, m in enumerate(methods)}


def test_nine_methods_a_panel_each_trees_under_their_chains() -> None:
    """Rule: a panel per proposing method (AR drafts nothing: none), chains on the top row in the table's
    order, each tree in the row below, in its chain's column."""
    res = race(CHAINS + TREES)
    where = pass_hist.panels(res)
    assert where == {
        "sd": (1, 1),
        "fsd": (1, 2),
        "psd_a": (1, 3),
        "psd_f": (1, 4),
        "sd+tree": (2, 1),
        "fsd+tree": (2, 2),
        "psd_a+tree": (2, 3),
        "psd_f+tree": (2, 4),
    }
    fig = pass_hist.accepted_figure(res)
    assert len(fig.data) == 8
    xaxes = {tr.xaxis for tr in fig.data}
    assert len(xaxes) == 8  # no two methods share a panel


def test_bars_are_shares_in_the_methods_colour_and_trees_are_hatched() -> None:
    """Rule: each panel's bars are the share of passes at each k (summing to 1), in the method's colour (a
    tree in its chain's when it has none of its own), hatched for a tree; the panel title gives the mean."""
    res = race(CHAINS + TREES)
    fig = pass_hist.accepted_figure(res)
    for tr in fig.data:
        assert abs(sum(tr.y) - 1) < 1e-9
        tree = tr.marker.pattern.shape == pass_hist.TREE_PATTERN
        assert tree == (tr.xaxis in {"x5", "x6", "x7", "x8"})
    sd = next(tr for tr in fig.data if tr.xaxis == "x")
    assert sd.marker.color == METHOD_COLOURS["sd"] and list(sd.customdata) == res["sd"].stats.accepted_hist
    titles = [a.text for a in fig.layout.annotations]
    assert f"SD · mean {res['sd'].stats.mean_accepted_per_target_pass:.2f}" in titles


def test_chains_alone_fill_one_row() -> None:
    """Rule: without tree methods the figure is one row of four panels."""
    where = pass_hist.panels(race(CHAINS))
    assert set(where.values()) == {(1, 1), (1, 2), (1, 3), (1, 4)}


def test_no_race_says_so() -> None:
    """Rule: with nothing to count (no race, or AR alone) the figure says when it appears."""
    for res in ({}, race(("ar",))):
        fig = pass_hist.accepted_figure(res)
        assert not fig.data and "after a race" in fig.layout.annotations[0].text


def test_every_panel_shares_one_scale() -> None:
    """Rule: a chain and its tree are compared down a column, so every panel's y axis has the same range, and
    the x axis stops at the longest accepted run any method had."""
    res = race(CHAINS + TREES)
    res["sd+tree"] = result("sd+tree", [0, 9, 0, 0, 0, 0, 0, 0])  # one tall bar; bins past k = 4 all empty
    fig = pass_hist.accepted_figure(res)
    ranges = {tuple(fig.layout[k].range) for k in fig.layout if k.startswith("yaxis")}
    assert len(ranges) == 1 and next(iter(ranges))[1] >= 1.0
    assert all(len(tr.x) == 5 for tr in fig.data) and fig.layout.xaxis.range[1] < 5
