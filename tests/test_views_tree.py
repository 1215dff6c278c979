"""Every view of a round follows the tree, on hand-built tree rounds whose right answers are written here.

The round (a fuzzy target round under the SD fallback, τ 0.5 recorded; node i's divergence is its context's,
its parent's):

    root ─ The(rejected, Div 0.6) ─ cat(discarded, 0.1) ─ ran(discarded, 0.4)
         └ A(accepted, Div 0.6: the SD rule took it) ─ dog(accepted, 0.2) ─ sat(rejected, 0.9)
                                                       └ big(discarded, 0.2)      ; own token 'ate' (resampled)

Breadth-first node order: The, A, cat, dog, big, sat, ran (parents −1, −1, 0, 1, 1, 3, 2). The accepted path
is A → dog (nodes 1, 3); its positions are depths: A 1, dog 2, sat 3. Every record's top-5 is its context's
(the verifier T_c, the draft D_c), so a view that reads a child's context instead shows another list.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers import compute_stats

from pyramid_demo.app import inspector, pass_hist, story, tree_view, views
from pyramid_demo.app.races import Race, Session
from pyramid_demo.core.trace import RunResult, StageRound, Step, TokenRec

WORDS = ["<r>", "The", "A", "cat", "dog", "big", "sat", "ran", "ate", "on", "mat"]
TEXTS = (
    {i: w for i, w in enumerate(WORDS)} | {100 + c: f"T{c}" for c in range(8)} | {200 + c: f"D{c}" for c in range(8)}
)
PARENTS = [-1, -1, 0, 1, 1, 3, 2]
DIV = {0: 0.6, 1: 0.1, 2: 0.2, 3: 0.4, 4: 0.9}  # per context c (0 the root, i + 1 node i): The, cat, A, ran, dog


def top(c: int, own: bool = False) -> dict[str, list[list[float]]]:
    """Context c's distributions: the target's top-1 is T_c, the draft's D_c."""
    return (
        {"target": [[100 + c, 0.6], [9, 0.1]]}
        if own
        else {"target": [[100 + c, 0.6], [9, 0.1]], "draft": [[200 + c, 0.5], [10, 0.2]]}
    )


def rec(tid: int, status: str, c: int, tau: float | None = 0.5, proposer: str = "draft") -> TokenRec:
    return TokenRec(tid, proposer, status, div=DIV[c], tau=tau, p=0.3, q=0.4, top5=top(c))


def tree_round(
    statuses: list[str],
    own: str = "resampled",
    n_accepted: int = 2,
    fallback: bool = True,
    parents: list[int] | None = PARENTS,
) -> StageRound:
    toks = [rec(t, s, p + 1) for t, s, p in zip([1, 2, 3, 4, 5, 6, 7], statuses, PARENTS)]
    return StageRound(
        "target",
        "draft",
        "target",
        "fuzzy+sd" if fallback else "fuzzy",
        toks + [TokenRec(8, "target", own, p=0.9, top5=top(4, own=True))],
        n_accepted,
        sd_fallback=fallback,
        parents=parents,
    )


RECORDED = ["rejected", "accepted", "discarded", "accepted", "discarded", "rejected", "discarded"]


def step(rnd: StageRound | None = None) -> Step:
    return Step(0, [], rnd or tree_round(RECORDED), [2, 4, 8], ["draft", "draft", "target"], 0.0, 0.1)


def run(steps: list[Step], method: str = "fsd") -> RunResult:
    stats = compute_stats(method, steps, 0.0, "eos")
    return RunResult(method, {"tree_nodes": 7, "tau_t": 0.5, "tau_q": 0.5}, [], "", [], [], [], [], "", stats, steps)


def session(r: RunResult, method: str = "fsd", texts: dict[int, str] | None = None) -> Session:
    return Session([Race(1, "tiny", [], "", dict(r.config), results={method: r}, vocab=dict(texts or TEXTS))])


def top1s(fig) -> dict[str, str]:
    """Role → the top-1 label of its bar chart (the bars run bottom-up: the last is rank 1)."""
    return {tr.hovertemplate.split("<extra>")[1].split("</extra>")[0]: tr.y[-1] for tr in fig.data}


def marks(chips: str) -> dict[str, str]:
    """Token text → the ✓/✗/· mark drawn under it."""
    return dict(re.findall(r'<span class="tok [^"]*" title="[^"]*">([^<]+)</span><div[^>]*>(.)</div>', chips))


# --- the what-if τ: one walker for chains and trees -------------------------------------------------------

WHATIF = {  # τ → each node's status (the walk reads the stored SD decision: A was taken by the SD rule)
    0.5: RECORDED,
    0.7: ["accepted", "discarded", "accepted", "discarded", "discarded", "discarded", "accepted"],  # The→cat→ran
    0.3: RECORDED,
    0.1: ["rejected", "accepted", "discarded", "rejected", "rejected", "discarded", "discarded"],  # A, then none
}


