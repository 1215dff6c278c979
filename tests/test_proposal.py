"""One proposal type: a chain is the tree with parent i − 1, decided by one walk, recorded by one recorder.

Each rule is checked on hand-built logits, and each planted slip fails by an assertion naming the rule."""

import pytest
import torch
from helpers import decide, leading_run, next_token, sd_passes
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode, pyramid_block, roles_for
from pyramid_demo.core.methods import DecodeConfig, method_spec
from pyramid_demo.core.round import decide_round, grow, record
from pyramid_demo.core.rules import Tree, decide_tree

pytestmark = pytest.mark.usefixtures("one_thread")


def _root_law(p: torch.Tensor, q: torch.Tensor, m: int, rule, n: int = 10000) -> torch.Tensor:
    """The first committed token's law at a root whose m children are drawn from q without replacement."""
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(len(p))
    z_q = q.log()[None]
    for _ in range(n):
        kids = torch.multinomial(q, m, replacement=False, generator=gen).tolist()
        tree = Tree(kids, [-1] * m, z_q, [0] + [-1] * m)
        z_p = torch.cat([p.log()[None], torch.zeros(m, len(p))])  # [m + 1, V]
        path, nxt = rule(z_p, tree, gen)
        counts[tree.tokens[path[0]] if path else nxt] += 1
    return counts / n


def _right(z_p, tree, gen):
    dec = decide_tree(z_p, tree, "sd", None, "none", (1.0, 0, 1.0), gen)
    return dec.path, dec.nxt


def _q_kept_whole(z_p, tree, gen):
    """A planted slip: the residual is taken, but the refused child stays in q (as if drawn with replacement)."""
    p, q = torch.softmax(z_p[0], -1), torch.softmax(tree.z_q[0], -1)
    r = torch.rand(tree.n, generator=gen)
    for i, t in enumerate(tree.tokens):
        if float(r[i]) * float(q[t]) < float(p[t]):
            return [i], t
        p = rules.residual(p, q)
    return [], rules.sample(p, gen)


def _no_residual(z_p, tree, gen):
    """A planted slip: the refused child is zeroed in p (the deterministic-children rule), no residual."""
    p, q = torch.softmax(z_p[0], -1), torch.softmax(tree.z_q[0], -1)
    r = torch.rand(tree.n, generator=gen)
    for i, t in enumerate(tree.tokens):
        if float(r[i]) * float(q[t]) < float(p[t]):
            return [i], t
        p = p.clone()
        p[t] = 0.0
        p = p / p.sum()
    return [], rules.sample(p, gen)


@pytest.mark.slow  # many sampled runs (the slow tier, which CI runs)
def test_multi_step_sampling_over_sampled_children_reproduces_the_verifier():
    """Rule (SpecInfer's multi-step speculative sampling, children drawn without replacement): child c_i passes
    with min(1, p_i/q_i); a refusal takes p_{i+1} = norm(max(0, p_i − q_i)) and removes c_i from q. The first
    token then follows p within TV 0.025 over 10,000 draws (seeded), for 1 and 3 children (sampling noise is
    about 0.01); keeping the refused child in q, or zeroing it in p without the residual, is off by more than
    0.03."""
    p = torch.tensor([0.05, 0.45, 0.3, 0.15, 0.05])
    q = torch.tensor([0.4, 0.1, 0.3, 0.1, 0.1])
    for m in (1, 3):
        got = _root_law(p, q, m, _right)
        assert 0.5 * (got - p).abs().sum() < 0.025, f"multi-step sampling with {m} children is off p: {got}"
    for slip in (_q_kept_whole, _no_residual):
        bad = _root_law(p, q, 3, slip)
        assert 0.5 * (bad - p).abs().sum() > 0.03, f"the control {slip.__name__} was not caught"


def test_one_child_is_sds_ratio_test_and_residual():
    """Rule: with one child the walk is SD's rule exactly: the same acceptance and the same token, draw for draw,
    as the ratio test r < p(x)/q(x) with the residual norm(max(0, p − q)) at a refusal."""
    g = torch.Generator().manual_seed(0)
    z_p, z_q = torch.randn(4, 7, generator=g), torch.randn(3, 7, generator=g)
    x = [2, 5, 1]
    cfg = DecodeConfig(method="sd", temperature=1.0)
    for seed in range(200):
        rnd = decide(z_p, z_q, x, "sd", None, cfg, torch.Generator().manual_seed(seed), "draft", "target")
        gen = torch.Generator().manual_seed(seed)
        r = torch.rand(3, generator=gen)
        p, q = rules.warp(z_p, 1.0), rules.warp(z_q, 1.0)
        k = leading_run(sd_passes(p[:3], q, x, r))
        nxt = next_token(p[k], q[k] if k < 3 else None, gen)
        assert (rnd.k, rnd.dec.nxt) == (k, nxt), f"seed {seed}: the walk on a chain is not SD's rule"


