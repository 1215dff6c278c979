"""Rules a plausible wrong version would break: each test names its rule and fails by an assertion.

Covered elsewhere: the random stream drawn under every rule (test_decide), a bonus token's origin and the
verifier's own EOS (test_records). Here: what the feature draft reads and how it runs its rows, where the
target's states may be written, the qualifier's logits at stage 2, and the pyramid's predicted speed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import connect, decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.forward.cache import CacheError, VerifierStates
from pyramid_demo.forward.feature_lm import FeatureLM
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_random_triplet
from pyramid_demo.predict import expected, throughput

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reader():
    """The tiny family with an untrained feature draft (it reads the target; most of its drafts are refused)."""
    t = tiny_random_triplet(seed=0)
    return dataclasses.replace(t, draft=FeatureDraft(t.target, torch.arange(t.vocab_size)))


def true_states(target: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The target's final normed state at every position of ids [n, d], from one uncached forward."""
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


# --- the draft reads the target's states of the committed tokens, never of rejected ones ------------------


def test_the_draft_never_reads_a_rejected_tokens_state(reader, monkeypatch):
    """After a rejection the target's states past the accepted prefix are dropped: every state the feature
    draft reads (for a row at position p, the target's state at p-1 where the target has scored it) is the
    target's state of the draft's own tokens up to p-1. Kept states of rejected tokens would not be."""
    t = reader
    real = FeatureLM._chain_rows

    def spy(self, toks, start):
        seq = self.ids[:start] + toks.tolist()
        a, b = max(start - 1, 0), min(start - 1 + toks.shape[0], self.states.n)
        if b > a:
            want = true_states(t.target, seq[:b])[a:b]
            assert torch.allclose(self.states.f[a:b], want, atol=1e-4), (
                f"the draft read states at {a}…{b - 1} that are not those of its tokens (a rejected token's?)"
            )
        return real(self, toks, start)

    monkeypatch.setattr(FeatureLM, "_chain_rows", spy)
    lms = {r: open_lm(t.model(r), t.vocab_size, r) for r in roles_for("sd")}
    ids = [5, 9, 2, 7]
    prefill(lms, ids)
    steps = list(decode(lms, ids, DecodeConfig(method="sd", shape="chain", gamma=4, max_new_tokens=30), (), None))
    assert any(s.target_round.n_accepted < len(s.target_round.tokens) - 1 for s in steps), "no rejection: vacuous"


def test_rows_whose_input_state_is_not_known_wait_for_the_row_before(reader):
    """A feed of several rows past the target's known states runs each such row after the one before it (its
    input is the state that row predicts): the logits equal one-row feeds. One chunk would read predictions
    not yet made."""
    t = reader
    ids = [5, 9, 2, 7, 3, 11, 4, 8, 6]
    n = 4  # the target has scored positions 0 … n-1

    def opened() -> FeatureLM:
        target, draft = open_lm(t.target, t.vocab_size, "target"), open_lm(t.draft, t.vocab_size, "draft")
        connect({"target": target, "draft": draft})
        target.forward(ids[:n], 0, 1)
        draft.forward(ids[:2], 0, 1)
        return draft

    chunk = opened().forward(ids[2:], 2, len(ids) - 2)  # rows 2 … 8: rows n+1 … 8 read predicted states
    one = opened()
    rows = torch.cat([one.forward([tok], pos, 1) for pos, tok in enumerate(ids[2:], 2)])
    fin = torch.isfinite(rows)
    assert torch.equal(fin, torch.isfinite(chunk))
    assert torch.allclose(chunk[fin], rows[fin], atol=1e-4), (  # fp32 rounding of a grouped-query call: ~3e-5
        f"a row read a predicted state not computed yet (max diff {float((chunk[fin] - rows[fin]).abs().max()):.3g})"
    )


# --- the target's states ------------------------------------------------------------------------------


def test_target_states_are_never_written_past_the_known_end():
    """A target pass writes its states from a position it has scored up to (it may overwrite its tail);
    a write past the known end would leave positions no forward computed, so it raises."""
    states = VerifierStates()
    states.write(0, torch.ones(3, 4))
    states.write(2, torch.ones(2, 4))  # overwrites the tail: fine
    assert states.n == 4
    with pytest.raises(CacheError, match="only 4 are known"):
        states.write(5, torch.ones(1, 4))
    assert states.n == 4, "a refused write changed what is known"


# --- stage 2 reads the qualifier's distribution at every block position -----------------------------------


