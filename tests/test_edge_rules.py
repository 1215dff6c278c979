"""Rules at the edges: divergences near zero probability, tokens after an EOS, the last one-token pass,
τ = 0, non-finite logits, and one definition per figure.

Tiny vocabularies and the bigram mock keep them fast; every test states the rule it checks.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import verify
from mock_lm import BigramLM, as_run, bigram_table

from pyramid_demo.core import engine, rules
from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")


def _js64(z_p: list[float], z_q: list[float]) -> float:
    """The FSD-code js ½KL(m‖p)+½KL(m‖q) in float64, straight from the definition."""
    lp = torch.log_softmax(torch.tensor(z_p, dtype=torch.float64), -1)
    lq = torch.log_softmax(torch.tensor(z_q, dtype=torch.float64), -1)
    m = 0.5 * (lp.exp() + lq.exp())
    return float((m * (m.log() - 0.5 * (lp + lq))).sum())


# --- js and kl from unclamped log-probabilities ------------------------------------------

Z_P = [0.0, -45.0, -10.0]  # the verifier all but rules token 1 out
Z_Q = [0.0, math.log(0.03 / 0.97), -10.0]  # the proposer gives token 1 about 0.03


def test_js_uses_log_softmax_values_unclamped():
    """js is computed from the log-softmax values as they are: verifier logits [0, −45, −10] and a
    proposer with probability 0.03 on token 1 give the exact 0.3009 (a floor at log 1e-12 gave 0.17),
    and kl = KL(q‖p) is exact too."""
    z_p, z_q = torch.tensor([Z_P]), torch.tensor([Z_Q])
    lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)
    js = rules.divergence(lp.exp(), lq.exp(), "js", lp, lq).item()
    assert js == pytest.approx(_js64(Z_P, Z_Q), abs=1e-4) and js == pytest.approx(0.3009, abs=1e-3)
    q = lq.exp().double()[0]
    kl = float((q * (lq.double()[0] - lp.double()[0])).sum())
    assert rules.divergence(lp.exp(), lq.exp(), "kl", lp, lq).item() == pytest.approx(kl, rel=1e-3)


def test_fsd_rejects_a_token_the_verifier_rules_out():
    """FSD at τ 0.25 rejects the proposer's token 1 in the example above (js 0.3009 > 0.25)."""
    cfg = DecodeConfig(method="fsd", temperature=0.0, tau_t=0.25)
    rnd, nxt = verify(torch.tensor([Z_P, Z_P]), torch.tensor([Z_Q]), [1], "fuzzy", 0.25, cfg, None, "draft", "target")
    assert rnd.n_accepted == 0 and nxt == 0 and rnd.tokens[0].div > 0.25


def test_zero_probabilities_never_give_nan():
    """Only −inf log-probabilities are guarded: 0·log 0 terms count 0 (never NaN), both with given
    log-probs and with probabilities alone; identical rows give 0."""
    p = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    for kind in ("js", "kl"):
        d = rules.divergence(p, p.clone(), kind, p.log(), p.log())
        assert torch.equal(d, torch.zeros(2)), kind
        assert torch.equal(rules.divergence(p, p.clone(), kind), torch.zeros(2)), kind


# --- tokens after an EOS are neither kept nor counted -------------------------------------


def _chain(table: torch.Tensor, start: int, n: int) -> list[int]:
    out, t = [], start
    for _ in range(n):
        t = int(table[t].argmax())
        out.append(t)
    return out


def _run(method: str, tables: dict, eos: tuple[int, ...], cfg: DecodeConfig, gen=None) -> list:
    lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
    return list(decode(lms, [0], as_run(cfg), eos, gen))


V = 12
SAME = bigram_table(V, 5, sharpness=3.0)  # draft = qualifier = target: every draft is accepted
CHAIN = _chain(SAME, 0, 16)


