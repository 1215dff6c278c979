"""The inspector's tree figure, on hand-built records: what it draws is what the trace says, fate by fate.

No model runs: a Step is built by hand (a tree with a rejected sibling, an accepted path of 2 and a subtree
never reached; a chain; a pyramid pass whose stage-1 rounds are trees) and the figure's traces are read back.
"""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from pyramid_demo.app import tree_view
from pyramid_demo.app.render import STATUS_COLOURS
from pyramid_demo.core.trace import StageRound, Step, TokenRec

TEXTS = {
    i: w
    for i, w in enumerate(
        ["<r>", "The", "A", "cat", "dog", "big", "sat", "ran", "ate", "on", "mat", "the", "red", "hat"]
    )
}


def tok(
    tid: int,
    status: str,
    proposer: str = "draft",
    verifier: str = "target",
    p: float = 0.5,
    q: float = 0.25,
    want: int | None = None,
) -> TokenRec:
    """A record whose top-5 says the verifier's top-1 at its context is `want` (default: the token itself)."""
    top = {verifier: [[want if want is not None else tid, 0.61], [99, 0.1]]}
    who = verifier if status in ("bonus", "resampled") else proposer
    return TokenRec(
        tid, who, status, div=None if who == verifier else 0.2, p=p, q=None if who == verifier else q, top5=top
    )


def sd_tree_step() -> Step:
    """root ─ The(rejected) ─ cat(discarded) ─ ran(discarded)
    └ A(accepted) ─ dog(accepted) ─ sat(rejected)
                  └ big(discarded)         ; then the target's own token 'ate' (resampled)."""
    toks = [
        tok(1, "rejected", want=2),
        tok(2, "accepted", p=0.7, q=0.45),
        tok(3, "discarded"),
        tok(4, "accepted", p=0.8, q=0.33),
        tok(5, "discarded"),
        tok(6, "rejected", want=8),
        tok(7, "discarded"),
        tok(8, "resampled", p=0.9),
    ]
    rnd = StageRound("target", "draft", "target", "sd", toks, n_accepted=2, parents=[-1, -1, 0, 1, 1, 3, 2])
    return Step(0, [], rnd, [2, 4, 8], ["draft", "draft", "target"], 0.0, 0.1)


def chain_step() -> Step:
    """A chain of 4: two accepted, one rejected, one discarded after it; the own token replaces the third."""
    toks = [
        tok(9, "accepted"),
        tok(11, "accepted"),
        tok(12, "rejected", want=10),
        tok(13, "discarded"),
        tok(10, "resampled"),
    ]
    return Step(
        3,
        [],
        StageRound("target", "draft", "target", "fuzzy", toks, 2),
        [9, 11, 10],
        ["draft", "draft", "target"],
        0.0,
        0.1,
    )


def psd_tree_step() -> Step:
    """Two stage-1 tree rounds (draft → qualifier) build a block of 4; the target checks it as a chain."""
    r1 = StageRound(
        "qualifier",
        "draft",
        "qualifier",
        "fuzzy",
        [
            tok(2, "accepted", verifier="qualifier"),
            tok(1, "discarded", verifier="qualifier"),
            tok(4, "rejected", verifier="qualifier", want=5),
            tok(5, "resampled", verifier="qualifier"),
        ],
        n_accepted=1,
        parents=[-1, -1, 0],
    )
    r2 = StageRound(
        "qualifier",
        "draft",
        "qualifier",
        "fuzzy",
        [
            tok(6, "accepted", verifier="qualifier"),
            tok(7, "discarded", verifier="qualifier"),
            tok(9, "bonus", verifier="qualifier"),
        ],
        n_accepted=1,
        parents=[-1, -1],
    )
    block = [
        tok(2, "accepted", "qualifier"),
        tok(5, "accepted", "qualifier"),
        tok(6, "rejected", "qualifier", want=10),
        tok(9, "discarded", "qualifier"),
        tok(10, "resampled"),
    ]
    t = StageRound("target", "qualifier", "target", "fuzzy", block, n_accepted=2)
    return Step(1, [r1, r2], t, [2, 5, 10], ["draft", "qualifier", "target"], 0.0, 0.1)


def nodes_by_colour(fig: go.Figure) -> dict[str, int]:
    """Drawn token markers per fill colour (text-only and edge traces excluded)."""
    out: dict[str, int] = {}
    for tr in fig.data:
        if tr.mode == "markers+text":
            out[tr.marker.color] = out.get(tr.marker.color, 0) + len(tr.x)
    return out


