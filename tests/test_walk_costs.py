"""Acceptance read per context a walk reached, for chains and trees alike, and the formulas a tree run gets.

Every right answer below is written by hand from the hand-built round it reads."""

from __future__ import annotations

import threading

import pytest

from pyramid_demo.core.methods import METHODS
from pyramid_demo.core.trace import RunResult, StageRound, Stats, Step, TokenRec
from pyramid_demo.predict import costs, throughput
from pyramid_demo.predict.walk_stats import alpha, counts, rank_counts, rejected, stage_counts


def _tree(
    statuses: list[str], parents: list[int], own: str = "resampled", stage: str = "target", rule: str = "greedy"
) -> StageRound:
    """A tree round: one proposed token per status (breadth-first, `parents`), then the verifier's own."""
    toks = [TokenRec(10 + i, "draft", s) for i, s in enumerate(statuses)] + [TokenRec(99, stage, own)]
    return StageRound(
        stage, "draft", stage, rule, toks, statuses.count("accepted"), exact=rule != "fuzzy", parents=parents
    )


def _chain(statuses: list[str], own: str) -> StageRound:
    toks = [TokenRec(10 + i, "draft", s) for i, s in enumerate(statuses)] + [TokenRec(99, "target", own)]
    return StageRound("target", "draft", "target", "greedy", toks, statuses.count("accepted"), exact=True)