@pytest.mark.parametrize(
    "method,kw",
    [("sd", dict(gamma=6)), ("fsd", dict(gamma=6)), ("psd_f", dict(l_d=6, l_q=6)), ("psd_a", dict(l_d=6, l_q=6))],
)
def test_tokens_after_eos_are_neither_kept_nor_counted(method, kw):
    """An EOS at position 2 of a fully accepted draft of 6 ends the output there, and every stage
    counts 3 drafted tokens accepted (the EOS included), not 6: what follows the EOS was never used."""
    assert len(set(CHAIN[:3])) == 3  # the EOS first appears at position 2
    eos = CHAIN[2]
    tables = {r: SAME for r in ("draft", "qualifier", "target")}
    cfg = DecodeConfig(method=method, max_new_tokens=20, **kw)
    steps = _run(method, tables, (eos,), cfg)
    out = [t for s in steps for t in s.new_tokens]
    assert out == CHAIN[:3]
    from helpers import compute_stats

    s = compute_stats(method, steps, 0.0, "eos")
    for stage in s.proposed:
        assert s.accepted[stage] == 3 and s.proposed[stage] == 3, stage
    assert s.accepted_hist == [0, 0, 0, 1] and s.mean_accepted_per_target_pass == 3
    rnd = steps[0].target_round
    assert [t.token_id for t in rnd.tokens[:-1]] == CHAIN[:3]


# --- the one-token target-only step at the end of the budget counts ------------------------


@pytest.mark.parametrize("method", ["sd", "fsd", "psd_a", "psd_f"])
def test_last_one_token_pass_is_in_every_pass_statistic(method):
    """With room for one token only, the last target pass proposes nothing; it still counts as a
    target round: in the accepted-length histogram (at 0), the round count and the mean."""
    tables = {r: SAME for r in ("draft", "qualifier", "target")}
    cfg = DecodeConfig(method=method, max_new_tokens=11, gamma=4, l_d=2, l_q=4)  # 5 + 5 + 1 tokens
    steps = _run(method, tables, (), cfg)
    from helpers import compute_stats

    s = compute_stats(method, steps, 0.0, "max_new_tokens")
    assert [len(st.new_tokens) for st in steps] == [5, 5, 1]
    assert s.target_passes == 3 == sum(s.accepted_hist) == s.rounds["target"]
    assert s.accepted_hist == [1, 0, 0, 0, 2]
    last = steps[-1].target_round
    assert last is not None and last.n_accepted == 0 and len(last.tokens) == 1
    assert s.per_position_acceptance["target"] == [1.0] * 4  # it reached no position
    assert [t for st in steps for t in st.new_tokens] == CHAIN[:11]


# --- τ = 0 accepts no near-tie -------------------------------------------------------------

TIE_P = [[0.0, 0.0, -5.0]] * 2  # the target's greedy token is 0 (first of a tie)
TIE_Q = [[-1e-7, 0.0, -5.0]]  # the proposer prefers 1 by a hair: js rounds to 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tau_zero_accepts_no_drafted_token(temperature):
    """At τ = 0 a fuzzy test accepts nothing, so the verifier produces every token itself: a
    proposal whose divergence rounds to 0 but is not the target's greedy token is rejected."""
    cfg = DecodeConfig(method="fsd", temperature=temperature, tau_t=0.0)
    gen = None if temperature == 0 else torch.Generator().manual_seed(0)
    rnd, nxt = verify(torch.tensor(TIE_P), torch.tensor(TIE_Q), [1], "fuzzy", 0.0, cfg, gen, "draft", "target")
    assert rnd.n_accepted == 0 and rnd.tokens[0].status == "rejected"
    if temperature == 0:
        assert nxt == 0


def test_whatif_tau_zero_accepts_none():
    """The inspector's what-if re-check follows the engine's rule: at τ 0 even a recorded Div of 0
    is not accepted; any τ > 0 accepts it."""
    from pyramid_demo.app import inspector
    from pyramid_demo.core.trace import StageRound, TokenRec

    toks = [TokenRec(1, "draft", "accepted", div=0.0, tau=0.3), TokenRec(0, "target", "bonus")]
    rnd = StageRound("target", "draft", "target", "fuzzy", toks, 1)
    assert inspector.reevaluate(rnd, 0.0) == 0 and inspector.reevaluate(rnd, 0.01) == 1


