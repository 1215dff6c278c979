"""Tests that catch plausible wrong rules (each planted in a copy of the code, each caught here).

Each test names the rule it protects; all use tiny vocabularies, the bigram mock or hand-built
logits, and explicit generators.
"""

from __future__ import annotations

import pytest
import torch
from helpers import verify
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.round import propose_chain

pytestmark = pytest.mark.usefixtures("one_thread")


def logits_for(rows):
    return torch.tensor(rows, dtype=torch.float32).clamp_min(1e-30).log()


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


# --- PSD_F stage 1 is the fuzzy test with τ_Q, not the exact SD rule ----------------------


def _stage1(tau_q: float, temperature: float) -> tuple[int, int]:
    V = 6
    tables = {
        "draft": bigram_table(V, 11, 2.0),
        "qualifier": bigram_table(V, 12, 2.0),
        "target": bigram_table(V, 13, 2.0),
    }
    cfg = DecodeConfig(method="psd_f", temperature=temperature, tau_q=tau_q, tau_t=0.5, l_d=3, l_q=6, max_new_tokens=30)
    lms = {r: BigramLM(tables[r], r) for r in roles_for("psd_f")}
    gen = None if temperature == 0 else torch.Generator().manual_seed(3)
    rounds = [r for s in decode(lms, [0], as_run(cfg), (), gen) for r in s.qualifier_rounds]
    return sum(r.n_accepted for r in rounds), sum(len(r.tokens) - 1 for r in rounds)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_psd_f_stage1_uses_tau_q(temperature):
    """PSD_F's stage 1 accepts by Div(P_Q, P_D) ≤ τ_Q whatever the token: τ_Q = 100 accepts every
    drafted token (the exact SD rule would refuse those the qualifier disagrees with); τ_Q = 0 none."""
    acc, prop = _stage1(100.0, temperature)
    assert prop > 0 and acc == prop
    acc0, prop0 = _stage1(0.0, temperature)
    assert prop0 > 0 and acc0 == 0


# --- a fuzzy rejection samples from the verifier's P, not the SD residual -----------------

P_ROW = [0.0, 0.5, 0.5, 0.0]
Q_ONE = [0.0, 1.0, 0.0, 0.0]  # the proposer drafts token 1 with certainty


def test_fuzzy_rejection_samples_from_the_target():
    """FSD, T=1: a rejected draft is replaced by a token sampled from the target's P_T (no residual):
    p = [0, .5, .5, 0] against a draft certain of token 1 (js > τ) gives token 1 about half the time;
    the SD residual norm(max(0, p − q)) would give token 2 always."""
    cfg = DecodeConfig(method="fsd", temperature=1.0, tau_t=0.01)
    gen = torch.Generator().manual_seed(0)
    z_p, z_q = logits_for([P_ROW, [0.25] * 4]), logits_for([Q_ONE])
    nxt = []
    for _ in range(300):
        rnd, t = verify(z_p, z_q, [1], "fuzzy", 0.01, cfg, gen, "draft", "target")
        assert rnd.n_accepted == 0
        nxt.append(t)
    assert set(nxt) == {1, 2} and 0.4 < nxt.count(1) / len(nxt) < 0.6


# --- fallback = "sd" at T > 0 -------------------------------------------------------------


def test_fallback_sd_sampled_adds_the_sd_rule():
    """fallback='sd' at T=1: a token that fails τ passes when the SD ratio test passes (p/q = .5 here),
    on the same uniforms it accepts at least what the exact SD rule accepts, and without the
    fallback nothing passes. A rejection resamples from SD's residual (token 2 alone), as under SD."""
    z_p, z_q = logits_for([P_ROW, [0.25] * 4]), logits_for([Q_ONE])
    fb = DecodeConfig(method="fsd", temperature=1.0, tau_t=0.01, fallback="sd")
    sd = DecodeConfig(method="sd", temperature=1.0)
    none = DecodeConfig(method="fsd", temperature=1.0, tau_t=0.01)
    acc_fb, acc_none, after_reject = 0, 0, []
    for seed in range(300):
        g1, g2, g3 = (torch.Generator().manual_seed(seed) for _ in range(3))
        r_fb, t_fb = verify(z_p, z_q, [1], "fuzzy", 0.01, fb, g1, "draft", "target")
        r_sd, _ = verify(z_p, z_q, [1], "sd", None, sd, g2, "draft", "target")
        r_no, _ = verify(z_p, z_q, [1], "fuzzy", 0.01, none, g3, "draft", "target")
        assert r_fb.n_accepted >= r_sd.n_accepted and r_fb.rule == "fuzzy+sd"
        acc_fb += r_fb.n_accepted
        acc_none += r_no.n_accepted
        if r_fb.n_accepted == 0:
            after_reject.append(t_fb)
    assert 0.4 < acc_fb / 300 < 0.6 and acc_none == 0
    assert set(after_reject) == {2}