def _bigram_lms(method: str) -> dict:
    tables = {"target": bigram_table(6, 1), "qualifier": bigram_table(6, 2), "draft": bigram_table(6, 3)}
    return {r: BigramLM(tables[r], r) for r in roles_for(method)}


@pytest.mark.parametrize("method", ["sd", "fsd", "psd_a", "psd_f"])
def test_every_round_is_a_tree_and_a_chain_never_takes_a_tree_pass(method, monkeypatch):
    """Rule: every StageRound carries its parent list (a chain's [−1, 0, 1, …]); a chain is drafted and scored by
    a chain pass (`_run`, a feed's), never a tree pass (the tree mask and gathered layout are for trees only)."""
    calls = []
    monkeypatch.setattr(BigramLM, "_run_tree", lambda self, *a: calls.append(self.role))
    cfg = DecodeConfig(method=method, shape="chain", gamma=3, l_d=2, l_q=4, max_new_tokens=12)
    for step in decode(_bigram_lms(method), [0], cfg, (), None):
        for rnd in step.qualifier_rounds + [step.target_round]:
            assert rnd.parents == list(range(-1, len(rnd.tokens) - 2)), "a chain's record has no parent list"
    assert calls == [], f"a chain paid for tree passes ({calls})"


def test_an_empty_proposals_token_is_a_bonus_in_status_and_origin():
    """Rule, decided in one place (`Round.own_status`): the verifier's token after an empty proposal (the
    budget's last token) or a fully accepted one is a bonus, and its origin says "bonus" too."""
    lms = _bigram_lms("sd")
    lms["draft"].table = lms["target"].table  # a draft that is the target: every proposal is accepted
    cfg = DecodeConfig(method="sd", shape="chain", gamma=3, max_new_tokens=5)  # 4 + 1: the last pass proposes nothing
    steps = list(decode(lms, [0], cfg, (), None))
    last = steps[-1].target_round
    assert len(last.tokens) == 1 and last.tokens[0].status == "bonus" and steps[-1].origins == ["bonus"]
    for s in steps:
        assert (s.origins[-1] == "bonus") == (s.target_round.tokens[-1].status == "bonus")


def test_the_sd_fallbacks_verdicts_are_recorded_on_every_node():
    """Rule: under fuzzy + SD fallback the record stores the SD rule's verdict on each proposed token
    (`TokenRec.sd_passed`), where the rule ran and, off the clock, where it did not; a fuzzy rule alone stores
    none. Greedy: True exactly where the token is the verifier's argmax."""
    V = 5
    z_p = torch.full((4, V), -5.0)
    for c, t in enumerate([1, 3, 0, 2]):
        z_p[c, t] = 5.0  # the verifier's argmax per context
    z_q = torch.zeros(3, V)
    for c, t in enumerate([1, 4, 0]):
        z_q[c, t] = 5.0
    x = [1, 4, 0]  # node 0 is the argmax, node 1 is not, node 2 (never reached by the walk) would be
    fb = DecodeConfig(method="fsd", fallback="sd", tau_t=1e-9)
    rec = record(decide(z_p, z_q, x, "fuzzy", 1e-9, fb, None, "draft", "target"), fb)
    assert [t.sd_passed for t in rec.tokens[:-1]] == [True, False, True]
    assert [t.status for t in rec.tokens[:-1]] == ["accepted", "rejected", "discarded"]
    alone = DecodeConfig(method="fsd", tau_t=1e-9)
    rec = record(decide(z_p, z_q, x, "fuzzy", 1e-9, alone, None, "draft", "target"), alone)
    assert [t.sd_passed for t in rec.tokens[:-1]] == [None, None, None]


def test_a_pyramids_tree_is_as_deep_as_tree_depth_not_l_d():
    """Finding: stage 1's tree was silently cut to ℓ_D levels. Now a qualifier round's tree grows tree_depth
    levels (capped only by the block's room), whatever ℓ_D is."""
    lms = _bigram_lms("psd_a")
    cfg = DecodeConfig(method="psd_a", shape="tree", l_d=1, l_q=8, tree_nodes=12, tree_depth=4, tree_k=2)
    _, _, _, rounds = pyramid_block(lms, [0], method_spec(cfg.method).stages[0], 8, cfg, None)
    assert max(max(rules.depths(r.tree.parents)) for r in rounds) == 4, "stage 1's tree depth was capped by l_d"


