"""Exactness is measured on the forward that runs: the target as it hands out its states to a proposer that
reads it, and every role, each kind of pass (`exactness.PASS_CHECKS`)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pyramid_demo.forward.attention import use_rowwise
from pyramid_demo.forward.lm import CachedLM
from pyramid_demo.models import probe
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.probe import exactness
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
PLAN = ((12, (2, 3, 5)),)


class SkewedDecoder(torch.nn.Module):
    """The target's decoder, off by a little on every multi-row pass (a batch-variant kernel), as HF's path
    calls it only when the target hands out its states (`base_model`, then the head)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids=None, cache=None, use_cache=None, **kw):
        out = self.inner(input_ids=input_ids, cache=cache, use_cache=use_cache, **kw)
        if out.last_hidden_state.shape[1] > 1:
            out.last_hidden_state = out.last_hidden_state + 1e-3
        return out


def family(skewed: bool = False):
    """The tiny family in bf16 with row-wise attention and oneDNN off (exact as it is, see test_exactness),
    with a draft that reads the target; `skewed`: the target's states-handing forward is batch-variant, while
    its plain forward stays exact."""
    t = tiny_random_triplet(seed=0)
    target, qualifier = t.target.to(torch.bfloat16), t.qualifier.to(torch.bfloat16)
    assert use_rowwise(target)
    if skewed:
        target.__class__ = type("SkewedTarget", (type(target),),
                                {"base_model": property(lambda self: SkewedDecoder(self.model))})
    draft = FeatureDraft(target, torch.arange(t.vocab_size))
    return dataclasses.replace(t, draft=draft, qualifier=qualifier, target=target, path="hf", backend="no-onednn",
                               dtype=torch.bfloat16)


@pytest.fixture
def small_plan(monkeypatch):
    monkeypatch.setattr(probe.search, "EXACT_PLAN", PLAN)


def test_the_target_is_checked_with_the_states_it_hands_out(small_plan):
    """A family whose draft reads the target runs the target's forward that hands out its states; a
    batch-variant kernel there makes its passes differ from its steps. The family's check must see it,
    although the target's plain forward (all the old probe opened) is exact."""
    t = family(skewed=True)
    plain = exactness.check_model(lambda: CachedLM(t.target, t.vocab_size, "target", t.backend), t.vocab_size, PLAN)
    assert plain["exact"], "the skew must hide from the target's plain forward (else this test is vacuous)"
    rec = probe.check_triplet(t)
    target = rec.get("target", rec)
    assert target["exact"] is False, "the target was not checked on the forward that hands out its states"


def test_the_probe_checks_each_candidate_on_the_forward_the_family_runs(monkeypatch):
    """`probe_target(..., publish=True)` (a family whose proposer reads the target) records a candidate whose
    states-handing forward is batch-variant as not exact; without states the same candidate looks exact."""
    t = family(skewed=True)
    monkeypatch.setattr(probe.search, "EXACT_PLAN", PLAN)
    monkeypatch.setattr(probe.search, "candidates", lambda: [("bfloat16", "no-onednn")])
    monkeypatch.setattr(probe.search, "candidate_model", lambda target, dt, backend: (target, 1))
    monkeypatch.setattr(probe.search, "supports_lean", lambda m: False)

    class Timer:
        def __init__(self, *a, **k):
            pass

        def time(self, k):
            return 0.01

    monkeypatch.setattr(probe.search, "make_timer", Timer)
    assert probe.probe_target(t.target, t.vocab_size).exactness["bfloat16/no-onednn/hf"]["exact"]
    got = probe.probe_target(t.target, t.vocab_size, publish=True)
    assert got.exactness["bfloat16/no-onednn/hf"]["exact"] is False


def test_every_role_is_checked_on_the_forward_it_runs(small_plan):
    """Draft (a feature draft fed the target's states), qualifier and target each get a record, checked on
    every kind of pass but trees (those are checked once, on the target's chosen forward, by `probe_target`);
    on this exact tiny family every role is exact. HF's forward has no attention check of its own (its row-wise
    attention gives every row a step's own call), so only its chain passes produce records."""
    rec = probe.check_triplet(family())
    assert set(rec) == {"draft", "qualifier", "target"}
    for role, r in rec.items():
        assert r["kinds"] == ["chain"] and r["attention"] is None and r["passes"] > 0, role
        assert r["exact"], (role, r)


def test_a_new_kind_of_pass_is_added_in_one_place(small_plan, monkeypatch):
    """Another kind of pass (a tree, later) is one entry in `exactness.PASS_CHECKS`: the probe then checks it
    for every role, on the same opened LMs, and its failures count in the record."""
    seen: list[str] = []

    def never_exact(lm, ids, context, ks):
        seen.append(lm.role)
        return [{"k": 2, "context": context, "bitwise": False, "top1": True, "max_abs_diff": 1.0}]

    monkeypatch.setitem(exactness.PASS_CHECKS, "planted", never_exact)
    rec = probe.check_triplet(family())
    assert sorted(seen) == ["draft", "qualifier", "target"]
    assert all(r["kinds"] == ["chain", "planted"] and r["exact"] is False for r in rec.values())


def test_a_proposer_whose_passes_differ_is_said():
    """The choice's summary names a proposer whose passes were measured unequal to its steps, and keeps the
    lossless claim on the target's record."""
    ok = {"exact": True, "top1": True, "passes": 3, "bitwise_passes": 3, "max_abs_diff": 0.0, "max_k": 5}
    got = probe.Choice("float32", "default", "probe", exactness={"float32/default/hf": ok},
                       roles={"target": ok, "draft": {**ok, "exact": False}, "qualifier": ok})
    assert got.exact and "draft's passes differ" in got.summary and "qualifier" not in got.roles_text
    back = probe.Choice.from_entry(got.to_entry())
    assert back is not None and back.roles == got.roles


def test_a_reduced_heads_zeros_are_no_difference():
    """A reduced-head proposer's logits are −inf outside its subset: equal −inf at the same place is no
    difference (never NaN in the record), while a finite logit against −inf is an infinite one."""
    from mock_lm import BigramLM

    table = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    table[:, 4:] = float("-inf")
    rec = exactness.summarise(exactness.pass_vs_steps(BigramLM(table), [1, 2, 3, 1, 2, 3, 0, 1], 3, (2, 4)))
    assert rec["exact"] and rec["max_abs_diff"] == 0.0