@pytest.mark.parametrize("tau", sorted(WHATIF))
def test_the_what_if_walks_the_tree_reading_the_stored_sd_decisions(tau: float) -> None:
    """Rule: a context whose Div ≤ τ takes its top-ranked child; failing, it takes the child the SD rule took
    (stored), its siblings tried before it rejected; taking none rejects every child and ends the walk."""
    rnd = tree_round(RECORDED)
    assert inspector.whatif_statuses(rnd, tau) == WHATIF[tau], f"τ {tau}"
    assert inspector.reevaluate(rnd, tau) == WHATIF[tau].count("accepted")


def test_without_the_fallback_a_failing_context_takes_nothing() -> None:
    rnd = tree_round(RECORDED, fallback=False)
    assert inspector.whatif_statuses(rnd, 0.3) == ["rejected", "rejected"] + ["discarded"] * 5
    assert inspector.reevaluate(rnd, 0.0) == 0  # τ 0 passes nothing


def test_a_cut_tree_round_keeps_its_cut_under_any_tau() -> None:
    """Rule: a cut (a block's size, an EOS) does not depend on τ: the path past it is discarded, never accepted
    nor rejected. Here every context passes at τ 0.7, the path The → cat → ran was cut after The."""
    cut = ["accepted", "discarded", "discarded", "discarded", "discarded", "discarded", "discarded"]
    rnd = tree_round(cut, own="discarded", n_accepted=1, fallback=False)
    assert inspector.whatif_statuses(rnd, 0.7) == cut
    assert inspector.reevaluate(rnd, 0.7) == 1 and inspector.reevaluate(rnd, 100.0) == 1
    assert inspector.whatif_statuses(rnd, 0.05) == ["rejected", "rejected"] + ["discarded"] * 5


def test_a_cut_chain_round_keeps_its_cut_too() -> None:
    """Rule: a chain is a tree: the same walk, so a chain cut after 2 of 4 passing tokens shows the third
    discarded (cut), not rejected (it passed)."""
    toks = [
        TokenRec(i, "draft", s, div=0.1, tau=0.5)
        for i, s in enumerate(["accepted", "accepted", "discarded", "discarded"], start=1)
    ]
    rnd = StageRound("qualifier", "draft", "qualifier", "fuzzy", toks + [TokenRec(9, "qualifier", "discarded")], 2)
    assert inspector.whatif_statuses(rnd, 0.5) == ["accepted", "accepted", "discarded", "discarded"]
    assert inspector.whatif_statuses(rnd, 0.05) == ["rejected", "discarded", "discarded", "discarded"]


# --- the inspector: chips, marks, slider, top-5, wording -----------------------------------------------------


def test_the_marks_follow_the_accepted_path_not_the_node_index() -> None:
    """Rule: the ✓/✗/· under each chip is that token's own fate at the what-if τ (at τ_T 0.1: A kept, The and
    A's children refused, the rest never reached; at 0.7 the walk takes The → cat → ran)."""
    s = session(run([step()]))
    chips = views.inspect_round(s, 1, "fsd", 1, 0.5, 0.1, 1)[0]
    assert marks(chips) == {"A": "✓", "The": "✗", "dog": "✗", "big": "✗", "sat": "·", "cat": "·", "ran": "·"}
    chips = views.inspect_round(s, 1, "fsd", 1, 0.5, 0.7, 1)[0]
    assert marks(chips) == {"The": "✓", "cat": "✓", "ran": "✓", "A": "·", "dog": "·", "big": "·", "sat": "·"}


def test_the_chips_lay_the_path_first_and_siblings_below() -> None:
    """Rule: the top row is what the round kept, the accepted path (A, dog) then the verifier's own token at the
    next position; each other candidate at a context on the path starts a dashed row below, in its position's
    column (The at 1, big at 2, sat at 3), what hangs under it to its right (cat, ran under The)."""
    html = views.inspect_round(session(run([step()])), 1, "fsd", 1, 0.5, 0.5, 1)[0]
    cells = re.findall(r'<div class="([a-z ]+)" style="grid-row:(\d+);grid-column:(\d+);.*?>([A-Za-z]+)</span>', html)
    where = {w: (cls, int(r), int(c)) for cls, r, c, w in cells}
    assert set(where) == {"The", "A", "cat", "dog", "big", "sat", "ran", "ate"}, "every token in one cell"
    assert {w: where[w] for w in ("A", "dog", "ate")} == {
        "A": ("line", 2, 1),
        "dog": ("line", 2, 2),
        "ate": ("line own", 2, 3),
    }
    assert [where[w][::2] for w in ("The", "big", "sat")] == [("sibling", 1), ("sibling", 2), ("sibling", 3)]
    assert where["cat"] == ("below", where["The"][1], 2) and where["ran"] == ("below", where["The"][1], 3)
    assert 2 < where["The"][1] < where["big"][1] < where["sat"][1]  # a row each, in the path's order


