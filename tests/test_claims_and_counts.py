"""What may be claimed and what is counted: lossless needs every stage exact, exact means bitwise, and the
statistics count every round.

Each test names the rule it protects in its docstring and in its assertion messages. The records are
hand-built (core.trace) or come from the bigram mock, so nothing here depends on a real model.
"""

from __future__ import annotations

import pytest
import torch
from helpers import compute_stats
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import TABLE, DecodeConfig, lossless
from pyramid_demo.core.trace import StageRound, Step, TokenRec
from pyramid_demo.models import checks

pytestmark = pytest.mark.usefixtures("one_thread")


# --- lossless needs every stage exact ------------------------------------------------------

LOSSLESS = {
    ("ar", "sd"): True,
    ("ar", "fuzzy"): True,
    ("sd", "sd"): True,
    ("sd", "fuzzy"): True,
    ("fsd", "sd"): False,
    ("fsd", "fuzzy"): False,
    ("psd_a", "sd"): True,
    ("psd_a", "fuzzy"): False,
    ("psd_f", "sd"): False,
    ("psd_f", "fuzzy"): False,
}


def test_lossless_needs_an_exact_stage_1_and_an_exact_target_stage():
    """`methods.lossless(m, stage2)` is True only when every verification stage runs the exact SD rule:
    PSD_F's fuzzy stage 1 makes it lossy even with stage2 = "sd"; PSD_A is lossless only with stage2 = "sd"."""
    assert {m.key for m in TABLE} == {k for k, _ in LOSSLESS}
    for (key, stage2), want in LOSSLESS.items():
        assert lossless(key, stage2) is want, (
            f"rule 'lossless needs every stage exact (stage 1 too)': lossless({key!r}, {stage2!r}) should be {want}"
        )


