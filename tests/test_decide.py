"""One verification's decision (`core.round.decide_round`, walked by `core.rules.decide_tree`): what each rule reads
and draws, on hand-built logits."""

from __future__ import annotations

import pytest
import torch
from helpers import decide

from pyramid_demo.core import rules
from pyramid_demo.core.methods import DecodeConfig

pytestmark = pytest.mark.usefixtures("one_thread")

RULES = [("sd", "none"), ("fuzzy", "none"), ("fuzzy", "sd")]  # (rule, fallback)


def logits(n: int, v: int, seed: int) -> torch.Tensor:
    return 2.0 * torch.randn(n, v, generator=torch.Generator().manual_seed(seed))


def after(rule: str, fallback: str, seed: int, cfg_kw: dict | None = None) -> torch.Tensor:
    """The generator's next uniforms after one decision under `rule` (4 proposed tokens, vocabulary 16)."""
    cfg = DecodeConfig(method="fsd", temperature=1.0, fallback=fallback, **(cfg_kw or {}))
    gen = torch.Generator().manual_seed(seed)
    decide(logits(5, 16, 1), logits(4, 16, 2), [3, 1, 4, 1], rule, 0.3, cfg, gen, "draft", "target")
    return torch.rand(8, generator=gen)


@pytest.mark.parametrize("seed", range(5))
def test_the_random_stream_is_the_same_under_every_rule(seed):
    """One random stream whatever the rule: the n uniforms of the ratio test are drawn under every rule
    (a fuzzy rule without fallback reads none of them), so the generator stands at the same place after a
    decision under SD, fuzzy and fuzzy+sd."""
    ref = after("sd", "none", seed)
    for rule, fallback in RULES[1:]:
        assert torch.equal(after(rule, fallback, seed), ref), f"{rule}/{fallback} drew a different stream"


def test_a_fuzzy_rule_without_fallback_warps_one_row_of_p_only(monkeypatch):
    """Display work stays off the clock: a fuzzy rule alone reads p's warped row at its stop and no q, so
    `decide` warps one row (with top_p < 1 each row costs a full-vocabulary sort)."""
    rows: list[int] = []
    real = rules.warp
    monkeypatch.setattr(rules, "warp", lambda z, *a, **k: rows.append(z.shape[0]) or real(z, *a, **k))
    cfg = DecodeConfig(method="fsd", temperature=0.8, top_p=0.9)
    gen = torch.Generator().manual_seed(0)
    decide(logits(5, 16, 1), logits(4, 16, 2), [3, 1, 4, 1], "fuzzy", 0.3, cfg, gen, "draft", "target")
    assert rows == [1], f"warped rows {rows}: a fuzzy rule without fallback warped rows it never reads"


def test_the_sd_fallback_follows_sds_law_where_tau_fails():
    """fallback "sd" at T=1 with τ 0 (the divergence test never passes): p = (.5, .5) against a proposer sure
    of token 0 is decided by the SD rule alone: accept 0 at p/q = .5, else resample the residual (token 1).
    So P(token 0) = .5 = p(0); sampling the rejection from p instead would give .75."""
    cfg = DecodeConfig(method="fsd", temperature=1.0, tau_t=0.0, fallback="sd")
    z_p = torch.tensor([[0.5, 0.5], [0.5, 0.5]]).log()  # [2, V]: the proposed position and the bonus row
    z_q = torch.tensor([[1.0, 0.0]]).log()  # [1, V]: sure of token 0 (−inf on token 1)
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(4000):
        rnd = decide(z_p, z_q, [0], "fuzzy", 0.0, cfg, gen, "draft", "target")
        out.append(0 if rnd.k == 1 else rnd.dec.nxt)
    share = out.count(0) / len(out)
    assert abs(share - 0.5) < 0.04, f"P(token 0) = {share:.3f}: the fallback's rejection did not follow SD's law"


def old_raw_divergence(z_p: torch.Tensor, z_q: torch.Tensor, kind: str, support: str) -> torch.Tensor:
    """The definition: both full log-softmaxes, then `rules.support_divergence`."""
    lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)
    return rules.support_divergence(lp.exp(), lq.exp(), kind, support, lp, lq)


@pytest.mark.parametrize("kind", ["js", "kl", "tv"])
@pytest.mark.parametrize("support", ["subset", "full"])
@pytest.mark.parametrize("seed", range(3))
def test_the_divergence_from_logits_equals_the_definition(kind, support, seed):
    """`support_divergence_logits` skips the verifier's full log-softmax for a reduced-head proposer (one support S)
    but is still Div over S with −log p(S) charged: equal to the full-vocabulary definition to float
    tolerance, for every divergence, on random logits with a shared support, a full head, differing
    supports, and a verifier that rules out (or nearly rules out) all of S."""
    g = torch.Generator().manual_seed(seed)
    n, v = 5, 300
    z_p = 3.0 * torch.randn(n, v, generator=g)
    full = 3.0 * torch.randn(n, v, generator=g)
    shared = full.clone()
    shared[:, torch.randperm(v, generator=g)[:200]] = float("-inf")  # a reduced head's support (100 tokens)
    differing = shared.clone()
    differing[1, int(torch.isfinite(shared[1]).nonzero()[0])] = float("-inf")
    z_p_out = z_p.clone()
    z_p_out[0, torch.isfinite(shared[0])] = float("-inf")  # p(S) = 0 in row 0
    z_p_out[1, torch.isfinite(shared[1])] -= 60.0  # p(S) ≈ e^-60 in row 1
    for zp, zq in ((z_p, shared), (z_p, full), (z_p, differing), (z_p_out, shared)):
        got, want = rules.support_divergence_logits(zp, zq, kind, support), old_raw_divergence(zp, zq, kind, support)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), "the divergence is infinite where it is not"
        fin = torch.isfinite(want)
        assert torch.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5), f"{kind}/{support}: {got} ≠ {want}"
