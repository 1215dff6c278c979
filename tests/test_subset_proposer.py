"""Proposers whose head covers a token subset (FR-Spec; the feature draft's reduced head): SD's exactness with
them, divergences with zeros, and the subset file.

Tiny models, the bigram mock and hand-built logits only; explicit generators.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import verify
from mock_lm import BigramLM, SubsetHead, as_run, bigram_table

from pyramid_demo.core import rules
from pyramid_demo.core.engine import decode, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.models import feature_draft
from pyramid_demo.models.feature_draft import FeatureDraft, load_subset, save_subset
from pyramid_demo.models.tiny import tiny_random_triplet
from training import vocab as dv

pytestmark = pytest.mark.usefixtures("one_thread")
INF = float("inf")


# --- the head and its subset ---------------------------------------------------------------


def test_the_feature_drafts_head_is_a_copy_of_the_targets_rows():
    """The feature draft's head holds the target's rows for its subset; changing them leaves the target's
    head alone."""
    tiny = tiny_random_triplet(seed=1)
    before = tiny.target.lm_head.weight.detach().clone()
    fd = FeatureDraft(tiny.target, torch.arange(10))
    assert torch.equal(fd.head, before[:10])
    with torch.no_grad():
        fd.head.mul_(2)
    assert torch.equal(tiny.target.lm_head.weight, before)


def test_subset_file_round_trip_and_ranking(tmp_path, monkeypatch):
    """The ranking puts the always-kept ids first, then tokens by count (ties by id); the file keeps it;
    `draft-feature vocab` counts the answers of WORK/features/train and measures coverage on heldout."""
    counts = torch.tensor([0, 5, 9, 5, 0, 1])
    order = dv.rank(counts, always=(4,))
    assert order.tolist() == [4, 2, 1, 3, 5, 0]
    assert dv.coverage(order, counts, 3) == pytest.approx(14 / 20)
    save_subset(tmp_path / "v.safetensors", order[:3], {"n": 3})
    ids, meta = load_subset(tmp_path / "v.safetensors")
    assert ids.tolist() == [4, 2, 1] and meta["n"] == "3"

    import types

    from pyramid_demo.models import bundled
    from training import feature_cli

    monkeypatch.setattr(bundled, "bundled_tokenizer", lambda: _Tok())
    for split, answers in (("train", [[5, 5, 3, 0], [5, 2]]), ("heldout", [[5, 7]])):
        (tmp_path / "w" / "features" / split).mkdir(parents=True)
        recs = [{"ids": torch.tensor([1, 9] + a, dtype=torch.int32), "n_prompt": 2} for a in answers]
        torch.save(recs, tmp_path / "w" / "features" / split / "shard_00000.pt")
    args = types.SimpleNamespace(vocab_n=3, weights_dir=str(tmp_path / "out"))
    meta = feature_cli.make_vocab(tmp_path / "w", args)
    ids, saved = load_subset(feature_draft.subset_path(tmp_path / "out"))
    assert ids.tolist() == [0, 1, 5] and saved["n"] == "3"  # EOS, the other special id, then the most written
    assert meta["coverage_heldout"]["3"] == pytest.approx(0.5) and "draft-feature" in saved["made_by"]


class _Tok:
    """A tokenizer as `make_vocab` reads one: its length, EOS and special ids."""

    eos_token_id, all_special_ids = 0, [0, 1]

    def __len__(self) -> int:
        return 12


# --- exactness -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reduced_tiny():
    """The tiny family with the draft's head cut to a subset that misses some of the target's greedy tokens."""
    tiny = tiny_random_triplet(seed=0)
    ar = generate(tiny, "hello", DecodeConfig(method="ar", max_new_tokens=40)).token_ids
    seen = sorted(set(ar))
    keep = seen[::2] + [t for t in range(tiny.vocab_size) if t not in seen][:20]  # half of the target's tokens
    draft = tiny_random_triplet(seed=0).draft
    draft.lm_head = SubsetHead(draft.lm_head, torch.tensor(keep))
    return dataclasses.replace(tiny, draft=draft), ar, set(keep)


def test_sd_greedy_with_a_reduced_draft_equals_target_greedy(reduced_tiny):
    """SD at T=0 with a reduced-head draft gives the target's greedy text token for token, while
    accepting drafts and while the target writes tokens outside the draft's subset."""
    tri, ar, keep = reduced_tiny
    out = generate(tri, "hello", DecodeConfig(method="sd", gamma=4, max_new_tokens=40))
    assert out.token_ids == ar
    assert out.stats.accepted["target"] > 0
    assert any(t not in keep for t in ar)


