"""Acceptance rules and divergences against hand-built distributions and logits."""

import math

import pytest
import torch
from helpers import leading_run, sd_passes, verify

from pyramid_demo.core import rules
from pyramid_demo.core.methods import DecodeConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def logits_for(rows):
    """Logits whose softmax is exactly the given probability rows."""
    return torch.tensor(rows, dtype=torch.float32).clamp_min(1e-30).log()


def one_hot_logits(ids, vocab=4, hi=10.0):
    z = torch.zeros(len(ids), vocab)
    for i, t in enumerate(ids):
        z[i, t] = hi
    return z


def test_js_is_the_fsd_code_form():
    """js(p=[.9,.1], q=[.1,.9]) = ½KL(m‖p)+½KL(m‖q) = 0.5108, not the textbook 0.368."""
    p, q = torch.tensor([[0.9, 0.1]]), torch.tensor([[0.1, 0.9]])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert rules.divergence(p, q, "js").item() == pytest.approx(expected, abs=1e-5)
    assert expected == pytest.approx(0.5108, abs=1e-4)


def test_kl_is_proposer_against_verifier():
    """kl = KL(q‖p) with p the verifier: Σ q log(q/p)."""
    p, q = torch.tensor([[0.9, 0.1]]), torch.tensor([[0.5, 0.5]])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert rules.divergence(p, q, "kl").item() == pytest.approx(expected, abs=1e-5)


def test_tv_is_half_l1():
    """tv = ½Σ|p−q|."""
    p, q = torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([[0.1, 0.2, 0.7]])
    assert rules.divergence(p, q, "tv").item() == pytest.approx(0.6, abs=1e-6)


@pytest.mark.parametrize("kind", ["js", "kl", "tv"])
def test_divergences_safe_on_zeros_and_identical(kind):
    """Zero probabilities never give NaN or negative values; identical rows give 0. A token the
    proposer gives mass but the verifier rules out exactly (p = 0) makes js and kl +inf, as exact
    math says (no floor hides it); tv stays 1."""
    p = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    d = rules.divergence(p, q, kind)
    assert not torch.isnan(d).any() and (d >= 0).all()
    assert d[0].item() == (1.0 if kind == "tv" else float("inf"))
    assert d[1].item() == pytest.approx(0.0, abs=1e-7)


def test_unknown_divergence_is_named():
    with pytest.raises(ValueError, match="unknown divergence 'hellinger'"):
        rules.divergence(torch.ones(1, 2) / 2, torch.ones(1, 2) / 2, "hellinger")


def test_sd_greedy_accepts_while_tokens_match_argmax():
    """Greedy SD: x̃ = [3, 1, 0] against argmaxes [3, 1, 2] accepts 2."""
    p = rules.warp(one_hot_logits([3, 1, 2, 0]), 0.0)
    q = rules.warp(one_hot_logits([3, 1, 0]), 0.0)
    assert leading_run(sd_passes(p[:3], q, [3, 1, 0], None)) == 2


def test_sd_ratio_test_with_explicit_uniforms():
    """Sampled SD accepts x̃ iff r < p(x̃)/q(x̃): p=.5, q=.8 gives ratio .625."""
    p, q = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.8, 0.2]])
    assert sd_passes(p, q, [0], torch.tensor([0.6])) == [True]
    assert sd_passes(p, q, [0], torch.tensor([0.7])) == [False]
    assert sd_passes(p, q, [1], torch.tensor([0.99])) == [True]  # p/q = 2.5 ≥ 1 always passes


def test_residual_is_normalised_positive_part():
    """After a rejection SD samples from norm(max(0, p − q))."""
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.8, 0.1, 0.1])
    assert torch.allclose(rules.residual(p, q), torch.tensor([0.0, 2 / 3, 1 / 3]))


def test_fuzzy_accepts_leading_run_under_tau():
    """FSD accepts the leading run with d ≤ τ whatever the tokens: [.1,.3,.6,.1] at τ .5 → 2."""
    assert leading_run(rules.fuzzy_passes(torch.tensor([0.1, 0.3, 0.6, 0.1]), 0.5)) == 2
    assert leading_run(rules.fuzzy_passes(torch.tensor([0.5]), 0.5)) == 1  # ≤ is inclusive