def test_fuzzy_at_tau_zero_is_target_greedy():
    """FSD and PSD_F at τ 0 (T=0) give target-only greedy output on tiny-random, no draft accepted."""
    tiny = tiny_random_triplet(seed=0)
    ar = generate(tiny, "hello", DecodeConfig(method="ar", max_new_tokens=16)).token_ids
    for method in ("fsd", "psd_f"):
        out = generate(tiny, "hello", DecodeConfig(method=method, tau_t=0.0, tau_q=0.0, max_new_tokens=16))
        assert out.token_ids == ar and out.stats.accepted["target"] == 0, method


# --- NaN or inf logits ---------------------------------------------------------------------


@pytest.mark.parametrize("role", ["draft", "qualifier", "target"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_raise_a_clear_error(role, temperature, bad):
    """NaN or +inf logits stop the run with an error that names the model's role and the target pass,
    at T=0 (where an argmax would silently pick a token) and at T>0."""
    tables = {r: bigram_table(4, i) for i, r in enumerate(("draft", "qualifier", "target"))}
    broken = tables[role].clone()
    broken[:, 2] = bad  # every row: the first forward already sees it
    tables[role] = broken
    cfg = DecodeConfig(method="psd_f", temperature=temperature, max_new_tokens=8, l_d=2, l_q=3)
    gen = None if temperature == 0 else torch.Generator().manual_seed(0)
    with pytest.raises(engine.NonFiniteLogits, match=rf"the {role} model .*NaN or infinite.* target pass 1"):
        _run("psd_f", tables, (), cfg, gen)


def test_minus_inf_logits_are_allowed():
    """−inf logits (a token the model rules out) are not an error: they are probability 0."""
    table = bigram_table(4, 1)
    table[:, 3] = float("-inf")
    tables = {"draft": table, "qualifier": table, "target": table}
    cfg = DecodeConfig(method="psd_f", temperature=1.0, max_new_tokens=8, l_d=2, l_q=3)
    out = [t for s in _run("psd_f", tables, (), cfg, torch.Generator().manual_seed(0)) for t in s.new_tokens]
    assert len(out) == 8 and 3 not in out


# --- one definition per figure -------------------------------------------------------------


def test_app_and_bench_report_the_same_agreement():
    """Agreement with target greedy output is one function: the app's race table shows the bench's
    number for the same run, also when a method stops early (share of the reference's tokens)."""
    from pyramid_demo.app import race_view
    from pyramid_demo.app.races import Race
    from pyramid_demo.bench import runner as bench
    from pyramid_demo.core import trace

    assert race_view.agreement is trace.agreement and bench.token_agreement is trace.agreement
    tiny = tiny_random_triplet(seed=0)
    no_eos = dataclasses.replace(tiny, eos_ids=())
    ar = generate(no_eos, "hello", DecodeConfig(method="ar", max_new_tokens=8))
    fsd = generate(no_eos, "hello", DecodeConfig(method="fsd", tau_t=0.5, max_new_tokens=8))
    early = dataclasses.replace(fsd, token_ids=ar.token_ids[:3])  # as if it had stopped at an EOS
    race = Race(1, "tiny-random", list(ar.models), "hello", ar.config, results={"ar": ar, "fsd": early})
    rows = {row[1]: row for row in race_view.race_rows([race])}
    from pyramid_demo.app.text import RACE_COLUMNS

    col = RACE_COLUMNS.index("agreement (T=0)")
    assert rows["fsd"][col] == f"{bench.token_agreement(early.token_ids, ar.token_ids):.0%}" == "38%"
    sampled = dataclasses.replace(race, config={**ar.config, "temperature": 1.0})
    assert race_view.race_rows([sampled])[1][col] is None  # AR is no greedy reference when sampling
