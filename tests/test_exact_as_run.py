"""Exactness is measured on the forward that runs (`models.checks.check_family`): every role on the LM a run opens
for it, the target as it hands out its states to a proposer that reads it, each kind of pass in one place."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.feature_lm import FeatureLM
from pyramid_demo.forward.lm import HFLM, forward_of
from pyramid_demo.models import checks
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")
PLAN = ((12, (2, 3, 5)),)
TREE_PLAN = ((20, (2, 17)),)  # a pass long enough for every tree shape


class SkewedDecoder(torch.nn.Module):
    """The target's decoder, off by a lot on every multi-row pass (a batch-variant kernel), as HF's path calls it
    only when the target hands out its states (`base_model`, then the head)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids=None, cache=None, **kw):
        out = self.inner(input_ids=input_ids, cache=cache, **kw)
        if out.last_hidden_state.shape[1] > 1:
            out.last_hidden_state = out.last_hidden_state + 0.1
        return out


class SkewedTarget(LlamaForCausalLM):
    """A Llama under another name: the core forward does not cover it, so it runs HF's forward (`forward_of`)."""

    @property
    def base_model(self):
        return SkewedDecoder(self.model)


def _skewed_target() -> torch.nn.Module:
    t = tiny_random_triplet(seed=0).target
    t.__class__ = SkewedTarget
    return t


def test_the_target_is_checked_with_the_states_it_hands_out():
    """A family whose draft reads the target runs the target's forward that hands out its states; a batch-variant
    kernel there makes its passes differ from its steps by far more than rounding. The family's check sees it,
    though the same target checked alone (its plain forward) differs by rounding only."""
    target = _skewed_target()
    vocab = tiny_random_triplet().vocab_size
    assert forward_of(target) == "hf"
    alone = checks.check_family({"target": target}, vocab, PLAN)["target"]
    assert alone["top1"] and alone["max_abs_diff"] < 1e-3, "the skew must hide from the plain forward (else vacuous)"
    read = checks.check_family({"draft": FeatureDraft(target, torch.arange(vocab)), "target": target}, vocab, PLAN)
    assert read["target"]["max_abs_diff"] > 1e-2 and read["target"]["exact"] is False, (
        "the target was not checked on the forward that hands out its states"
    )


def test_every_role_is_checked_on_the_forward_it_runs(monkeypatch):
    """Draft (a feature draft fed the target's states), qualifier and target each get a record, each on the LM a run
    opens for it (`forward_of`); the target, publishing its states to the draft, is checked on chains and trees (it
    decides the lossless claim), the proposers on chains."""
    t = tiny_random_triplet(seed=0)
    models = {"draft": FeatureDraft(t.target, torch.arange(t.vocab_size)), "qualifier": t.qualifier, "target": t.target}
    opened: list[tuple[str, object]] = []
    real = checks.open_lm
    monkeypatch.setattr(
        checks, "open_lm", lambda m, v, role, run=None: opened.append((role, real(m, v, role, run))) or opened[-1][1]
    )
    rec = checks.check_family(models, t.vocab_size, TREE_PLAN)
    assert set(rec) == {"draft", "qualifier", "target"}
    kinds = {"feature": FeatureLM, "eager": CoreLM, "compiled": CoreLM, "hf": HFLM}
    checked = {role for role, _ in opened}
    assert checked == set(models)
    for role, lm in opened:
        assert type(lm) is kinds[forward_of(models[role])], (role, type(lm).__name__)
    assert all(lm.publish is not None for role, lm in opened if role == "target"), "the target hid its states"
    assert rec["target"]["kinds"] == ["chain", "tree"] and rec["target"]["trees"]["passes"] > 0
    for role in ("draft", "qualifier"):
        assert rec[role]["kinds"] == ["chain"] and rec[role]["passes"] > 0 and rec[role]["trees"] is None, role


def test_a_new_kind_of_pass_is_added_in_one_place(monkeypatch):
    """Another kind of pass is one entry in `checks.PASS_CHECKS`: the family's check then runs it on the target
    (the forward that decides the lossless claim), on the LMs it opens, and its failures count in the record."""
    seen: list[str] = []

    def never_exact(lm, ids, context, ks):
        seen.append(lm.role)
        return [{"k": 2, "context": context, "bitwise": False, "top1": True, "max_abs_diff": 1.0}]

    monkeypatch.setitem(checks.PASS_CHECKS, "planted", never_exact)
    t = tiny_random_triplet(seed=0)
    rec = checks.check_family({"draft": t.draft, "target": t.target}, t.vocab_size, PLAN)
    assert seen == ["target"]
    assert rec["target"]["kinds"] == ["chain", "planted"] and rec["target"]["exact"] is False
    assert rec["draft"]["kinds"] == ["chain"]