@pytest.mark.parametrize("method,conf", [("psd_f", 0.0), ("psd_a", 0.0), ("psd_f", 0.4)])
def test_stage_2_compares_the_target_and_the_qualifier_at_the_same_position(method, conf):
    """Stage 2 tests Div(P_T,i, P_Q,i): the qualifier's distribution at block position i, the one it had when
    it qualified that token. With bigram models both are rows of their tables for the token before i."""
    V = 7
    tables = {r: bigram_table(V, s, 2.0) for r, s in (("draft", 31), ("qualifier", 32), ("target", 33))}
    cfg = DecodeConfig(method=method, tau_t=0.5, tau_q=0.5, l_d=2, l_q=5, conf_stop=conf, max_new_tokens=40)
    lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
    seq = [0]
    checked = 0
    for step in decode(lms, seq, as_run(cfg), (), None):
        block = [tok.token_id for tok in step.target_round.tokens[:-1]]
        for i, tok in enumerate(step.target_round.tokens[:-1]):
            prev = (seq + block)[len(seq) - 1 + i]
            p, q = (torch.softmax(tables[r][prev][None], -1) for r in ("target", "qualifier"))
            want = float(rules.divergence(p, q, "js")[0])
            assert tok.div == pytest.approx(want, abs=1e-5), f"block position {i}: Div not against P_Q there"
            checked += 1
        seq += step.new_tokens
    assert checked > 10


# --- the pyramid's predicted speed counts every stage-1 round of a block ---------------------------------

PROFILE = {
    "ms": {
        "draft": {"1": 1.0},
        "qualifier": {str(k): 2.0 for k in range(1, 10)},
        "target": {str(k): 10.0 for k in range(1, 10)},
    }
}


def test_the_predicted_block_pays_for_every_stage_1_round():
    """A block of ℓ_Q qualified tokens pays for every stage-1 round it takes: at α_Q = 0 each round yields
    one token, so ℓ_D 2, ℓ_Q 6 is 5 rounds of (2 drafts + a qualifier pass) = 20 ms and, with one token left, a
    last round that drafts one (3 ms), as the engine does; then a 10 ms target pass for one token (α_T 0); at
    α_Q = 1 two rounds (3 tokens each). One round per block would predict 1000/14."""
    assert expected.pyramid_speed(PROFILE, 2, 6, 0.0, 0.0) == pytest.approx(1000 / (5 * 4 + 3 + 10)), "rounds per block"
    assert expected.pyramid_speed(PROFILE, 2, 6, 1.0, 0.0) == pytest.approx(1000 / (2 * 4 + 10))


def test_the_papers_pyramid_formula_spends_l_q_stage_1_tokens_per_block():
    """V_PSD = β_TQ(ℓ_Q+1) / (ℓ_Q/V_FSD + 1/V_T): the block's ℓ_Q tokens take ℓ_Q / V_FSD seconds of stage 1
    (however many rounds that is), plus one target pass; and V_FSD = β_QD(ℓ_D+1) / (ℓ_D/V_D + 1/V_Q)."""
    v_fsd = throughput.stage_speed(0.5, 2, 100.0, 50.0)
    assert v_fsd == pytest.approx(0.5 * 3 / (2 / 100 + 1 / 50))
    assert throughput.stage_speed(0.5, 6, v_fsd, 20.0) == pytest.approx(0.5 * 7 / (6 / v_fsd + 1 / 20))
    spec = {"gamma": 4, "l_d": 2, "l_q": 6}
    got = throughput.predict_parts(
        "psd_f", spec, {"qualifier": 0.5, "target": 0.5}, {"draft": 100.0, "qualifier": 50.0, "target": 20.0}
    )
    assert got == pytest.approx(0.5 * 7 / (6 / v_fsd + 1 / 20))


def test_measured_stage_1_rounds_per_block_are_what_the_prediction_counts():
    """With a qualifier that refuses every drafted token (α_Q = 0) the engine runs ℓ_Q stage-1 rounds per
    block, the count E(0, ℓ_D) = 1 token a round gives the prediction."""
    V = 6
    draft = torch.zeros(V, V)
    draft[:, 1] = 20.0  # the draft always writes 1
    qual = torch.zeros(V, V)
    qual[:, 2] = 20.0  # the qualifier always writes 2
    lms = {"draft": BigramLM(draft, "draft"), "qualifier": BigramLM(qual, "qualifier"), "target": BigramLM(qual)}
    cfg = DecodeConfig(method="psd_a", l_d=2, l_q=5, max_new_tokens=18)
    steps = list(decode(lms, [0], as_run(cfg), (), None))
    for s in steps[:-1]:
        block = len(s.target_round.tokens) - 1
        assert len(s.qualifier_rounds) == block == cfg.l_q  # one token a round at α_Q 0
