"""Three round rules on hand-built logits: greedy growth expands the best frontier nodes at every level, a fuzzy
walk reads each context's own verifier row off the first-child spine too, and a round yields its accepted path
plus exactly one verifier token (a bonus at a leaf, resampled at a rejection)."""

import math

import pytest
import torch
from helpers import peaked
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.round import decide_round, grow, record
from pyramid_demo.core.rules import Tree, chain, decide_tree
from pyramid_demo.core.trace import accepted_path, parents_of

pytestmark = pytest.mark.usefixtures("one_thread")
V = 6


def _z(*hot: int, scale: float = 10.0) -> torch.Tensor:
    """Logits [V] peaked on `hot` (the first highest)."""
    return peaked(*hot, vocab=V, scale=scale)


def _levels(tree: Tree) -> dict[int, list[tuple[int, int]]]:
    """Per depth: (parent, token) of each node, in node order."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, d in enumerate(rules.depths(tree.parents)):
        out.setdefault(d, []).append((tree.parents[i], tree.tokens[i]))
    return out


# --------------------------------------------------------------------------------------------------- growth
def test_tree_growth_expands_best_frontier_nodes_each_level():
    """Rule (EAGLE-2 at T=0): at every level the k frontier nodes with the best path products are expanded."""
    vocab = 12
    probs = torch.full((vocab, vocab), 1.0 / vocab)
    draft = {
        0: {1: 0.5, 2: 0.3},  # the root (token 0)
        1: {3: 0.6, 4: 0.2},
        2: {5: 0.5, 6: 0.3},  # level 1
        3: {7: 0.7, 8: 0.2},
        4: {9: 0.6, 10: 0.3},
        5: {11: 0.6, 7: 0.3},
        6: {8: 0.6, 9: 0.3},
    }  # level 2
    for row, pairs in draft.items():
        probs[row] = (1 - sum(pairs.values())) / (vocab - len(pairs))  # the rest spread thin: rows sum to 1
        for t, pr in pairs.items():
            probs[row, t] = pr
    lm = BigramLM(probs.log(), "draft")
    # level 2's candidates by path product: 1→3 .30 (node 2), 2→5 .15 (node 4), 1→4 .10 (node 3), 2→6 .09
    # (node 5); the best two, nodes 2 and 4, grow; nodes 3 and 5 (the worst two) stay leaves
    tree = grow(lm, [0], 10, 3, 2, DecodeConfig(), None)  # nodes 10: every candidate kept
    lv = _levels(tree)
    assert lv[1] == [(-1, 1), (-1, 2)], f"level 1 must be the root's top-2 children, got {lv[1]}"
    assert lv[2] == [(0, 3), (0, 4), (1, 5), (1, 6)], f"level 2 must grow both level-1 nodes, got {lv[2]}"
    assert lv[3] == [(2, 7), (2, 8), (4, 11), (4, 7)], (
        f"growth must expand the k best frontier nodes by path product (nodes 2: 1→3 and 4: 2→5) at level 2; "
        f"level 3 grew (parent, token) {lv[3]}"
    )
    assert tree.q_row == [0, 1, 2, 3, -1, 4, -1, -1, -1, -1, -1], "a context's draft row is misplaced"
    assert [round(math.exp(s), 4) for s in tree.score] == [0.5, 0.3, 0.3, 0.1, 0.15, 0.09, 0.21, 0.06, 0.09, 0.045]


# ------------------------------------------------------------------------------------------------ fuzzy walk
def _fuzzy_tree() -> tuple[Tree, torch.Tensor]:
    """root → n0 (token 1, the draft's first choice), n1 (token 2); n0 → n2 (3); n1 → n3 (4), n4 (5); n2 → n5 (0);
    n3 → n6 (3). The first-child spine is contexts 0, 1, 3, 6; the walk goes through n1, off it.

    Verifier rows: at the root far from the draft (fails τ) with argmax 2 (the SD fallback takes n1); at n1's
    context (2) close to the draft's mild row there (passes τ: n3, the first child) although its argmax is 5; at
    n3's context (4) far (fails τ), argmax 0 ≠ n6's 3: rejected, the verifier's own token 0."""
    mild_q = torch.zeros(V)
    mild_q[4], mild_q[5] = 3.0, 2.9
    mild_p = torch.zeros(V)
    mild_p[4], mild_p[5] = 2.9, 3.0
    z_q = torch.stack([_z(1, 2), _z(3), mild_q, _z(0), _z(3)])  # rows of contexts 0, 1, 2, 3, 4
    tree = Tree([1, 2, 3, 4, 5, 0, 3], [-1, -1, 0, 1, 1, 2, 3], z_q, [0, 1, 2, 3, 4, -1, -1, -1])
    z_p = torch.stack([_z(2), _z(0), mild_p, _z(3), _z(0), torch.zeros(V), torch.zeros(V), torch.zeros(V)])
    return tree, z_p


def _div(z_p: torch.Tensor, z_q: torch.Tensor) -> float:
    """JS divergence of the raw distributions, from rules.divergence on their softmaxes (the walk's own batched
    log-domain path not reused)."""
    return float(rules.divergence(torch.softmax(z_p, -1)[None], torch.softmax(z_q, -1)[None], "js")[0])


def test_fuzzy_walk_reads_each_contexts_own_verifier_row_off_the_spine():
    """Rule: a fuzzy walk tests Div(z_p[c], z_q[row(c)]) at every context c it stands at, on or off the spine."""
    tree, z_p = _fuzzy_tree()
    tau = 0.05
    want = {c: _div(z_p[c], tree.z_q[tree.q_row[c]]) for c in range(tree.n + 1) if tree.q_row[c] >= 0}
    # the hand-built rows decide as the docstring says, and a neighbouring row would decide otherwise
    assert want[0] > tau and want[2] <= tau and want[4] > tau
    assert _div(z_p[1], tree.z_q[2]) > tau and _div(z_p[3], tree.z_q[4]) <= tau
    dec = decide_tree(z_p, tree, "fuzzy", tau, "sd", (0.0, 0, 1.0), None)
    assert dec.d is not None
    got = dec.d.tolist()
    for c, v in enumerate(got):
        if not math.isnan(v):
            assert v == pytest.approx(want[c], rel=1e-5, abs=1e-7), (
                f"Div at context {c} must be Div(z_p[{c}], z_q[q_row[{c}] = {tree.q_row[c]}]) = {want[c]:.6g} "
                f"(the verifier's row of context {c} itself), got {v:.6g}"
            )
    for c in (0, 2, 4):  # the contexts the walk stands at: the root, then n1's and n3's (both off the spine)
        assert not math.isnan(got[c]), f"the walk stood at context {c} but recorded no divergence there"
    assert dec.path == [1, 3] and dec.nxt == 0, (
        f"the walk must take n1 (SD fallback at the root), then n3 (Div ≤ τ at context 2), then refuse n6 and "
        f"emit 0; got path {dec.path}, own token {dec.nxt}"
    )
    assert dec.status == ["rejected", "accepted", "discarded", "accepted", "discarded", "discarded", "rejected"]
    assert not dec.leaf


# ------------------------------------------------------------------------------------------- accepted path + 1
def _argmax_rows(*tops: int) -> torch.Tensor:
    """Verifier/proposer logits [len(tops), V] with argmax tops[c] at row c."""
    return torch.stack([_z(t) for t in tops])


_TREE = ([1, 2, 4, 5], [-1, -1, 0, 1])  # root → n0 (1), n1 (2); n0 → n2 (4); n1 → n3 (5)
_TREE_Q = _argmax_rows(1, 4, 5)  # draft rows at contexts 0, 1, 2
CASES = {  # name: tree, verifier argmax per context, accepted path, own token, its status
    "chain fully accepted": (chain([1, 2, 3], _argmax_rows(1, 2, 3)), (1, 2, 3, 4), [0, 1, 2], 4, "bonus"),
    "chain rejected": (chain([1, 2, 3], _argmax_rows(1, 2, 3)), (1, 5, 3, 4), [0], 5, "resampled"),
    "tree ending at a leaf": (Tree(*_TREE, _TREE_Q, [0, 1, 2, -1, -1]), (2, 4, 5, 0, 3), [1, 3], 3, "bonus"),
    "tree rejected": (Tree(*_TREE, _TREE_Q, [0, 1, 2, -1, -1]), (1, 0, 5, 0, 3), [0], 0, "resampled"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_round_yields_its_accepted_path_plus_exactly_one_verifier_token(case):
    """Rule: k accepted tokens give k + 1 new ones, the verifier's own last: a bonus at a leaf, else resampled."""
    tree, tops, path, nxt, own = CASES[case]
    rnd = decide_round(_argmax_rows(*tops), tree, "sd", None, DecodeConfig(), None, "draft", "target")
    assert rnd.dec.path == path and rnd.dec.nxt == nxt, f"{case}: the walk took {rnd.dec.path} then {rnd.dec.nxt}"
    new = rnd.new_tokens()
    want = [tree.tokens[i] for i in path] + [nxt]
    assert new == want, (
        f"{case}: a round yields its accepted path then exactly one verifier token "
        f"({len(path)} accepted → {len(path) + 1} new {want}), got {new}"
    )
    assert rnd.own_status == own, f"{case}: the verifier's own token must be {own}, got {rnd.own_status}"
    origins = ["draft"] * rnd.k + [rnd.own_origin]
    assert origins == ["draft"] * len(path) + ["bonus" if own == "bonus" else "target"], (
        f"{case}: origins {origins} do not match the new tokens (a target bonus is 'bonus', else 'target')"
    )
    rec = record(rnd, DecodeConfig())
    assert rec.n_accepted == len(path) and [rec.tokens[i].token_id for i in accepted_path(rec)] == new[:-1]
    assert (rec.tokens[-1].token_id, rec.tokens[-1].status) == (nxt, own), (
        f"{case}: the record's last entry must be the own token {nxt} ({own}), got "
        f"{rec.tokens[-1].token_id} ({rec.tokens[-1].status})"
    )


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("same", [True, False], ids=["draft is target", "other draft"])
def test_every_decoded_step_commits_its_accepted_path_plus_one_token(shape, same):
    """Rule: each target pass commits its accepted path plus one verifier token, origins and statuses aligned."""
    tables = {"target": bigram_table(V, 1), "draft": bigram_table(V, 1 if same else 3)}
    lms = {r: BigramLM(t, r) for r, t in tables.items()}
    cfg = DecodeConfig(method="sd", shape=shape, gamma=3, tree_nodes=6, tree_depth=3, tree_k=2, max_new_tokens=16)
    own_seen = set()
    for step in decode(lms, [0], cfg, (), None):
        rec = step.target_round
        k, path, parents = rec.n_accepted, accepted_path(rec), parents_of(rec)
        assert len(step.new_tokens) == k + 1, (
            f"step {step.index}: {k} accepted must commit {k + 1} tokens (the verifier's own last), "
            f"got {step.new_tokens}"
        )
        assert step.new_tokens == [rec.tokens[i].token_id for i in path] + [rec.tokens[-1].token_id]
        leaf = not any(p == (path[-1] if path else -1) for p in parents)
        own = "bonus" if leaf else "resampled"
        assert rec.tokens[-1].status == own, f"step {step.index}: own token {rec.tokens[-1].status}, not {own}"
        assert step.origins == ["draft"] * k + ["bonus" if leaf else "target"], (
            f"step {step.index}: origins {step.origins} misaligned with {k} accepted + one {own} token"
        )
        own_seen.add(own if k else own + "@0")
    if same:  # every walk follows the draft's argmax to a leaf
        assert "bonus" in own_seen and not {"resampled", "resampled@0"} & own_seen
    else:
        assert own_seen & {"resampled", "resampled@0"}