def test_the_position_slider_is_a_depth_along_the_path_with_the_siblings_named() -> None:
    """Rule: position 2 is dog (the path's second token), its sibling big named; its top-5 are read at dog's
    context, A's (T2, D2), not a child's nor node 2's; the slider runs to the deepest pass's last position."""
    s = session(run([step()]))
    out = views.inspect_round(s, 1, "fsd", 1, 0.5, 0.5, 2)
    fig = out[2]
    title = fig.layout.title.text
    assert "position 2: 'dog' (accepted)" in title and "'big' (discarded)" in title
    assert top1s(fig) == {"draft": "1. 'D2'", "target": "1. 'T2'"}
    at3 = views.inspect_round(s, 1, "fsd", 1, 0.5, 0.5, 3)[2]
    assert "position 3: 'sat' (rejected)" in at3.layout.title.text and "target's own: 'ate'" in at3.layout.title.text
    assert top1s(at3) == {"draft": "1. 'D4'", "target": "1. 'T4'"}
    assert views._pos_slider(s.races[0].results["fsd"])["maximum"] == 3


def test_a_pyramid_blocks_draft_top5_follow_the_stage1_path() -> None:
    """Rule: the block's position d shows the draft's distribution at the stage-1 tree's path context, not the
    d-th node in breadth-first order; past a path that ended at a leaf the draft proposed nothing there."""
    q_toks = [
        TokenRec(1, "draft", "rejected", div=0.6, tau=0.5, top5=top(0)),
        TokenRec(2, "draft", "accepted", div=0.6, tau=0.5, top5=top(0)),
        TokenRec(3, "draft", "discarded", div=0.1, tau=0.5, top5=top(1)),
        TokenRec(4, "draft", "accepted", div=0.2, tau=0.5, top5=top(2)),
        TokenRec(6, "qualifier", "bonus", top5={"qualifier": [[106, 0.5]]}),
    ]
    q = StageRound("qualifier", "draft", "qualifier", "fuzzy+sd", q_toks, 2, sd_fallback=True, parents=[-1, -1, 0, 1])
    block = [
        TokenRec(
            t,
            "qualifier",
            "accepted",
            div=0.1,
            tau=0.5,
            top5={"target": [[110 + i, 0.5]], "qualifier": [[120 + i, 0.5]]},
        )
        for i, t in enumerate([2, 4, 6])
    ]
    t = StageRound(
        "target",
        "qualifier",
        "target",
        "fuzzy",
        block + [TokenRec(9, "target", "bonus", top5={"target": [[113, 0.5]]})],
        3,
    )
    st = Step(0, [q], t, [2, 4, 6, 9], ["draft", "draft", "qualifier", "bonus"], 0.0, 0.1)
    for d, want in ((1, 200), (2, 202)):
        assert inspector.position_top5(st, d)["draft"][0][0] == want, f"position {d}"
    assert "draft" not in inspector.position_top5(st, 3)  # the qualifier's own token: no draft proposal there
    texts = TEXTS | {110 + i: f"X{i}" for i in range(4)} | {120 + i: f"Q{i}" for i in range(4)}
    r = run([st], "psd_f")
    fig = views.inspect_round(session(r, "psd_f", texts), 1, "psd_f", 1, 0.5, 0.5, 2)[2]
    assert top1s(fig) == {"draft": "1. 'D2'", "qualifier": "1. 'Q1'", "target": "1. 'X1'"}


def test_the_text_names_the_shape_from_the_parent_list() -> None:
    """Rule: a tree round is told as a path of k from a tree of n candidates (its depth), a round whose parent
    list is a chain as a chain, wherever the parent list came from."""
    md = views.inspect_round(session(run([step()])), 1, "fsd", 1, 0.5, 0.5, 1)[3]
    assert "kept **2** (a path) of a tree of 7 candidates, depth 3" in md
    chain = StageRound(
        "target",
        "draft",
        "target",
        "sd",
        [
            TokenRec(1, "draft", "accepted"),
            TokenRec(2, "draft", "rejected"),
            TokenRec(3, "draft", "discarded"),
            TokenRec(8, "target", "resampled"),
        ],
        1,
        exact=True,
        parents=[-1, 0, 1],
    )
    fig = tree_view.tree_figure(Step(0, [], chain, [1, 8], ["draft", "target"], 0.0, 0.1), TEXTS)
    assert "a chain of 3" in fig.layout.annotations[0].text
    md = views.inspect_round(session(run([Step(0, [], chain, [1, 8], [], 0.0, 0.1)])), 1, "fsd", 1, 0.5, 0.5, 1)[3]
    assert "kept **1 of 3** proposed tokens" in md