def test_fallback_sd_sampled_never_accepts_less_than_fuzzy():
    """fallback='sd' at T>0 in the decode loop: with the same generator, the first target round
    accepts at least what plain FSD accepts (the SD rule only adds passes)."""
    V = 5
    tables = {"draft": bigram_table(V, 21, 1.5), "target": bigram_table(V, 22, 1.5)}
    more = 0
    for seed in range(40):
        counts = []
        for fallback in ("none", "sd"):
            cfg = DecodeConfig(method="fsd", temperature=1.0, tau_t=0.05, gamma=4, max_new_tokens=5, fallback=fallback)
            lms = {r: BigramLM(tables[r], r) for r in roles_for("fsd")}
            step = next(iter(decode(lms, [0], as_run(cfg), (), torch.Generator().manual_seed(seed))))
            counts.append(step.target_round.n_accepted)
        assert counts[1] >= counts[0]
        more += counts[1] > counts[0]
    assert more > 0  # the fallback does accept extra tokens


# --- the draft samples from the same warped distribution as the verifier uses -------------


@pytest.mark.parametrize(
    "warp", [dict(temperature=0.4), dict(temperature=1.0, top_k=2), dict(temperature=1.0, top_p=0.6)]
)
def test_draft_samples_from_the_warped_distribution(warp):
    """At T>0 the draft's tokens follow warp(z_D) with the run's temperature, top-k and top-p (the
    same warp the SD ratio test divides by): 3,000 single-token drafts are within total variation
    0.04 of it, and tokens outside top-k / top-p never appear."""
    V = 5
    table = bigram_table(V, 31, 1.0)
    cfg = DecodeConfig(method="sd", max_new_tokens=4, **warp)
    expected = rules.warp(table[0:1], cfg.temperature, cfg.top_k, cfg.top_p)[0]
    raw = torch.softmax(table[0], -1)
    assert tv(expected, raw) > 0.1  # the warp matters for this row
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(V)
    for _ in range(3000):
        lm = BigramLM(table, "draft")
        x, _ = propose_chain(lm, [0], 1, cfg, gen)
        counts[x[0]] += 1
    emp = counts / counts.sum()
    assert tv(emp, expected) < 0.04
    assert float(emp[expected == 0].sum()) == 0.0