def _within(seconds: float, f, *args):
    """f(*args) run in a thread: a walk that loops forever fails this assertion instead of hanging the suite."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(f(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"{f.__name__} did not return within {seconds} s: its walk loops"
    return out[0]


# the root offers nodes 0 (rank 0) and 1 (rank 1); node 1 offers 2 and 3; node 3 offers 4 and 5
PARENTS = [-1, -1, 1, 1, 3, 3]


def test_a_refused_sibling_on_the_way_down_is_no_rejection():
    """Greedy: the root's rank-0 child was tried and refused, its rank-1 child taken, then node 3 (rank 1) and
    node 4 (rank 0), a leaf: the verifier's token is a bonus. Three contexts reached, three taken: α = 1, not
    3/4 (the old reading counted the refused siblings' round as a rejection)."""
    r = _tree(["rejected", "accepted", "rejected", "accepted", "accepted", "discarded"], PARENTS, own="bonus")
    assert not rejected(r)
    assert alpha(counts([r])) == 1.0
    assert stage_counts([Step(0, [], r, [], [], 0, 0)])["target"]["rejected"] == 0


def test_a_walk_that_stops_where_candidates_were_offered_is_one_rejection():
    """The walk takes node 1, then refuses both of node 1's children: one rejection, however many siblings."""
    r = _tree(["discarded", "accepted", "rejected", "rejected", "discarded", "discarded"], PARENTS)
    assert rejected(r) and alpha(counts([r])) == 0.5


def test_a_round_cut_short_is_censored_not_rejected():
    """A PSD block cut after the first accepted token (the own token discarded): the rejection past the cut
    was never used, so the round is no rejection; a chain's alike."""
    cut = _chain(["accepted", "discarded", "rejected", "discarded"], own="discarded")
    assert not rejected(cut) and alpha(counts([cut])) == 1.0
    plain = _chain(["accepted", "accepted", "rejected", "discarded"], own="resampled")
    assert rejected(plain) and alpha(counts([plain])) == pytest.approx(2 / 3, abs=1e-4)


def test_rank_counts_below_the_root():
    """Ranks are counted at every context the walk stood on, not only the root's: the root's hit is rank 1,
    node 1's hit rank 1, node 3's rank 0. A slip in how the walk moves down (a child's index for its
    context, the root's children read at every level) changes these counts, or loops: within 5 s."""
    r = _tree(["rejected", "accepted", "rejected", "accepted", "accepted", "discarded"], PARENTS, own="bonus")
    hits, reach = _within(5.0, rank_counts, [r])
    assert (hits, reach) == ([1, 2], [3, 3])
    stopped = _tree(["discarded", "accepted", "rejected", "rejected", "discarded", "discarded"], PARENTS)
    assert _within(5.0, rank_counts, [stopped]) == ([0, 1], [2, 2])  # node 1's context: a miss at both ranks


def test_a_pass_is_counted_whether_or_not_it_has_a_target_round():
    """AR steps have no target round; the budget's last SD step proposes nothing. Every step is one target
    pass: the forwards and the prediction count each of them."""
    prof = {"ms": {"target": {"1": 10.0, "2": 12.0}, "draft": {"1": 1.0}}}
    ar = [Step(i, [], None, [1], ["target"], 0, 0, {}, {"target": 1}, {"target": [1]}) for i in range(3)]
    assert costs.forward_counts(ar) == {"target": {1: 3}}
    assert costs.predict_run(ar, prof)["time_s"] == pytest.approx(3 * 10.0 / 1000)
    empty = Step(3, [], _chain([], own="target"), [1], ["target"], 0, 0, {}, {"target": 1}, {"target": [1]})
    full = Step(
        4,
        [],
        _chain(["accepted"], own="bonus"),
        [1, 2],
        ["draft", "bonus"],
        0,
        0,
        {},
        {"draft": 1, "target": 1},
        {"draft": [1], "target": [2]},
    )
    assert costs.forward_counts([full, empty]) == {"target": {2: 1, 1: 1}, "draft": {1: 1}}
    assert costs.predict_run([full, empty], prof)["time_s"] == pytest.approx((1.0 + 12.0 + 10.0) / 1000)


def _run(method: str, cfg: dict, accepted: dict, rounds: dict, proposed: dict, acceptance: dict) -> RunResult:
    stats = Stats(
        method,
        20,
        0.0,
        1.0,
        20.0,
        10,
        acceptance,
        proposed,
        accepted,
        1.0,
        2.0,
        [],
        {},
        {},
        {},
        0.0,
        "max_new_tokens",
        rounds,
    )
    return RunResult(method, cfg, [], "", [], [], [], [], "", stats, [])


SPEEDS = {"draft": 100.0, "qualifier": 40.0, "target": 10.0}
# a method over a tree: its key and `shape` "tree" in the run's config (the key alone, where the table still
# has the retired *_tree rows: then the shape setting agrees with it)
TREE_KEY = {m: f"{m}_tree" if f"{m}_tree" in METHODS else m for m in ("sd", "psd_f")}


@pytest.mark.parametrize("gamma", [2, 8])
def test_the_papers_formula_for_a_tree_reads_its_levels_and_its_path_not_gamma(gamma):
    """SD over a tree of 3 levels that committed 30 tokens in 10 rounds (2 drafted + the target's own per
    round): V = 3 / (3/V_D + 1/V_T), whatever γ says (a tree run never reads it)."""
    cfg = {"gamma": gamma, "tree_nodes": 8, "tree_depth": 3, "tree_k": 2, "shape": "tree"}
    r = _run(TREE_KEY["sd"], cfg, {"target": 20}, {"target": 10}, {"target": 80}, {"target": 20 / 80})
    assert throughput.predict(r, SPEEDS) == pytest.approx(3 / (3 / 100 + 1 / 10))


def test_the_papers_formula_for_a_pyramid_over_a_tree():
    """Stage 1: a tree of 2 levels that committed 2.5 tokens per qualifier round; stage 2: the paper's chain of
    ℓ_Q 6 at β_TQ 0.5. Stage 1 is E_Q / (levels/V_D + 1/V_Q), not ℓ_D = the node count."""
    cfg = {"l_d": 4, "l_q": 6, "tree_nodes": 8, "tree_depth": 2, "tree_k": 2, "shape": "tree"}
    r = _run(
        TREE_KEY["psd_f"],
        cfg,
        {"qualifier": 15, "target": 30},
        {"qualifier": 10, "target": 10},
        {"qualifier": 80, "target": 60},
        {"qualifier": 15 / 80, "target": 0.5},
    )
    inner = 2.5 / (2 / 100 + 1 / 40)
    assert throughput.predict(r, SPEEDS) == pytest.approx(throughput.stage_speed(0.5, 6, inner, 10.0))


def test_a_pyramid_over_a_tree_is_priced_as_its_tree():
    """A 2-node tree of one level (two siblings) that the qualifier always takes one of (ranks 0.5 and 0.5):
    a round commits 2 tokens, exactly a block of ℓ_Q 2, for the draft's one step and a 3-row qualifier pass;
    then a 3-row target pass commits 3 at α_T 1. The chain formula with ℓ_D = the node count (2 draft steps,
    α from refused siblings) is another number."""
    prof = {"ms": {"draft": {"1": 1.0, "2": 1.5}, "qualifier": {"1": 4.0, "3": 5.0}, "target": {"1": 10.0, "3": 11.0}}}
    counts = {
        "qualifier": {
            "accepted": 10,
            "rejected": 0,
            "proposed": 20,
            "rounds": 10,
            "rank_hits": [5, 5],
            "rank_reach": [10, 10],
        },
        "target": {"accepted": 20, "rejected": 0, "proposed": 20, "rounds": 10},
    }
    cfg = {"l_d": 2, "l_q": 2, "tree_nodes": 2, "tree_depth": 1, "tree_k": 2, "shape": "tree"}
    m = costs.model_from_counts(TREE_KEY["psd_f"], counts, cfg, prof)
    assert m["alpha"] == 1.0 and m["lengths"]["l_d"] == 2
    assert m["expected_tokens_per_s"] == pytest.approx(1000 * 3 / (1.0 + 5.0 + 11.0), rel=1e-3)
    assert m["expected_speedup_vs_ar"] == pytest.approx(3 / (1.0 + 5.0 + 11.0) * 10.0, rel=1e-3)


def test_the_shape_is_the_runs_setting_first_then_the_methods_row():
    from pyramid_demo.predict.expected import shape_of

    assert shape_of({"shape": "tree"}) == "tree" and shape_of({"shape": "chain"}) == "chain"
    assert shape_of({}) == "chain" and shape_of(None) == "chain"
    assert shape_of({"shape": "auto"}) == "chain"  # not a shape a run ends up with: the row decides
