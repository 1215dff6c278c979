"""Trees of candidates: the acceptance rules on hand-built logits, the joint law at T=1, tree passes in the exactness
record, compaction of the accepted path, and tree rows in the feature draft."""

import pytest
import torch
from helpers import check, peaked
from mock_lm import BigramLM, bigram_table
from test_engine import joint_two_tokens  # the chain tests' joint law of the first two tokens

from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.rules import Tree, best_nodes, chain, decide_tree, depths
from pyramid_demo.core.run import generate
from pyramid_demo.forward.cache import CacheError
from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.weights import weights
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
NEG = -30.0
V = 6


def _z(*hot: int, scale: float = 10.0) -> torch.Tensor:
    """Logits [V] peaked on `hot` (the first highest)."""
    return peaked(*hot, vocab=V, scale=scale)


def _tree() -> Tree:
    """root → {1 (rank 0), 2 (rank 1)}; node 0 (token 1) → {3}; node 1 (token 2) → {4}."""
    zq = torch.stack([_z(1, 2), _z(3), _z(4)])  # contexts root, node 0, node 1
    return Tree([1, 2, 3, 4], [-1, -1, 0, 1], zq, [0, 1, 2, -1, -1])


def test_a_chain_is_a_tree_with_parent_i_minus_1():
    """chain(): node i's parent is i − 1 and context i's proposer row is row i."""
    t = chain([5, 6, 7], torch.zeros(3, V))
    assert t.parents == [-1, 0, 1] and depths(t.parents) == [1, 2, 3] and t.q_row == [0, 1, 2, -1]
    check(t)


def test_breadth_first_order_is_required():
    """A node shallower than the one before it is refused (rows are laid out by depth)."""
    with pytest.raises(ValueError, match="breadth-first"):
        check(Tree([1, 2, 3], [-1, 0, -1], torch.zeros(1, V), [0, -1, -1, -1]))


def test_best_nodes_keep_the_best_scores_and_their_ancestors():
    """EAGLE-2's reranking: the n best path scores, never a node without its parent, breadth-first."""
    parents = [-1, -1, 0, 0, 1, 2]
    score = [-0.1, -2.0, -0.3, -0.5, -2.1, -0.4]
    assert best_nodes(parents, score, 4) == [0, 2, 3, 5]
    assert best_nodes(parents, score, 2) == [0, 2]


def test_greedy_walks_the_child_equal_to_the_verifier_argmax():
    """Greedy: at the root the verifier wants token 2 (the second-ranked child): it is accepted and the
    first child rejected; below it the verifier wants 5, not the proposed 4, so the walk stops there and
    the verifier's own token is 5 (resampled). Node 0's subtree is never reached."""
    z_p = torch.stack([_z(2), _z(0), _z(5), _z(0), _z(0)])  # contexts root, n0, n1, n2, n3
    dec = decide_tree(z_p, _tree(), "sd", None, "none", (0.0, 0, 1.0), None)
    assert dec.path == [1] and dec.nxt == 5
    assert dec.status == ["rejected", "accepted", "discarded", "rejected"]


def test_greedy_bonus_after_a_leaf():
    """Greedy: a path that ends at a leaf takes the verifier's argmax there as the bonus."""
    z_p = torch.stack([_z(1), _z(3), _z(0), _z(4), _z(0)])
    dec = decide_tree(z_p, _tree(), "sd", None, "none", (0.0, 0, 1.0), None)
    assert dec.path == [0, 2] and dec.nxt == 4 and dec.status[:3] == ["accepted", "discarded", "accepted"]


def test_fuzzy_passing_context_takes_its_top_ranked_child():
    """Fuzzy (CHOICE): a context whose Div(P_verifier, P_proposer) ≤ τ accepts its top-ranked child even
    where the verifier's argmax is another child; τ = 0 accepts nothing."""
    tree = _tree()
    z_p = torch.stack([_z(2, 1, scale=3.0), _z(3), _z(4), _z(0), _z(0)])  # root: p close to q, argmax 2
    loose = decide_tree(z_p, tree, "fuzzy", 5.0, "none", (0.0, 0, 1.0), None)
    assert loose.path[0] == 0 and loose.d is not None and float(loose.d[0]) <= 5.0
    none = decide_tree(z_p, tree, "fuzzy", 0.0, "none", (0.0, 0, 1.0), None)
    assert none.path == [] and none.status[:2] == ["rejected", "rejected"] and none.nxt == 2


def test_fuzzy_with_sd_fallback_tries_the_other_children():
    """Fuzzy + SD fallback: a context failing τ still accepts a child that passes the SD rule (greedy: the
    child equal to the verifier's argmax)."""
    z_p = torch.stack([_z(2), _z(0), _z(4), _z(0), _z(0)])
    dec = decide_tree(z_p, _tree(), "fuzzy", 1e-6, "sd", (0.0, 0, 1.0), None)
    assert dec.path[:1] == [1] and dec.status[0] == "rejected"


