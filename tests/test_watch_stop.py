"""Which proposal a confidence stop (`conf_stop`) ends, and where, through the engine on hand-built bigram logits:
the models follow the cycle 0 → 1 → … → 7 → 0, sure of each next token except where a row is made unsure (the
same top token at probability 0.4). A stop keeps the unsure token and nothing after it; the records say which
round it cut and which block it ended. No real model runs."""

from __future__ import annotations

import math

import pytest
import torch
from mock_lm import BigramLM, as_run

from pyramid_demo.app import playback
from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig

V = 8
FLOOR = 0.5
UNSURE = 0.4  # the unsure rows' top probability: below FLOOR


def table(unsure: tuple[int, ...] = ()) -> torch.Tensor:
    """Logits [V, V]: after token t the next is t + 1 (mod V), surely, or at probability UNSURE after a t in
    `unsure` (the rest spread evenly)."""
    z = torch.zeros(V, V)
    for t in range(V):
        nxt = (t + 1) % V
        if t in unsure:
            z[t] = math.log((1 - UNSURE) / (V - 1))
            z[t, nxt] = math.log(UNSURE)
        else:
            z[t, nxt] = 20.0
    return z


def first_pass(method: str, unsure: dict[str, tuple[int, ...]], **kw):
    """The first target pass after the prompt [0] (greedy) and the pass's beats, with the given unsure rows."""
    cfg = DecodeConfig(method=method, conf_stop=FLOOR, max_new_tokens=24, **kw)
    lms = {r: BigramLM(table(unsure.get(r, ())), r) for r in roles_for(method)}
    prefill(lms, [0])
    s = next(iter(decode(lms, [0], as_run(cfg), (), None)))
    return s, playback.beats(s, lambda t: f" t{t}")


def proposed(rnd) -> list[int]:
    return [t.token_id for t in rnd.tokens[:-1]]


@pytest.mark.parametrize("unsure_after, n", [(0, 1), (2, 3), (3, 4)])
def test_sd_proposes_up_to_the_first_unsure_token_and_no_further(unsure_after, n) -> None:
    """Rule: with γ = 6 the draft stops right after the first token it drafted below the floor (the token t + 1
    after an unsure row t): it proposes tokens 1 … t + 1, runs one forward per token it proposed and no more, and
    the target's round records exactly those tokens (here all accepted) and its bonus."""
    s, _ = first_pass("sd", {"draft": (unsure_after,)}, gamma=6)
    t = s.target_round
    assert proposed(t) == list(range(1, n + 1)), f"the draft proposed {proposed(t)}"
    assert s.n_forward["draft"] == n and s.fed["draft"] == [1] * n
    assert t.n_accepted == n and t.tokens[-1].status == "bonus" and s.new_tokens == list(range(1, n + 2))


def test_a_pyramid_block_ends_after_the_qualifiers_unsure_token() -> None:
    """Rule: in PSD_A (ℓ_D 2, ℓ_Q 6) the qualifier is unsure only after token 3: stage 1's first round qualifies
    1, 2 and its bonus 3 in full; the second round's first token 4 is the unsure one, so the block ends there —
    that round records 4 accepted and the rest (5, its own 6) not used, no third round runs, the target checks the
    block 1 … 4, and the player says the block is complete after 4."""
    s, beats = first_pass("psd_a", {"qualifier": (3,)}, stage2="sd", l_d=2, l_q=6)
    q = s.qualifier_rounds
    assert len(q) == 2, f"{len(q)} stage-1 rounds: the block did not end at the unsure token"
    assert [(proposed(r), r.n_accepted, r.tokens[-1].status) for r in q] == [
        ([1, 2], 2, "bonus"),
        ([4, 5], 1, "discarded"),
    ]
    assert [t.status for t in q[1].tokens] == ["accepted", "discarded", "discarded"]
    assert proposed(s.target_round) == [1, 2, 3, 4] and s.new_tokens == [1, 2, 3, 4, 5]
    assert s.origins == ["draft", "draft", "qualifier", "draft", "bonus"]
    said = [b.sentence for b in beats if b.round == 1]
    assert said[-1] == "the block is complete after ‘ t4’, so the rest of this round is not used"


def test_a_sure_qualifier_fills_the_block_to_its_size() -> None:
    """Rule: without an unsure row the same pyramid fills its block to ℓ_Q = 6 (rounds of 3, 3): the stop above is
    the floor's doing, not the block size's."""
    s, _ = first_pass("psd_a", {}, stage2="sd", l_d=2, l_q=6)
    assert [proposed(r) for r in s.qualifier_rounds] == [[1, 2], [4, 5]]
    assert proposed(s.target_round) == [1, 2, 3, 4, 5, 6]
