"""One pass of rows (`CachedModel.forward`): a chain given with its parents is a feed's pass held pending, a kept
chain is a length move, a kept tree path one gather, and the engine scores chains and trees alike."""

import pytest
import torch

from pyramid_demo.core.engine import stage_round
from pyramid_demo.core.methods import DecodeConfig, method_spec
from pyramid_demo.core.rules import Tree
from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.weights import weights
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")

CTX = [5, 9, 14, 3, 27, 8]
ROWS = [41, 12, 6]


def _lm() -> CoreLM:
    t = tiny_random_triplet(seed=0)
    lm = CoreLM(weights(t.target), t.vocab_size, "target")
    lm.feed(CTX, 1)
    return lm


def _compactions(lm: CoreLM) -> list[list[int]]:
    calls: list[list[int]] = []
    real = lm._compact
    lm._compact = lambda pos, slots: calls.append(list(slots)) or real(pos, slots)  # type: ignore[method-assign]
    return calls


def test_a_chain_with_parents_is_a_feed_held_pending_and_kept_by_a_length_move():
    """Rows whose parents form a chain from the cache's end give a feed's logits, stay out of the cache until
    kept, and keeping a prefix of them moves no keys or values (a length move)."""
    fed, rows = _lm(), _lm()
    want = fed.forward(ROWS, len(CTX))
    got = rows.forward(ROWS, len(CTX), parents=[-1, 0, 1])
    assert torch.equal(got, want)
    assert rows.ids == CTX and len(rows.pending) == 3, "pending rows joined the cache before a path was kept"
    moved = _compactions(rows)
    assert rows.keep_path([0, 1]) == len(CTX) + 2
    assert moved == [], "a chain's path was gathered, not kept where it was written"
    assert rows.ids == CTX + ROWS[:2]
    n = len(rows.ids)
    assert all(torch.equal(a[:, :n], b[:, :n]) for a, b in zip(rows.kv, fed.kv, strict=True))


def test_a_tree_path_is_kept_by_one_gather():
    """A path that skips a sibling moves its rows' keys and values next to the cache, once."""
    lm = _lm()
    lm.forward(ROWS, len(CTX), parents=[-1, -1, 1])  # two roots; the second has a child
    moved = _compactions(lm)
    lm.keep_path([1, 2])
    assert moved == [[len(CTX) + 1, len(CTX) + 2]]
    assert lm.ids == CTX + ROWS[1:]


@pytest.mark.parametrize("parents,q_row", [([-1, 0, 1], [0, 1, 2, -1]), ([-1, 0, 0], [0, 1, -1, -1])])
def test_a_round_scores_a_chain_and_a_tree_in_one_pass_of_rows(parents, q_row):
    """The verifier scores a proposal, chain or tree, in one forward of rows under their parents (the root, its
    last committed token, first), and keeps the accepted path only."""
    t = tiny_random_triplet(seed=0)
    lms = {r: t.open(r) for r in ("draft", "target")}
    seq = [5, 9, 14, 3]
    for lm in lms.values():
        lm.feed(seq[:-1], 1)
    calls: list[list[int] | None] = []
    real = lms["target"].forward

    def forward(tokens, pos, keep=None, parents=None):
        calls.append(parents)
        return real(tokens, pos, keep, parents)

    lms["target"].forward = forward
    tree = Tree([1, 2, 3], parents, torch.zeros(max(q_row) + 1, t.vocab_size), q_row, [0.0, -1.0, -2.0])
    rnd = stage_round(lms, seq, method_spec("sd").stages[-1], tree, DecodeConfig(method="sd"), None)
    assert calls == [[-1] + [p + 1 for p in parents]], "the proposal was not scored in one pass of rows"
    assert lms["target"].ids == seq + rnd.accepted and not lms["target"].pending


@pytest.mark.parametrize("parents,kept", [([-1, 0, 1], [0, 1]), ([-1, -1, 1], [1, 2])])
def test_a_kept_path_publishes_its_own_rows_states(parents, kept):
    """A verifier that hands its states to a proposer publishes, for a kept path, the states of exactly those rows
    (a chain's prefix and a tree's path alike), as a feed of the same tokens would: what the draft reads next."""
    from pyramid_demo.forward.cache import VerifierStates

    lm, ref = _lm(), _lm()
    for m in (lm, ref):
        m.publish = VerifierStates()
        m.publish.write(0, torch.zeros(len(CTX), m.w.embed.shape[1]))  # the context's states (not compared)
    lm.forward(ROWS, len(CTX), parents=parents)
    lm.keep_path(kept)
    ref.forward([ROWS[i] for i in kept], len(CTX))
    n = len(CTX) + len(kept)
    assert lm.publish.n == ref.publish.n == n
    assert torch.allclose(lm.publish.f[len(CTX) : n], ref.publish.f[len(CTX) : n], atol=1e-5)