def _joint(method: str, n: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    V = 4
    tables = {"target": bigram_table(V, 1), "qualifier": bigram_table(V, 2), "draft": bigram_table(V, 3)}
    cfg = DecodeConfig(method=method, max_new_tokens=2, **kw)
    gen = torch.Generator().manual_seed(321)
    counts = torch.zeros(V, V)
    for _ in range(n):
        lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
        out = [t for s in decode(lms, [0], as_run(cfg), (), gen) for t in s.new_tokens]
        counts[out[0], out[1]] += 1
    p = rules.warp(tables["target"], cfg.temperature, cfg.top_k, cfg.top_p)
    return counts / n, p[0][:, None] * p


def test_sampled_sd_is_exact_with_temperature_and_top_k():
    """SD at T=0.5 with top-k 3 samples the target's warped law exactly: over 3,000 runs the first
    two tokens are within total variation 0.05 of P_T(a|0)·P_T(b|a) (both warped)."""
    emp, exp = _joint("sd", 3000, temperature=0.5, top_k=3, gamma=3)
    assert 0.5 * float((emp - exp).abs().sum()) < 0.05


# --- divergences use the raw distributions, not the warped ones ---------------------------


@pytest.mark.parametrize(
    "warp", [dict(temperature=0.3), dict(temperature=1.0, top_k=2), dict(temperature=1.0, top_p=0.8)]
)
def test_divergence_uses_raw_distributions(warp):
    """CHOICE (FSD code): Div is computed on softmax(z) at temperature 1 without top-k/top-p,
    whatever the sampling warp: the recorded div equals the raw js, and τ between the raw and the
    warped js decides by the raw one."""
    z_p = torch.tensor([[2.0, 1.5, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]])
    z_q = torch.tensor([[1.5, 2.0, -1.0, 0.5]])
    raw = rules.divergence(torch.softmax(z_p[:1], -1), torch.softmax(z_q, -1), "js").item()
    cfg = DecodeConfig(method="fsd", tau_t=0.5, **warp)
    wp = rules.warp(z_p[:1], cfg.temperature, cfg.top_k, cfg.top_p)
    wq = rules.warp(z_q, cfg.temperature, cfg.top_k, cfg.top_p)
    warped = rules.divergence(wp, wq, "js").item()
    assert abs(warped - raw) > 0.02  # the warp changes js here (raw 0.064)
    tau = 0.5 * (raw + warped)
    cfg = DecodeConfig(method="fsd", tau_t=tau, **warp)
    rnd, _ = verify(z_p, z_q, [1], "fuzzy", tau, cfg, torch.Generator().manual_seed(0), "draft", "target")
    assert rnd.tokens[0].div == pytest.approx(raw, abs=1e-5)
    assert rnd.n_accepted == (1 if raw <= tau else 0)


# --- kl's direction, acceptance's denominator, a round's expected length, the sampled ratio test ---


def test_kl_in_verify_is_proposer_against_verifier():
    """Through the engine, kl is KL(P_proposer ‖ P_verifier): the verifier p = [.5, .5, 0⁺] and a proposer
    q = [.999, .001, 0⁺] give KL(q‖p) ≈ 0.685, accepted at τ 1, while KL(p‖q) ≈ 2.76 would reject."""
    z_p = logits_for([[0.5, 0.5, 1e-9], [0.3, 0.3, 0.4]])
    z_q = logits_for([[0.999, 0.001, 1e-9]])
    want = rules.divergence(torch.softmax(z_p[:1], -1), torch.softmax(z_q, -1), "kl").item()
    assert want == pytest.approx(0.685, abs=2e-3)
    cfg = DecodeConfig(method="fsd", divergence="kl", tau_t=1.0)
    rnd, _ = verify(z_p, z_q, [0], "fuzzy", 1.0, cfg, None, "draft", "target")
    assert rnd.tokens[0].div == pytest.approx(want, abs=1e-5) and rnd.n_accepted == 1


def test_acceptance_is_accepted_over_proposed():
    """stats.acceptance[stage] is accepted ÷ proposed drafted tokens (the verifier's own token is not a
    proposal); the throughput model and the cost verdict read this figure."""
    from helpers import compute_stats

    V = 6
    base = bigram_table(V, 43, 2.0)  # the proposers are noisy copies of the target: partial acceptance
    tables = {"target": base, "qualifier": base + bigram_table(V, 42, 0.5), "draft": base + bigram_table(V, 41, 1.0)}
    cfg = DecodeConfig(method="psd_f", tau_q=0.3, tau_t=0.3, l_d=2, l_q=4, max_new_tokens=24)
    steps = list(decode({r: BigramLM(tables[r], r) for r in roles_for("psd_f")}, [0], as_run(cfg), (), None))
    st = compute_stats("psd_f", steps, 0.0, "")
    for stage, rounds in (
        ("target", [s.target_round for s in steps]),
        ("qualifier", [r for s in steps for r in s.qualifier_rounds]),
    ):
        acc, prop = sum(r.n_accepted for r in rounds), sum(len(r.tokens) - 1 for r in rounds)
        assert prop > 0 and acc > 0  # so that any other denominator gives another figure
        assert st.acceptance[stage] == pytest.approx(acc / prop, abs=1e-4)


def test_expected_length_of_a_round():
    """A round of n proposals accepted with probability α each commits (1 − α^(n+1)) / (1 − α) tokens,
    the verifier's own included: 1 at α = 0, n + 1 at α = 1, 1.9375 at α = ½ and n = 4."""
    from pyramid_demo.predict.expected import round_speed

    def expected_len(alpha: float, n: int) -> float:
        return round_speed({"ms": {"draft": {1: 1.0}, "target": {1: 1.0}}}, n, (alpha,))["tokens_per_pass"]

    assert expected_len(0.0, 4) == 1.0 and expected_len(0.0, 1) == 1.0
    assert expected_len(0.5, 4) == pytest.approx(1.9375)
    assert expected_len(1.0, 4) == 5.0
    assert expected_len(0.3, 2) == pytest.approx(1 + 0.3 + 0.09)


@pytest.mark.parametrize(
    "warp",
    [dict(temperature=0.7, top_k=3), dict(temperature=1.3, top_p=0.7), dict(temperature=1.0, top_k=4, top_p=0.8)],
)
def test_sampled_ratio_test_warps_the_proposer_like_the_target(warp):
    """At T>0 the SD ratio p(x)/q(x) divides by the proposer's q warped exactly as the target's p is
    (temperature, top-k and top-p): the recorded p and q equal warp(z) with all three, and a draft
    token outside the proposer's top-k/top-p has q = 0, so the ratio test accepts it."""
    g = torch.Generator().manual_seed(9)
    V = 12
    z_p, z_q = 2 * torch.randn(2, V, generator=g), 2 * torch.randn(1, V, generator=g)
    cfg = DecodeConfig(method="sd", **warp)
    pw = rules.warp(z_p, cfg.temperature, cfg.top_k, cfg.top_p)
    qw = rules.warp(z_q, cfg.temperature, cfg.top_k, cfg.top_p)
    t_only = rules.warp(z_q, cfg.temperature)
    for x in range(V):
        rnd, _ = verify(z_p, z_q, [x], "sd", None, cfg, torch.Generator().manual_seed(x), "draft", "target")
        rec = rnd.tokens[0]
        assert rec.p == pytest.approx(float(pw[0, x]), abs=1e-6)
        assert rec.q == pytest.approx(float(qw[0, x]), abs=1e-6)
        if float(qw[0, x]) == 0.0 and float(pw[0, x]) > 0.0:
            assert float(t_only[0, x]) > 0 and rnd.n_accepted == 1