def colours(**counts: int) -> dict[str, int]:
    return {STATUS_COLOURS[fate][1]: n for fate, n in counts.items()}


def edges(fig: go.Figure, colour: str) -> set[tuple[tuple[float, float], tuple[float, float]]]:
    """The segments of the edge traces of one colour, as ((x, y) parent, (x, y) child)."""
    out = set()
    for tr in fig.data:
        if tr.mode == "lines" and tr.line.color == colour:
            xs, ys = list(tr.x), list(tr.y)
            for i in range(0, len(xs), 3):
                out.add(((xs[i], ys[i]), (xs[i + 1], ys[i + 1])))
    return out


def hovers(fig: go.Figure) -> list[str]:
    return [h for tr in fig.data if tr.mode == "markers+text" for h in tr.hovertext]


def test_a_tree_draws_every_fate_in_its_colour() -> None:
    """Rule: each proposed token is one marker filled with its fate's colour (accepted path green, rejected
    vermillion, never reached grey) and the verifier's own token is one more, in its status colour."""
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    assert nodes_by_colour(fig) == colours(accepted=2, rejected=2, discarded=3, resampled=1)
    names = {tr.name for tr in fig.data if tr.mode == "markers+text" and tr.showlegend}
    assert names == {"accepted path", "tried, rejected", "never reached", "verifier's replacement"}


def test_a_planted_wrong_colour_mapping_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: the fate → colour map is what the counts test reads; swapping two fates' colours must fail it."""
    bad = dict(tree_view.FATE_COLOURS)
    bad["rejected"], bad["discarded"] = bad["discarded"], bad["rejected"]
    monkeypatch.setattr(tree_view, "FATE_COLOURS", bad)
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    assert nodes_by_colour(fig) != colours(accepted=2, rejected=2, discarded=3, resampled=1)


