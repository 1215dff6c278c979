"""Exactness is measured, never assumed (`models.checks`): a batch-variant forward is recorded not exact, a value
only close is no equal one, what users read comes from the record, and on the real offline target the lossless
methods write AR's text wherever the record says its passes are exact."""

from __future__ import annotations

import pytest
import torch
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.models import checks

PLAN = ((12, (2, 3, 5, 9)), (20, (2, 4)))


class BatchVariant(BigramLM):
    """The bigram mock behind a fake kernel: a one-row call rounds its result up by one ulp, as a GEMV path might,
    while calls of two or more rows do not."""

    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        z = super()._run(tokens, pos, keep)  # [keep, V]
        return torch.nextafter(z, torch.full_like(z, float("inf"))) if len(tokens) == 1 else z


def test_a_batch_variant_forward_is_not_exact():
    """A forward whose one-row result differs in the last bit makes k-token passes differ from steps: the record
    (`checks.check_model` over a plan) says not exact, where the same forward without the fake kernel is exact."""
    table = bigram_table(64, 3, 3.0)
    plain = checks.check_model(lambda ids: BigramLM(table), 64, PLAN)
    assert plain["exact"] and plain["bitwise_passes"] == plain["passes"] == 6, "vacuous: the base is not exact"
    rec = checks.check_model(lambda ids: BatchVariant(table), 64, PLAN)
    assert rec["exact"] is False and rec["bitwise_passes"] < rec["passes"] == 6
    assert rec["top1"] and rec["max_abs_diff"] > 0 and rec["max_k"] == 9


def test_claims_follow_the_record():
    """What users read comes from the record: exact, top-1 only, not exact, or not measured yet (never assumed)."""
    assert checks.describe(
        {"exact": True, "top1": True, "passes": 3, "bitwise_passes": 3, "max_abs_diff": 0.0, "max_k": 65}
    ).startswith("exact: ")
    near = checks.describe(
        {"exact": False, "top1": True, "passes": 3, "bitwise_passes": 0, "max_abs_diff": 6e-5, "max_k": 65}
    )
    assert near.startswith("not bitwise exact") and "near-ties" in near
    off = checks.describe(
        {"exact": False, "top1": False, "passes": 3, "bitwise_passes": 0, "max_abs_diff": 0.4, "max_k": 65}
    )
    assert off.startswith("not exact") and "top-1 differed" in off
    unmeasured = checks.describe(None)
    assert "not measured" in unmeasured and "prepare" in unmeasured and not unmeasured.startswith("exact:")


def test_a_check_given_values_that_are_only_close_fails():
    """Rule: exactness is bitwise (`torch.equal`), never a tolerance: a pass whose last row is one ulp from the
    step's (allclose by any standard) is not exact, for chain passes and tree passes alike."""

    class OneUlpOff(BigramLM):
        def _run(self, tokens, pos, keep):
            z = super()._run(tokens, pos, keep)  # [keep, V]
            if keep > 1:  # a multi-row pass: its last row one ulp up
                z[-1] = torch.nextafter(z[-1], torch.full_like(z[-1], float("inf")))
            return z

        def _run_tree(self, rows, base, pos):
            z = super()._run_tree(rows, base, pos)  # [n, V]
            z[-1] = torch.nextafter(z[-1], torch.full_like(z[-1], float("inf")))
            return z

    table = bigram_table(40, seed=3)
    ids = [(5 * i + 1) % 40 for i in range(60)]
    exact = checks.summarise(checks.pass_vs_steps(BigramLM(table), ids, 10, (2, 5)))
    assert exact["exact"], "the bigram is exact as it is (else this test is vacuous)"
    got = checks.pass_vs_steps(OneUlpOff(table), ids, 10, (2, 5))
    assert all(c["top1"] and 0 < c["max_abs_diff"] < 1e-5 for c in got), "the rows are only close"
    assert not any(c["bitwise"] for c in got) and not checks.summarise(got)["exact"]
    trees = [{**c, "kind": "tree"} for c in checks.tree_passes(OneUlpOff(table), ids, 10, (17,))]
    assert trees and not checks.summarise(trees)["trees"]["exact"]
    assert checks.summarise([{**c, "kind": "tree"} for c in checks.tree_passes(BigramLM(table), ids, 10, (17,))])[
        "trees"
    ]["exact"]


def test_a_reduced_heads_zeros_are_no_difference():
    """A reduced-head proposer's logits are −inf outside its subset: equal −inf at the same place is no
    difference (never NaN in the record), while a finite logit against −inf is an infinite one."""
    table = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    table[:, 4:] = float("-inf")
    rec = checks.summarise(checks.pass_vs_steps(BigramLM(table), [1, 2, 3, 1, 2, 3, 0, 1], 3, (2, 4)))
    assert rec["exact"] and rec["max_abs_diff"] == 0.0


@pytest.mark.slow
def test_lossless_methods_equal_ar_on_the_real_target_where_the_record_says_exact(offline_cache):
    """On this CPU, with the family's record measured as setup measures it (`runtime.measure_family`), the loaded
    family carries that record; wherever it says the target's passes are exact, SD and PSD_A with an exact stage 2
    write AR's text at T=0, token for token (2 prompts × 32 tokens)."""
    from pyramid_demo.core.run import generate
    from pyramid_demo.models import loading, runtime

    t = loading.load_triplet("smollm2-offline", device="cpu")
    rec = runtime.measure_family(t, profile=False)["checks"]["target"]
    t = loading.planned(t)
    assert t.exact is rec["exact"] and t.exact_note == checks.describe(rec)
    if not t.exact:
        pytest.skip(f"the record says not exact here: {t.exact_note}")
    for prompt in ("Explain in two sentences why the sky is blue.", "Write a haiku about a lighthouse."):
        outs = {}
        for method, kw in (("ar", {}), ("sd", {}), ("psd_a", {"stage2": "sd"})):
            cfg = DecodeConfig(method=method, max_new_tokens=32, gamma=4, l_d=3, l_q=8, **kw)
            outs[method] = generate(t, prompt, cfg).token_ids
        assert outs["sd"] == outs["ar"] and outs["psd_a"] == outs["ar"]