# --- the divergence chart --------------------------------------------------------------------------------------


def test_the_divergence_bars_follow_the_path_at_each_positions_context() -> None:
    """Rule: one bar per position (A, dog, sat), its height the Div at that position's context (its parent's:
    0.6 at the root, 0.2 after A, 0.9 after dog), coloured by its fate at τ; the siblings named on hover."""
    from pyramid_demo.app import charts
    from pyramid_demo.app.render import STATUS_COLOURS

    fig = charts.divergence_figure(step(), 0.5, 0.1, TEXTS)
    bars = fig.data[-1]
    assert list(bars.x) == ["1 'A'", "2 'dog'", "3 'sat'"]
    assert list(bars.y) == [0.6, 0.2, 0.9]
    assert list(bars.marker.color) == [STATUS_COLOURS[s][1] for s in ("accepted", "rejected", "discarded")]
    assert "'The' (rejected)" in bars.hovertext[0] and "'big' (rejected)" in bars.hovertext[1]


# --- statistics: positions are depths ------------------------------------------------------------------------


def test_statistics_count_depths_not_node_indices() -> None:
    """Rule: a tree of 7 nodes and depth 3 whose path is 2 offers 3 positions: per-position acceptance [1, 1, 0]
    (it proposed at every depth and its path reached 2), acceptance 2 ÷ 3 (not 2 ÷ 7), its pass in the
    histogram's bin 2 of bins 0..3 (the deepest proposal); a last pass that proposed nothing falls in bin 0."""
    last = StageRound("target", "draft", "target", "fuzzy", [TokenRec(5, "target", "bonus")], 0)
    s = compute_stats("fsd", [step(), Step(1, [], last, [5], ["target"], 0.1, 0.2)], 0.0, "max_new_tokens")
    assert s.per_position_acceptance["target"] == [1.0, 1.0, 0.0]
    assert s.acceptance["target"] == pytest.approx(2 / 3, abs=1e-4)
    assert s.proposed["target"] == 7 and s.accepted["target"] == 2
    assert s.accepted_hist == [1, 0, 1, 0]


def test_the_histogram_places_a_tree_run_by_its_records_not_its_key() -> None:
    """Rule: a run whose rounds are trees is drawn hatched in the row below its method's chain, whatever its
    key says; its bars are shares of passes at k accepted (bin 2: the pass with a path of 2)."""
    chain = run(
        [
            Step(
                0,
                [],
                StageRound(
                    "target",
                    "draft",
                    "target",
                    "fuzzy",
                    [
                        TokenRec(1, "draft", "accepted"),
                        TokenRec(2, "draft", "rejected"),
                        TokenRec(8, "target", "resampled"),
                    ],
                    1,
                ),
                [1, 8],
                [],
                0.0,
                0.1,
            )
        ],
        "sd",
    )
    tree = run([step()], "fsd")
    where = pass_hist.panels({"sd": chain, "fsd": tree})
    assert where == {"sd": (1, 1), "fsd": (2, 2)}
    fig = pass_hist.accepted_figure({"sd": chain, "fsd": tree})
    bar = next(tr for tr in fig.data if tr.name.startswith("FSD"))
    assert bar.marker.pattern.shape == pass_hist.TREE_PATTERN
    assert list(bar.x) == [0, 1, 2] and list(bar.y) == [0.0, 0.0, 1.0]


def test_the_story_tells_a_tree_runs_acceptance_over_positions() -> None:
    """Rule: the passes table says which runs proposed trees and gives their acceptance over positions."""
    md = story.passes_markdown({"fsd": run([step()])})
    row = next(line for line in md.splitlines() if line.startswith("| FSD |"))
    assert "67%" in row and "tree" in row


# --- exports ----------------------------------------------------------------------------------------------------


def test_the_export_carries_each_rounds_parent_list_and_accepted_path(tmp_path) -> None:
    """Rule: the exported trace gives every round its parent list (a chain's too) and its accepted path."""
    from pyramid_demo.app import handlers

    chain = StageRound(
        "target",
        "draft",
        "target",
        "sd",
        [TokenRec(1, "draft", "accepted"), TokenRec(8, "target", "bonus")],
        1,
        exact=True,
    )
    r = run([step(), Step(1, [], chain, [1, 8], [], 0.1, 0.2)])
    held = session(r)  # the export's folder is the session's: it lives as long as the session
    jpath, _, _ = handlers.export_files(held)
    rounds = [s["target_round"] for s in json.loads(open(jpath).read())[0]["results"]["fsd"]["steps"]]
    assert [(x.get("parents"), x.get("accepted_path")) for x in rounds] == [(PARENTS, [1, 3]), ([-1], [0])]