def _joint_two_tokens(method: str, n_trials: int, subset: list[int], **kw) -> tuple[torch.Tensor, torch.Tensor]:
    V = 4
    tables = {"target": bigram_table(V, 1), "qualifier": bigram_table(V, 2), "draft": bigram_table(V, 3)}
    out_mask = torch.ones(V, dtype=torch.bool)
    out_mask[subset] = False
    tables["draft"] = tables["draft"].masked_fill(out_mask, -INF)  # q = 0 outside the subset
    cfg = DecodeConfig(method=method, temperature=1.0, max_new_tokens=2, **kw)
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(V, V)
    for _ in range(n_trials):
        lms = {r: BigramLM(tables[r], r) for r in roles_for(method)}
        toks = [t for s in decode(lms, [0], as_run(cfg), (), gen) for t in s.new_tokens]
        counts[toks[0], toks[1]] += 1
    p = torch.softmax(tables["target"], -1)
    return counts / n_trials, p[0][:, None] * p


@pytest.mark.parametrize(
    "method,kw",
    [("sd", {"gamma": 3}), pytest.param("psd_a", {"stage2": "sd", "l_d": 2, "l_q": 3}, marks=pytest.mark.slow)],
)
def test_sampled_sd_with_a_reduced_draft_reproduces_target_distribution(method, kw):
    """At T=1, SD with a draft that is 0 outside a subset of 2 of 4 tokens still samples the target's law:
    the joint law of the first two tokens is within total variation 0.05 of p_T(a|0)·p_T(b|a) over
    4,000 runs (the residual norm(max(0, p − q)) covers the tokens the draft cannot write; resampling
    from p_T instead gives about 0.2)."""
    emp, exp = _joint_two_tokens(method, 4000, [0, 2], **kw)
    assert 0.5 * (emp - exp).abs().sum().item() < 0.05
    assert emp[:, [1, 3]].sum() > 0.2  # tokens outside the draft's subset are written


# --- divergences for a proposer with zeros (CHOICE div_support) -----------------------------

P = torch.tensor([[0.6, 0.1, 0.3], [0.5, 0.3, 0.2], [0.0, 0.0, 1.0]])
Q = torch.tensor([[6 / 7, 1 / 7, 0.0], [0.5, 0.3, 0.2], [0.5, 0.5, 0.0]])  # row 0: q = p_S; row 2: p(S) = 0


def test_subset_js_charges_the_verifier_mass_outside_the_support():
    """subset: js = js(p_S, q) − log p(S); with q = p_S exactly that is −log 0.7 (not 0: the mass is charged)."""
    d = rules.support_divergence(P, Q, "js", "subset")
    assert d[0].item() == pytest.approx(-math.log(0.7), abs=1e-5)
    q2 = torch.tensor([[0.5, 0.5, 0.0]])
    p_s = torch.tensor([[6 / 7, 1 / 7, 0.0]])
    want = rules.divergence(p_s, q2, "js").item() - math.log(0.7)
    assert rules.support_divergence(P[:1], q2, "js", "subset").item() == pytest.approx(want, abs=1e-5)


def test_full_js_is_infinite_where_the_proposer_has_zeros():
    """full: js over the whole vocabulary is +inf where q = 0 < p (fuzzy acceptance can never fire)."""
    d = rules.support_divergence(P, Q, "js", "full")
    assert math.isinf(d[0].item()) and d[1].item() == pytest.approx(0.0, abs=1e-6)


def test_subset_kl_is_exactly_kl_of_proposer_to_verifier():
    """subset kl = KL(q‖p_S) − log p(S) = KL(q‖p): both choices agree for kl."""
    a = rules.support_divergence(P[:2], Q[:2], "kl", "subset")
    b = rules.divergence(P[:2], Q[:2], "kl")
    assert torch.allclose(a, b, atol=1e-5)


def test_subset_tv_bounds_full_tv_from_above():
    """subset tv = tv(p_S, q) + (1 − p(S)) ≥ tv(p, q), equal when q = p_S."""
    q = torch.tensor([[0.2, 0.8, 0.0], [6 / 7, 1 / 7, 0.0]])
    p = P[:1].expand(2, 3)
    sub, full = rules.support_divergence(p, q, "tv", "subset"), rules.divergence(p, q, "tv")
    assert (sub >= full - 1e-6).all() and sub[1].item() == pytest.approx(full[1].item(), abs=1e-6)
    assert sub[0].item() == pytest.approx(0.5 * (abs(6 / 7 - 0.2) + abs(1 / 7 - 0.8)) + 0.3, abs=1e-5)