def test_a_tree_round_decides_along_its_parents_not_its_index_order():
    """Rule: the walk follows the parent list: the verifier's argmax at the root is node 1's token (the second
    child), below node 1 it is node 3's, so the path is [1, 3], node 0 rejected and node 2 never reached; the
    own token is read at node 3's context (a leaf: a bonus)."""
    V = 6
    z_q = torch.full((3, V), -9.0)  # rows: root, node 0, node 1; the draft's argmax 1, 4, 5 there
    for row, t in enumerate([1, 4, 5]):
        z_q[row, t] = 9.0
    tree = Tree([1, 2, 4, 5], [-1, -1, 0, 1], z_q, [0, 1, 2, -1, -1])
    z_p = torch.full((5, V), -9.0)
    for c, t in enumerate([2, 4, 5, 0, 3]):
        z_p[c, t] = 9.0
    rnd = decide_round(z_p, tree, "sd", None, DecodeConfig(), None, "draft", "target")
    rec = record(rnd, DecodeConfig())
    assert rnd.dec.path == [1, 3] and rnd.dec.nxt == 3 and rnd.own_status == "bonus"
    assert [t.status for t in rec.tokens] == ["rejected", "accepted", "discarded", "accepted", "bonus"]
    assert rec.parents == [-1, -1, 0, 1] and rec.n_accepted == 2
    # each node is read at its parent's context (the verifier's row parent + 1, the proposer's q_row there), not
    # at its own: p is 1 where the token is the verifier's argmax there, q where it is the draft's
    assert [t.p for t in rec.tokens[:-1]] == [0.0, 1.0, 1.0, 1.0], "a node's p was read at the wrong context"
    assert [t.q for t in rec.tokens[:-1]] == [1.0, 0.0, 1.0, 1.0], "a node's q was read from the wrong row"
    assert [t.top5["target"][0][0] for t in rec.tokens] == [2, 2, 4, 5, 3]
    assert [t.top5["draft"][0][0] for t in rec.tokens[:-1]] == [1, 1, 4, 5]


def test_a_cut_at_an_eos_drops_only_the_nodes_below_it():
    """Rule: a round cut at an EOS on its accepted path leaves out the nodes below the EOS (never usable) and
    keeps the other branches, re-indexing the parent list."""
    V = 6
    tree = Tree([1, 2, 4, 5], [-1, -1, 0, 1], torch.zeros(3, V), [0, 1, 2, -1, -1])
    z_p = torch.full((5, V), -9.0)
    for c, t in enumerate([2, 4, 5, 0, 3]):
        z_p[c, t] = 9.0
    rnd = decide_round(z_p, tree, "sd", None, DecodeConfig(), None, "draft", "target").cut(1, eos=True)
    rec = record(rnd, DecodeConfig())
    assert [t.token_id for t in rec.tokens[:-1]] == [1, 2, 4] and rec.parents == [-1, -1, 0]
    assert [t.status for t in rec.tokens] == ["rejected", "accepted", "discarded", "discarded"]
    assert rec.n_accepted == 1


def test_sampled_growth_draws_distinct_children_from_the_warped_draft():
    """Rule: above temperature 0 a tree's children are drawn from the draft's warped q without replacement, in a
    shape fixed before the draws (the lossless rule needs both): distinct siblings, every drawn token possible
    under q (top-k 2 leaves two)."""
    lm = BigramLM(bigram_table(6, 3), "draft")
    cfg = DecodeConfig(method="sd", shape="tree", temperature=1.0, top_k=2, tree_nodes=6, tree_depth=3, tree_k=2)
    for seed in range(20):
        lm.truncate(0)
        tree = grow(lm, [0, 1], 6, 3, 2, cfg, torch.Generator().manual_seed(seed))
        kids = rules.children(tree.parents)
        for c, ch in enumerate(kids):
            toks = [tree.tokens[i] for i in ch]
            assert len(set(toks)) == len(toks), "siblings drawn twice"
            if ch:
                allowed = set(torch.topk(tree.z_q[tree.q_row[c]], 2).indices.tolist())
                assert set(toks) <= allowed, "a child outside the warped draft's support"


def test_greedy_growth_expands_the_best_paths_by_their_product():
    """Rule (EAGLE-2 at T=0): each expanded node's top-k are candidates scored by the product of the draft's
    probabilities along their path; the k best are expanded; the `nodes` best kept. Hand-built: after 0 the draft
    says 1 (.5), 2 (.3); after 1: 3 (.55), 4 (.2); after 2: 5 (.45), 3 (.4). Paths: 1 .5, 2 .3, 1→3 .275,
    2→5 .135, 2→3 .12, 1→4 .1, so 4 nodes are [1, 2, 1→3, 2→5]; ranking by a node's own probability instead
    would keep 1→4 and drop both grandchildren that pay."""
    V = 6
    probs = torch.full((V, V), 1e-4)
    for row, pairs in {0: {1: 0.5, 2: 0.3}, 1: {3: 0.55, 4: 0.2}, 2: {5: 0.45, 3: 0.4}}.items():
        for t, pr in pairs.items():
            probs[row, t] = pr
    lm = BigramLM(probs.log(), "draft")
    tree = grow(lm, [0], 4, 2, 2, DecodeConfig(), None)
    assert tree.tokens == [1, 2, 3, 5] and tree.parents == [-1, -1, 0, 1]
    assert tree.q_row == [0, 1, 2, -1, -1]  # the draft's row at the root, then at each expanded node
    assert torch.equal(tree.z_q[1], lm.table[1]) and torch.equal(tree.z_q[2], lm.table[2])