def test_warp_top_k_and_top_p():
    """top-k keeps the k largest; top-p keeps the smallest set reaching p; temperature 0 is one-hot."""
    z = logits_for([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(rules.warp(z, 1.0, top_k=2), torch.tensor([[0.625, 0.375, 0, 0]]), atol=1e-6)
    assert torch.allclose(rules.warp(z, 1.0, top_p=0.7), torch.tensor([[0.625, 0.375, 0, 0]]), atol=1e-6)
    assert torch.equal(rules.warp(z, 0.0), torch.tensor([[1.0, 0, 0, 0]]))


# --- the tests' `verify` (tests/helpers.py), the whole acceptance step, on hand-built logits -------------

CLOSE = [0.6, 0.4, 0.0, 0.0]  # target rows
NEAR = [0.4, 0.6, 0.0, 0.0]  # js(CLOSE, NEAR) ≈ 0.02: close, but its argmax differs
FAR = [0.0, 0.0, 0.1, 0.9]


def test_verify_sd_greedy_accepts_two_then_target_argmax():
    """SD, T=0: drafts [3,1,0] vs target argmaxes [3,1,2,0] → 2 accepted, next token 2."""
    cfg = DecodeConfig(method="sd", temperature=0.0)
    rnd, nxt = verify(
        one_hot_logits([3, 1, 2, 0]),
        one_hot_logits([3, 1, 0]),
        [3, 1, 0],
        "sd",
        None,
        cfg,
        None,
        "draft",
        "target",
    )
    assert (rnd.n_accepted, nxt) == (2, 2)
    assert [t.status for t in rnd.tokens] == ["accepted", "accepted", "rejected", "resampled"]


def test_verify_fuzzy_accepts_close_distribution_with_other_argmax():
    """FSD, T=0, τ .3: a draft token ≠ target argmax is accepted when js is small; the first far
    position is rejected and the target's argmax follows; the rest are discarded."""
    cfg = DecodeConfig(method="fsd", temperature=0.0, tau_t=0.3)
    z_p = logits_for([CLOSE, CLOSE, CLOSE, CLOSE])
    z_q = logits_for([NEAR, FAR, NEAR])
    rnd, nxt = verify(z_p, z_q, [1, 3, 1], "fuzzy", 0.3, cfg, None, "draft", "target")
    assert (rnd.n_accepted, nxt) == (1, 0)
    assert [t.status for t in rnd.tokens] == ["accepted", "rejected", "discarded", "resampled"]
    assert rnd.tokens[0].div < 0.3 < rnd.tokens[1].div and rnd.tokens[0].tau == 0.3


def test_verify_fuzzy_bonus_when_all_pass():
    """All three within τ: three accepted and a bonus from the target's last row (argmax 0)."""
    cfg = DecodeConfig(method="fsd", temperature=0.0, tau_t=0.3)
    rnd, nxt = verify(
        logits_for([CLOSE] * 4), logits_for([NEAR] * 3), [1, 1, 1], "fuzzy", 0.3, cfg, None, "draft", "target"
    )
    assert (rnd.n_accepted, nxt, rnd.tokens[-1].status) == (3, 0, "bonus")


def test_verify_fallback_sd_accepts_matching_token_that_fails_divergence():
    """fallback='sd': a far distribution whose argmax matches the target's still passes (T=0)."""
    cfg = DecodeConfig(method="fsd", temperature=0.0, tau_t=0.1, fallback="sd")
    z_p = logits_for([[0.0, 0.0, 0.6, 0.4]] * 2)
    z_q = logits_for([[0.0, 0.0, 1.0, 0.0]])  # js large, argmax equal
    rnd, _ = verify(z_p, z_q, [2], "fuzzy", 0.1, cfg, None, "draft", "target")
    assert rnd.tokens[0].div > 0.1 and rnd.n_accepted == 1 and rnd.rule == "fuzzy+sd"
    cfg_off = DecodeConfig(method="fsd", temperature=0.0, tau_t=0.1)
    rnd_off, _ = verify(z_p, z_q, [2], "fuzzy", 0.1, cfg_off, None, "draft", "target")
    assert rnd_off.n_accepted == 0


def test_verify_sd_sampled_resamples_from_residual():
    """SD, T=1: p=[0,.5,.5,0], q drafts token 1 with certainty: accepted with probability
    p/q = .5, and every rejection resamples from the residual, which is token 2 alone."""
    cfg = DecodeConfig(method="sd", temperature=1.0)
    z_p = logits_for([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    z_q = logits_for([[0.0, 1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    results = [verify(z_p, z_q, [1], "sd", None, cfg, gen, "draft", "target") for _ in range(400)]
    rejected = [nxt for rnd, nxt in results if rnd.n_accepted == 0]
    assert set(rejected) == {2}
    assert 0.4 < 1 - len(rejected) / len(results) < 0.6