def test_a_planted_wrong_fate_reading_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: fates come from the recorded status; a reader that calls every proposed token accepted fails."""
    monkeypatch.setattr(tree_view, "fate", lambda node: node.rec.status if node.own else "accepted")
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    assert nodes_by_colour(fig) != colours(accepted=2, rejected=2, discarded=3, resampled=1)


def test_edges_follow_the_parent_list_and_the_path_runs_along_the_top() -> None:
    """Rule: one edge per drawn token, parent → child, x = depth; the accepted path and the own token sit on
    y = 0 joined by the path colour; every branch off it hangs below (y > 0)."""
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    path = edges(fig, tree_view.EDGE_PATH)
    other = edges(fig, tree_view.EDGE_OTHER)
    assert path == {((0, 0), (1, 0)), ((1, 0), (2, 0)), ((2, 0), (3, 0))}  # root → A → dog → ate
    assert len(other) == 5  # The, cat, ran, big, sat
    assert all(child[1] > 0 and child[0] == parent[0] + 1 for parent, child in other)
    xy = {t: (x, y) for tr in fig.data if tr.mode == "markers+text" for t, x, y in zip(tr.text, tr.x, tr.y)}
    assert xy["'ran'"][0] == 3 and ((xy["'cat'"]), xy["'ran'"]) in other  # the subtree under 'The'
    assert xy["'sat'"][0] == 3 and ((2, 0), xy["'sat'"]) in other  # the rejected child of 'dog'


def test_hover_gives_each_models_probability() -> None:
    """Rule: a proposed token's hover names p (verifier), q (proposer) and Div; the own token's gives p."""
    texts = hovers(tree_view.tree_figure(sd_tree_step(), TEXTS))
    dog = next(h for h in texts if "'dog'" in h.split("<br>")[0])
    assert "p = 0.800 (target" in dog and "q = 0.330 (draft" in dog and "Div = 0.200" in dog
    ate = next(h for h in texts if "'ate'" in h.split("<br>")[0])
    assert "p = 0.900" in ate and "q =" not in ate and "target's token" in ate


def test_the_verifiers_top1_is_shown_at_each_level() -> None:
    """Rule: above each position of the path, the verifier's top-1 read from that position's top-5 record
    (here it wanted 'A' and 'dog' where they were accepted, and 'ate' where it refused 'sat')."""
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    want = next(tr for tr in fig.data if tr.mode == "text")
    assert list(zip(want.x, want.text)) == [(1, "'A'"), (2, "'dog'"), (3, "'ate'")]
    assert any("target's top-1" in a.text for a in fig.layout.annotations)
    rejected = next(h for h in hovers(fig) if "'The'" in h.split("<br>")[0])
    assert "target's top-1 here: 'A'" in rejected


def test_a_chain_draws_as_a_one_branch_tree() -> None:
    """Rule: with no parent list a round is a chain (parent i − 1): the accepted run and the own token on the
    path, the rejected token and what follows it on one branch below; the title says chain."""
    fig = tree_view.tree_figure(chain_step(), TEXTS)
    assert nodes_by_colour(fig) == colours(accepted=2, rejected=1, discarded=1, resampled=1)
    other = edges(fig, tree_view.EDGE_OTHER)
    assert other == {((2, 0), (3, 1)), ((3, 1), (4, 1))}
    assert "a chain of 4" in fig.layout.annotations[0].text


def test_a_pyramid_pass_draws_its_stage1_trees_and_the_target_block() -> None:
    """Rule: two rows, stage 1 (draft → qualifier rounds side by side, the second growing from the first's own
    token) and the target's round; shapes tell the stage: circles for stage-1 proposals, squares for the
    target round's, diamonds for the verifiers' own tokens."""
    fig = tree_view.tree_figure(psd_tree_step(), TEXTS)
    titles = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("Stage 1") and "2 rounds of trees" in t for t in titles)
    assert any(t.startswith("Stage 2") and "a chain of 4" in t for t in titles)
    assert nodes_by_colour(fig) == colours(accepted=4, rejected=2, discarded=3, resampled=2, bonus=1)
    by_axis: dict[str, set[str]] = {}
    for tr in fig.data:
        if tr.mode == "markers+text":
            by_axis.setdefault(tr.yaxis, set()).add(tr.marker.symbol.split("-")[0])
    assert by_axis == {"y": {"circle", "diamond"}, "y2": {"square", "diamond"}}
    q_path = {e for e in edges(fig, tree_view.EDGE_PATH) if e[1][0] <= 4}
    assert ((1, 0), (2, 0)) in q_path and ((2, 0), (3, 0)) in q_path  # round 2 starts at round 1's own token
    assert [a.text for a in fig.layout.annotations].count("round 1") == 1


def test_rejected_and_never_reached_differ_in_shape_too() -> None:
    """Rule: colour is never alone: rejected markers carry an ×, never-reached ones are hollow."""
    fig = tree_view.tree_figure(sd_tree_step(), TEXTS)
    symbols = {tr.name: tr.marker.symbol for tr in fig.data if tr.mode == "markers+text"}
    assert symbols["tried, rejected"].endswith("-x") and symbols["never reached"].endswith("-open")
    assert "-" not in symbols["accepted path"]


def test_ar_has_no_tree() -> None:
    """Rule: a pass with no proposal draws a message, not an empty axis."""
    fig = tree_view.tree_figure(Step(0, [], None, [5], ["target"], 0.0, 0.1), TEXTS)
    assert not fig.data and "AR" in fig.layout.annotations[0].text


def test_a_row_too_tall_folds_what_was_never_reached() -> None:
    """Rule: when a row would need more than MAX_SLOTS branches, each branch off the path shows only its first
    node, labelled +n, its never-reached descendants named on hover; a small tree is never folded."""
    n = tree_view.MAX_SLOTS + 2
    toks = [tok(2, "accepted"), tok(1, "discarded")] + [tok(3 + i % 10, "discarded") for i in range(n)]
    rnd = StageRound("target", "draft", "target", "sd", toks + [tok(8, "bonus")], 1, parents=[-1, -1] + [1] * n)
    fig = tree_view.tree_figure(Step(0, [], rnd, [2, 8], ["draft", "bonus"], 0.0, 0.1), TEXTS)
    assert nodes_by_colour(fig) == colours(accepted=1, discarded=1, bonus=1)
    labels = [t for tr in fig.data if tr.mode == "markers+text" for t in tr.text]
    assert f"'The' +{n}" in labels
    the = next(h for h in hovers(fig) if "'The'" in h.split("<br>")[0])
    assert f"+{n} candidate(s) below it, never reached: 'cat', 'dog'" in the
    assert "folded" in fig.layout.annotations[0].text
    small = tree_view.tree_figure(sd_tree_step(), TEXTS)
    assert "folded" not in small.layout.annotations[0].text and "+" not in "".join(
        t for tr in small.data if tr.mode == "markers+text" for t in tr.text
    )