@pytest.mark.parametrize(
    "method,kw",
    [
        ("sd", {"tree_nodes": 5, "tree_depth": 2, "tree_k": 2}),
        pytest.param(
            "psd_a",
            {"stage2": "sd", "tree_nodes": 4, "tree_depth": 2, "tree_k": 2, "l_d": 2, "l_q": 3},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sampled_tree_sd_reproduces_the_target_joint_law(method, kw):
    """Tree SD at T=1 (and the lossless pyramid over a tree) sample the target's law: over 4,000 runs the
    first two tokens are within TV 0.05 of p_T(a|0)·p_T(b|a), the chain's bound (tests/test_engine.py)."""
    emp, exp = joint_two_tokens(method, 4000, shape="tree", **kw)
    assert 0.5 * (emp - exp).abs().sum().item() < 0.05


@pytest.mark.slow  # many sampled runs (the slow tier, which CI runs)
def test_a_tree_of_top_k_children_is_not_exact(monkeypatch):
    """Control: multi-step speculative sampling is lossless over children drawn from the draft; the same trees
    grown from the draft's top-k (deterministic children, as at T=0) put the first two tokens off the target's
    law by more than the bound above."""
    from pyramid_demo.core import round as round_

    real = round_.grow
    monkeypatch.setattr(
        round_, "grow", lambda cur, seq, nodes, depth, k, cfg, gen: real(cur, seq, nodes, depth, k, cfg, None)
    )
    emp, exp = joint_two_tokens("sd", 3000, shape="tree", tree_nodes=5, tree_depth=2, tree_k=2)
    assert 0.5 * (emp - exp).abs().sum().item() > 0.05


@pytest.mark.slow  # many sampled runs (the slow tier, which CI runs)
def test_fuzzy_tree_sampling_is_not_exact():
    """Control: FSD over a tree with a loose τ is measurably off the target's law."""
    emp, exp = joint_two_tokens("fsd", 3000, shape="tree", tau_t=5.0, tree_nodes=5, tree_depth=2, tree_k=2)
    assert 0.5 * (emp - exp).abs().sum().item() > 0.05


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_triplet(seed=0)


@pytest.mark.parametrize("method", ["sd", "psd_a"])
def test_tree_sd_greedy_equals_target_greedy_and_accepts(tiny, method):
    """At T=0 tree SD (and the lossless pyramid over a tree) write AR's text token for token, with more
    than one token per target pass."""
    cfg = dict(max_new_tokens=40, stage2="sd")
    ar = generate(tiny, "The quick brown fox", DecodeConfig(method="ar", **cfg))
    tr = generate(tiny, "The quick brown fox", DecodeConfig(method=method, shape="tree", **cfg))
    assert tr.config["shape"] == "tree" and all(s.target_round.parents for s in tr.steps if method == "sd")
    assert tr.token_ids == ar.token_ids
    assert tr.stats.tokens_per_target_pass > 1.0


def test_keep_path_moves_the_accepted_rows_and_refuses_a_non_path(tiny):
    """After keep_path only the accepted path is cached, moved in place: the next pass gives the logits of a cache
    fed the committed tokens as a chain (to float rounding), not those of the rows left where the tree put them (the
    tiny target's large weights make a misplaced key show); rows that are not a path from the cache's end are
    refused."""
    model = tiny.target

    def make():
        return CoreLM(weights(model), tiny.vocab_size, "t", capacity=8)

    ids = [(i * 37 + 5) % 290 + 3 for i in range(80)]
    lm = make()
    lm.feed(ids[:30], 1)
    lm.forward([7, 8, 9, 10], 30, parents=[-1, 0, 0, 2])
    with pytest.raises(CacheError):
        lm.keep_path([0, 1, 3])
    lm.forward([7, 8, 9, 10], 30, parents=[-1, 0, 0, 2])
    assert lm.keep_path([0, 2, 3]) == 33 and lm.ids[30:] == [7, 9, 10]
    ref, other = make(), make()
    ref.feed(ids[:30] + [7, 9, 10], 1)
    other.feed(ids[:30] + [7, 8, 9], 1)  # the rows left in place without the move
    got = lm.feed(lm.ids + [42], 1)
    assert (got - ref.feed(ref.ids + [42], 1)).abs().max() < 1e-4
    assert (got - other.feed(other.ids + [42], 1)).abs().max() > 1e-2


def test_keep_along_keeps_the_fed_rows_that_spell_the_sequence():
    """Rule: after a tree forward a cache keeps the pending rows that spell the sequence past its end, along
    parents (a sibling with the same token elsewhere is not on the path), and stops at the first token no row
    holds (an accepted leaf was never fed)."""
    lm = BigramLM(bigram_table(V, 1), "draft")
    lm.feed([0, 1], 1)
    lm.forward([3, 4], 2, parents=[-1, -1])  # two roots' children
    lm.forward([4, 5], 2, parents=[0, 1])  # below 3: 4; below 4: 5
    assert lm.keep_along([0, 1, 3, 4, 2]) == 4 and lm.ids == [0, 1, 3, 4] and not lm.pending


def test_a_tree_round_leaves_its_accepted_path_in_both_caches():
    """Rule: after a tree round the accepted path stays in the verifier's cache and, where the proposer fed its
    nodes, in the proposer's (moved in place, never fed again): after each step the target caches every committed
    token but the last, the draft all but at most the last accepted node (a leaf it never fed) too."""
    table = bigram_table(8, 2, 4.0)  # the draft is the target: every round accepts a whole path
    lms = {r: BigramLM(table, r) for r in roles_for("sd")}
    cfg = DecodeConfig(method="sd", shape="tree", max_new_tokens=20, tree_nodes=6, tree_depth=3, tree_k=2)
    seq, longest = [0], 0
    for step in decode(lms, seq, cfg, (), None):
        seq += step.new_tokens
        longest = max(longest, step.target_round.n_accepted)
        assert lms["target"].ids == seq[:-1], f"the verifier lost its accepted path at pass {step.index}"
        assert lms["draft"].ids == seq[: len(lms["draft"].ids)] and len(lms["draft"].ids) >= len(seq) - 2, (
            f"the draft lost the accepted nodes it fed at pass {step.index}"
        )
    assert longest == 3  # the premise: whole paths accepted, so a lost path shows


def test_tree_rows_read_their_parents_state_in_the_feature_draft():
    """The feature draft's tree rows: a row below another reads its parent's predicted state and attends to
    its own ancestors only, so each node's logits equal a chain fed along its path (to float rounding),
    whatever its siblings are."""
    from pyramid_demo.forward.feature_lm import FeatureLM
    from pyramid_demo.models.feature_draft import FeatureDraft

    t = tiny_random_triplet(seed=0)
    fd = FeatureDraft(t.target, torch.arange(t.vocab_size)).eval()
    base = [5, 6, 7, 8]
    tree_lm = FeatureLM(fd, t.vocab_size, "draft")
    tree_lm.feed(base, 1)
    z1 = tree_lm.forward([20, 21], 4, parents=[-1, -1])  # two siblings at position 4
    z2 = tree_lm.forward([30, 31], 4, parents=[1, 0])  # a child below each, crossed
    for tok1, row1, tok2, row2 in ((21, 1, 30, 0), (20, 0, 31, 1)):
        ref = FeatureLM(fd, t.vocab_size, "draft")
        want1 = ref.feed(base + [tok1], 1)[0]
        want2 = ref.feed(base + [tok1, tok2], 1)[0]
        assert torch.allclose(z1[row1], want1, atol=1e-4)
        assert torch.allclose(z2[row2], want2, atol=1e-4)


class _TreeRowsOff(BigramLM):
    """The bigram mock whose tree rows come out one fp32 ulp up (as a kernel picked by a tree's mask might): its
    chain passes are its steps bitwise, its tree passes are not."""

    def _run_tree(self, rows, base, pos):
        z = super()._run_tree(rows, base, pos)
        return torch.nextafter(z, torch.full_like(z, float("inf")))


def test_the_record_checks_tree_passes_and_keeps_them_apart():
    """The exactness record checks tree passes too (`checks.PASS_CHECKS`), tallied under "trees" apart from the
    chain's: a forward whose trees are exact is said so; one whose trees are one ulp off keeps its chain exact and
    its trees not."""
    from pyramid_demo.models import checks

    table = bigram_table(300, 7, 3.0)
    plan = ((100, (2, 5, 17, 43)), (60, (2, 5)))
    rec = checks.check_model(lambda ids: BigramLM(table), 300, plan)
    assert rec["trees"] is not None and rec["trees"]["passes"] == 4 and rec["trees"]["exact"], rec["trees"]
    assert rec["exact"] and rec["passes"] == 6
    assert "tree passes exact" in checks.describe_trees(rec)
    off = checks.check_model(lambda ids: _TreeRowsOff(table), 300, plan)
    assert off["exact"] and off["passes"] == 6, "a tree pass changed the chain's record"
    assert off["trees"]["passes"] == 4 and not off["trees"]["exact"] and off["trees"]["top1"]
    assert "not bitwise exact" in checks.describe_trees(off)


@pytest.mark.parametrize("fallback", ["none", "sd"])
def test_the_inspectors_what_if_walks_a_tree_as_the_engine_did(tiny, fallback):
    """The what-if τ over a fuzzy tree round, at the τ the run used, gives back the engine's own accepted path
    (a node's children share its divergence; a passing node takes its top-ranked child); a looser τ never
    accepts less, and τ = 0 accepts only what the SD fallback took."""
    from pyramid_demo.app.inspector import reevaluate, whatif_statuses

    cfg = DecodeConfig(
        method="fsd",
        shape="tree",
        max_new_tokens=24,
        tau_t=0.6,
        fallback=fallback,
        tree_nodes=6,
        tree_depth=3,
        tree_k=2,
    )
    r = generate(tiny, "The quick brown fox", cfg)
    rounds = [s.target_round for s in r.steps if s.target_round is not None and s.target_round.parents]
    assert rounds
    for rnd in rounds:
        assert reevaluate(rnd, 0.6) == rnd.n_accepted
        assert whatif_statuses(rnd, 0.6).count("accepted") == rnd.n_accepted
        assert reevaluate(rnd, 50.0) >= rnd.n_accepted
        if fallback == "none":
            assert reevaluate(rnd, 0.0) == 0