def _first_two(method: str, n: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Empirical law of the first two sampled tokens over n runs, and the target's own law [V, V]."""
    V = 4
    tables = {"target": bigram_table(V, 1), "qualifier": bigram_table(V, 2), "draft": bigram_table(V, 3)}
    cfg = DecodeConfig(method=method, max_new_tokens=2, temperature=1.0, l_d=2, l_q=2, **kw)
    gen = torch.Generator().manual_seed(17)
    counts = torch.zeros(V, V)  # [V, V]
    for _ in range(n):
        lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
        out = [t for s in decode(lms, [0], as_run(cfg), (), gen) for t in s.new_tokens]
        counts[out[0], out[1]] += 1
    p = rules.warp(tables["target"], 1.0)  # [V, V]
    return counts / n, p[0][:, None] * p


@pytest.mark.slow
def test_psd_f_with_an_exact_stage_2_is_not_lossless_when_sampling():
    """Why the claim above matters: at T=1 PSD_F with stage2 = "sd" and τ_Q = 100 (stage 1 keeps every
    drafted token) samples a law far from the target's (total variation > 0.1 over 3,000 runs): the
    stage-2 ratio test divides by P_Q, but the block's tokens were drawn from P_D. PSD_A's block is drawn
    as the qualifier samples, so the same cascade is within 0.05 of the target's law."""
    emp, want = _first_two("psd_f", 3000, tau_q=100.0, stage2="sd")
    assert 0.5 * float((emp - want).abs().sum()) > 0.1, "PSD_F with an exact stage 2 came out lossless here"
    emp, want = _first_two("psd_a", 3000, stage2="sd")
    assert 0.5 * float((emp - want).abs().sum()) < 0.05


# --- exact means bitwise -------------------------------------------------------------------


class OneUlpOff(BigramLM):
    """The bigram mock whose multi-row calls round every logit up by one fp32 ulp (as a GEMM kernel picked
    by row count might): a k-token pass is within any allclose tolerance of the steps but not equal."""

    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        z = super()._run(tokens, pos, keep)  # [keep, V] fp32
        return torch.nextafter(z, torch.full_like(z, float("inf"))) if z.shape[0] > 1 else z


def test_exactness_is_bitwise_not_allclose():
    """`checks.pass_vs_steps` calls a pass exact only when its logits equal the steps' bitwise
    (`torch.equal`): a pass one ulp off, which `allclose` accepts, is not exact; a mock whose passes are
    the steps' rows is; top-1 still matches in both."""
    table = bigram_table(50, 5, 3.0)
    ids = [(7 * i + 3) % 50 for i in range(20)]
    off = checks.pass_vs_steps(OneUlpOff(table), ids, 8, (2, 5))
    assert torch.allclose(torch.nextafter(table, table + 1), table)  # what allclose would accept
    assert [c["bitwise"] for c in off] == [False, False], (
        "rule 'exact means bitwise (torch.equal), not allclose': a pass one ulp off was called exact"
    )
    assert all(c["top1"] and 0 < c["max_abs_diff"] < 1e-5 for c in off)
    rec = checks.summarise(off)
    assert rec["exact"] is False and rec["bitwise_passes"] == 0, "rule 'exact means bitwise': summarise"
    same = checks.pass_vs_steps(BigramLM(table), ids, 8, (2, 5))
    assert all(c["bitwise"] and c["max_abs_diff"] == 0.0 for c in same)


# --- statistics count every round ------------------------------------------------------------


def _round(stage: str, proposed: int, accepted: int, proposer: str, verifier: str) -> StageRound:
    """A hand-built round: `proposed` drafted tokens, the first `accepted` kept, then the verifier's own."""
    toks = [
        TokenRec(10 + i, proposer, "accepted" if i < accepted else "rejected" if i == accepted else "discarded")
        for i in range(proposed)
    ]
    toks.append(TokenRec(99, verifier, "bonus" if accepted == proposed else "resampled"))
    return StageRound(stage, proposer, verifier, "fuzzy", toks, accepted)


def _step(i: int, qrounds: list[StageRound], target: StageRound | None, n_new: int, roles: dict[str, int]) -> Step:
    return Step(
        i,
        qrounds,
        target,
        [1] * n_new,
        ["target"] * n_new,
        0.01 * i,
        0.01 * (i + 1),
        {r: 0.001 * n for r, n in roles.items()},
        dict(roles),
        {r: [1] * n for r, n in roles.items()},
    )


def test_qualifier_statistics_count_every_qualifier_round_of_a_step():
    """A pyramid step runs several draft → qualifier rounds before its one target pass; the qualifier's
    proposed, accepted, round count, acceptance and per-position figures sum over all of them, not only
    each step's first round. Here the first rounds alone would give 6 proposed, 4 accepted, 2 rounds."""
    q = "qualifier"
    steps = [
        _step(
            0,
            [_round(q, 3, 3, "draft", q), _round(q, 3, 0, "draft", q)],
            _round("target", 5, 2, q, "target"),
            3,
            {"draft": 6, "qualifier": 2, "target": 1},
        ),
        _step(
            1,
            [_round(q, 3, 1, "draft", q), _round(q, 2, 2, "draft", q)],
            _round("target", 5, 5, q, "target"),
            6,
            {"draft": 5, "qualifier": 2, "target": 1},
        ),
    ]
    st = compute_stats("psd_f", steps, 0.0, "max_new_tokens")
    why = "rule 'qualifier statistics count every qualifier round of a step, not only the first'"
    assert (st.proposed[q], st.accepted[q], st.rounds[q]) == (11, 6, 4), why
    assert st.acceptance[q] == pytest.approx(6 / 11, abs=1e-4), why
    assert st.per_position_acceptance[q] == [0.75, 0.5, 0.3333], why  # 3 of 4, 2 of 4, 1 of the 3 reaching it
    assert (st.proposed["target"], st.accepted["target"], st.rounds["target"]) == (10, 7, 2)


def test_ar_target_passes_are_its_steps():
    """AR has no target rounds (it proposes nothing), yet every AR step is one target forward: its
    target_passes is its step count, one token per pass, and no accepted-length histogram."""
    steps = [_step(i, [], None, 1, {"target": 1}) for i in range(7)]
    st = compute_stats("ar", steps, 0.0, "max_new_tokens")
    why = "rule 'target passes are steps (one target forward each), not target rounds: AR has none'"
    assert st.target_passes == 7 == st.forward_passes["target"], why
    assert st.tokens_per_target_pass == 1.0 and st.mean_accepted_per_target_pass == 0.0, why
    assert st.accepted_hist == [] and "target" not in st.rounds


def test_ar_target_passes_through_the_engine():
    """The same rule through the decode loop: AR on the bigram mock writes 12 tokens in 12 target passes."""
    cfg = DecodeConfig(method="ar", max_new_tokens=12)
    lm = BigramLM(bigram_table(8, 4), "target")
    steps = list(decode({"target": lm}, [0], as_run(cfg), (), None))
    st = compute_stats("ar", steps, 0.0, "max_new_tokens")
    assert st.n_new_tokens == 12 and st.target_passes == 12 == lm.n_forward, (
        "rule 'AR's target passes are its steps, not target rounds'"
    )