@pytest.mark.parametrize("kind", ["js", "kl", "tv"])
def test_full_support_rows_are_unchanged_and_nothing_is_nan(kind):
    """A proposer without zeros gets `divergence` itself under subset; p(S) = 0 gives +inf (js, kl) or 1
    (tv: the supports are disjoint); never NaN, never negative."""
    d = rules.support_divergence(P, Q, kind, "subset", P.clamp_min(0).log(), Q.log())
    assert d[1].item() == pytest.approx(rules.divergence(P[1:2], Q[1:2], kind).item(), abs=1e-6)
    assert not torch.isnan(d).any() and (d >= 0).all()
    assert math.isinf(d[2].item()) if kind != "tv" else d[2].item() == pytest.approx(1.0)


def _fsd_round(support: str, tau: float):
    """One FSD target round: the draft (0 outside tokens 0-1) proposes token 0 where the target, renormalised
    on {0, 1}, is close to the draft but keeps 0.3 of its mass on token 2."""
    z_p = torch.tensor([[0.6, 0.1, 0.3], [0.2, 0.3, 0.5]]).log()
    z_q = torch.tensor([[0.8, 0.2, 0.0]]).log()
    cfg = DecodeConfig(method="fsd", divergence="js", div_support=support, tau_t=tau)
    rnd, _ = verify(z_p, z_q, [0], "fuzzy", tau, cfg, None, "draft", "target")
    return rnd


def test_engine_fuzzy_test_with_a_reduced_proposer_follows_the_choice():
    """In `verify`, subset js accepts a reduced-head proposal that is close on its support when τ exceeds
    −log p(S) plus the support divergence, and refuses it below; full js refuses it at any τ."""
    d = _fsd_round("subset", 0.5).tokens[0].div
    assert -math.log(0.7) < d < 0.5
    assert _fsd_round("subset", 0.5).n_accepted == 1
    assert _fsd_round("subset", -math.log(0.7)).n_accepted == 0  # the charge alone exceeds this τ
    assert _fsd_round("full", 100.0).n_accepted == 0


def test_a_lax_support_rule_is_caught(monkeypatch):
    """Planted wrong rule: renormalising the verifier on the support without charging its mass outside
    would accept a proposal the right rule refuses (the subset-js test above must fail under it)."""

    def lax(p, q, kind="js", support="subset", log_p=None, log_q=None):
        s = (q > 0).float()
        p_s = p * s / (p * s).sum(-1, keepdim=True)
        return rules.divergence(p_s, q, kind)

    def lax_logits(z_p, z_q, kind="js", support="subset"):
        return lax(torch.softmax(z_p, -1), torch.softmax(z_q, -1), kind, support)

    monkeypatch.setattr(rules, "support_divergence", lax)
    monkeypatch.setattr(rules, "support_divergence_logits", lax_logits)  # the engine's form, from logits
    with pytest.raises(AssertionError):
        test_subset_js_charges_the_verifier_mass_outside_the_support()
    with pytest.raises(AssertionError):
        test_engine_fuzzy_test_with_a_reduced_proposer_follows_the_choice()


def test_div_support_is_validated():
    """DecodeConfig refuses an unknown div_support."""
    with pytest.raises(ValueError, match="div_support"):
        DecodeConfig(div_support="maybe")


def test_shipped_subset_keeps_the_special_ids_and_its_record():
    """The shipped subset: distinct ids, the chat template's EOS / specials first, coverage in its metadata, and
    the size the shipped feature draft was exported with."""
    if not feature_draft.subset_path().is_file():
        pytest.skip("no shipped subset")
    ids, meta = load_subset(feature_draft.subset_path())
    assert ids.unique().numel() == ids.numel() == int(meta["n"])
    assert ids[:3].tolist() == [2, 1, 0]  # <|im_end|> (EOS), <|im_start|>, <|endoftext|>
    assert "coverage_heldout" in meta and "made_by" in meta
    if feature_draft.available():
        from safetensors import safe_open

        with safe_open(str(feature_draft.weight_path()), framework="pt") as fh:
            assert int(fh.metadata()["n_subset"]) == ids.numel()


@pytest.mark.parametrize("kind", ["js", "kl", "tv"])
def test_shared_support_shortcut_equals_the_masked_form(kind):
    """Rows that share one support (a reduced head) are computed from logits on its columns only; the value equals
    the masked whole-vocabulary form of `support_divergence` (to rounding)."""
    g = torch.Generator().manual_seed(4)
    V = 40
    z_p = torch.randn(3, V, generator=g)
    z_q = torch.randn(3, V, generator=g)
    z_q[:, 25:] = float("-inf")  # one shared support: the first 25 tokens
    assert rules.shared_support(z_q) is not None  # the shortcut is taken
    lp, lq = torch.log_softmax(z_p, -1), torch.log_softmax(z_q, -1)
    fast = rules.support_divergence_logits(z_p, z_q, kind, "subset")
    masked = rules.support_divergence(lp.exp(), lq.exp(), kind, "subset", lp, lq)
    assert torch.allclose(fast, masked, atol=1e-6, rtol=1e-5)
