"""What a tree should buy: acceptance by rank read off tree records, the expected tree, the best budget."""

import pytest

from pyramid_demo.core.trace import StageRound, TokenRec
from pyramid_demo.predict.expected import ar_speed, best_tree, round_speed
from pyramid_demo.predict.walk_stats import rank_counts

A = (0.41, 0.17, 0.06, 0.04)  # rank marginals: how often the target's token is the draft's 1st, 2nd, 3rd, 4th


def _round(statuses: list[str], parents: list[int]) -> StageRound:
    toks = [TokenRec(i, "draft", s) for i, s in enumerate(statuses)] + [TokenRec(99, "target", "resampled")]
    return StageRound("target", "draft", "target", "greedy", toks, statuses.count("accepted"), parents=parents)


def test_rank_counts_follow_the_walk():
    """A reached context counts once for every rank it offers; the accepted child's rank is a hit. Here the root
    offers ranks 0–2 and the verifier takes rank 1; below it ranks 0–1 are offered and refused."""
    r = _round(["rejected", "accepted", "discarded", "discarded", "rejected", "rejected"], [-1, -1, -1, 0, 1, 1])
    hits, reach = rank_counts([r])
    assert hits == [0, 1, 0] and reach == [2, 2, 1]


def test_the_expected_tree_reproduces_sequoias_figures():
    """On these rank marginals the expected EAGLE-2 tree commits 2.06 tokens per pass with 8 nodes and
    2.25 with 15, against 1.69 for the best chain."""

    def per_pass(n, d, k):
        return round_speed({"ms": {"draft": {1: 1.0}, "target": {1: 1.0}}}, d, A, tree=(n, d, k))["tokens_per_pass"]

    assert per_pass(8, 5, 4) == pytest.approx(2.06, abs=0.01)
    assert per_pass(15, 5, 4) == pytest.approx(2.25, abs=0.01)
    assert max(per_pass(g, g, 1) for g in range(1, 9)) == pytest.approx(1.69, abs=0.01)


def test_the_best_budget_follows_the_cost_of_a_pass():
    """Where a 17-row pass costs what a step does, the best tree is large; where each row costs as much as a step
    (a pass of n rows = n steps), trees cannot pay and the best budget is small."""
    flat = {"ms": {"target": {1: 10.0, 5: 10.0, 9: 10.0, 17: 10.5}, "draft": {1: 0.5, 4: 0.6}}}
    steep = {"ms": {"target": {1: 10.0, 5: 50.0, 9: 90.0, 17: 170.0}, "draft": {1: 0.5, 4: 0.6}}}
    assert best_tree(flat, list(A))["tree_nodes"] >= 12
    assert best_tree(steep, list(A))["tree_nodes"] <= 4
    fast = round_speed(flat, 5, list(A), tree=(16, 5, 4))
    assert fast["tokens_per_s"] > ar_speed(flat) * 1.5
