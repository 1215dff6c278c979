"""A qualifier of the target's shapes may take the target's prompt keys and values (`qualifier_prompt` "target"):
what it holds after the prefill, what its draft reads, and that lossless methods stay exact."""

import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM

from pyramid_demo.core.engine import prefill, roles_for, shares_prompt
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.cache import VerifierStates
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [5, 9, 14, 3, 27, 8, 41, 12, 6, 19, 33, 7]


def _lms(t, method: str = "psd_a") -> dict:
    return {r: t.open(r) for r in roles_for(method)}


def test_the_qualifier_holds_the_targets_prompt_cache_and_ran_no_forward():
    """With "target", the qualifier's cache after the prefill is the target's, slot for slot, keys and values,
    and the qualifier made no forward; with "own" it made its own (a noisy copy's keys differ)."""
    t = tiny_random_triplet(seed=0)
    lms = _lms(t)
    assert shares_prompt(lms)
    prefill(lms, PROMPT, True)
    q, tg, n = lms["qualifier"], lms["target"], len(PROMPT) - 1
    assert q.n_forward == 0 and tg.n_forward == 1
    assert q.ids == tg.ids == PROMPT[:-1]
    for mine, theirs in zip(q.kv, tg.kv, strict=True):
        assert torch.equal(mine[:, :n], theirs[:, :n])
    own = _lms(t)
    prefill(own, PROMPT)
    assert own["qualifier"].n_forward == 1
    assert not torch.allclose(own["qualifier"].kv[0][:, :n], tg.kv[0][:, :n]), "the copies' caches differ"


def test_the_qualifier_continues_from_the_adopted_cache_as_the_target_would():
    """The next pass of a qualifier that took the target's cache gives what the same qualifier weights give over
    the target's keys and values: the pass reads the adopted slots (checked against the target itself by a
    family whose qualifier is the target)."""
    t = tiny_random_triplet(seed=0)
    same = dataclasses.replace(t, qualifier=t.target)
    lms = _lms(same)
    prefill(lms, PROMPT, True)
    z_q = lms["qualifier"].forward(PROMPT[-1:] + [4], len(PROMPT) - 1, 2)
    z_t = lms["target"].forward(PROMPT[-1:] + [4], len(PROMPT) - 1, 2)
    assert torch.allclose(z_q, z_t, atol=1e-6)


def test_the_draft_reads_the_targets_states_for_the_prompt():
    """A feature draft under a qualifier that took the target's cache is fed the target's states for the
    prompt (the target publishes them during its prefill), and afterwards the qualifier publishes again."""
    t = tiny_random_triplet(seed=0)
    t = dataclasses.replace(t, draft=FeatureDraft(t.target, torch.arange(t.vocab_size)))
    lms = _lms(t)
    prefill(lms, PROMPT, True)
    states = lms["draft"].states
    assert lms["qualifier"].publish is states and lms["target"].publish is None
    ref = open_lm(t.target, t.vocab_size, "target")
    ref.publish = VerifierStates(states.taps)
    ref.feed(PROMPT[:-1], 1)
    n = len(PROMPT) - 1
    assert states.n == n
    assert torch.allclose(states.f[:n], ref.publish.f[:n], atol=1e-6)


def test_a_qualifier_of_other_shapes_prefills_its_own():
    """A qualifier whose cache has other shapes than the target's cannot take it: a run asked for "target"
    prefills the qualifier's own, and its record says so (a family of the target's shapes records "target")."""
    t = tiny_random_triplet(seed=0)
    cfg = tiny_config(t.vocab_size)
    cfg.num_hidden_layers += 1
    torch.manual_seed(0)
    other = dataclasses.replace(t, qualifier=LlamaForCausalLM(cfg).eval())
    assert not shares_prompt(_lms(other))
    with pytest.raises(ValueError, match="cannot take the target's prompt cache"):
        prefill(_lms(other), PROMPT, True)
    asked = DecodeConfig(method="psd_a", max_new_tokens=4, qualifier_prompt="target")
    assert generate(other, "the quick brown fox", asked).config["qualifier_prompt"] == "own"
    assert generate(t, "the quick brown fox", asked).config["qualifier_prompt"] == "target"


@pytest.mark.parametrize("method", ["psd_a", "psd_f"])
def test_lossless_with_the_shared_prompt(method):
    """At T=0 PSD_A over the target's prompt cache writes AR's text, and PSD_F's qualifier still proposes (its
    tokens reach the target): sharing changes what the qualifier sees, not the target's check."""
    t = tiny_random_triplet(seed=0)
    prompt = "the quick brown fox jumps over"
    ar = generate(t, prompt, DecodeConfig(method="ar", max_new_tokens=24))
    run = generate(t, prompt, DecodeConfig(method=method, max_new_tokens=24, stage2="sd", qualifier_prompt="target"))
    if method == "psd_a":
        assert run.token_ids == ar.token_ids
    assert run.stats.accepted["target"] > 0
