"""The proposer confidence stop (`conf_stop`, beyond the papers): the stop rule, engine and exactness."""

import math

import pytest
import torch
from mock_lm import BigramLM, as_run
from test_engine import check_caches, greedy_ar, joint_two_tokens

from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import METHODS, DecodeConfig
from pyramid_demo.core.round import confidence, confident_prefix, propose_chain
from pyramid_demo.core.run import generate
from pyramid_demo.forward.lm import HFLM
from pyramid_demo.models.tiny import tiny_random_triplet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_triplet(seed=0)


def test_confidence_is_the_largest_raw_probability():
    """Logits [0, ln 3] give probabilities [.25, .75]: confidence .75, at any logit offset."""
    z = torch.tensor([[0.0, math.log(3.0)], [100.0, 100.0]])
    assert torch.allclose(confidence(z), torch.tensor([0.75, 0.5]))
    assert torch.allclose(confidence(z + 1000.0), torch.tensor([0.75, 0.5]), atol=1e-3)


def test_confident_prefix_keeps_the_first_unsure_token():
    """A proposer stops *after* its first token below the floor; floor 0 keeps everything."""
    assert confident_prefix([0.9, 0.3, 0.8], 0.5) == 2
    assert confident_prefix([0.2, 0.9], 0.5) == 1
    assert confident_prefix([0.9, 0.8], 0.5) == 2
    assert confident_prefix([0.1, 0.1], 0.0) == 2


def test_propose_stops_after_an_unsure_token():
    """Token 0 is followed by 1 at probability ~1; after 1 every token is equally likely
    (confidence 1/4): with conf_stop 0.5 the draft proposes 2 tokens instead of 4."""
    table = torch.zeros(4, 4)
    table[0, 1] = 20.0
    for stop, n in ((0.0, 4), (0.5, 2)):
        lm = BigramLM(table, "draft")
        x, z = propose_chain(lm, [0], 4, DecodeConfig(method="sd", conf_stop=stop), None)
        assert len(x) == n and z.shape == (n, 4) and x[0] == 1


@pytest.mark.parametrize("method,kw", [("sd", {"gamma": 4}), ("psd_a", {"stage2": "sd", "l_d": 3, "l_q": 6})])
@pytest.mark.parametrize("stop", [0.3, 0.9])
def test_lossless_methods_stay_exact_with_conf_stop(tiny, method, kw, stop):
    """At T=0 SD and the lossless pyramid still give target greedy output token for token."""
    out = generate(tiny, "hello", DecodeConfig(method=method, conf_stop=stop, max_new_tokens=40, **kw))
    assert out.token_ids == greedy_ar(tiny, "hello")


@pytest.mark.slow  # many sampled runs (the slow tier, which CI runs)
def test_sampled_sd_with_conf_stop_reproduces_target_distribution():
    """A draft length chosen from the draft's own confidence keeps SD exact at T=1 (TV < 0.05
    over 4,000 runs, as in test_engine)."""
    emp, exp = joint_two_tokens("sd", 4000, gamma=3, conf_stop=0.45)
    assert 0.5 * (emp - exp).abs().sum().item() < 0.05


def test_psd_block_ends_at_an_unsure_qualifier_token(tiny):
    """With a floor no token reaches, every stage-1 round drafts one token and every block
    sent to the target holds exactly one token."""
    out = generate(tiny, "hello", DecodeConfig(method="psd_f", conf_stop=0.999, l_d=3, l_q=6, max_new_tokens=20))
    for step in out.steps:
        if step.target_round:
            assert len(step.target_round.tokens) == 2  # one block token + the target's own
            assert all(len(r.tokens) == 2 for r in step.qualifier_rounds)


@pytest.mark.parametrize("method", METHODS[1:])
def test_cache_lengths_with_conf_stop(tiny, method):
    """Early stops leave every cache holding only the committed prefix (T=1, so rounds vary)."""
    cfg = DecodeConfig(method=method, temperature=1.0, gamma=4, l_d=3, l_q=6, conf_stop=0.4, max_new_tokens=30)
    ids = tiny.tokenizer("hello world")["input_ids"]
    lms = {r: HFLM(tiny.model(r), tiny.vocab_size, r) for r in roles_for(method)}
    prefill(lms, ids)
    seq = list(ids)
    for step in decode(lms, ids, as_run(cfg), (), torch.Generator().manual_seed(2)):
        seq += step.new_tokens
        check_caches(lms, seq)
        assert len(lms["target"].ids) == len(seq) - 1
    assert len(seq) - len(ids) == 30


def test_throughput_model_uses_measured_lengths_under_conf_stop():
    """With conf_stop γ/ℓ are maxima: the formulas get the mean proposal length per round."""
    from pyramid_demo.predict.throughput import lengths

    cfg = {"gamma": 4, "l_d": 4, "l_q": 8}
    assert lengths(cfg, {"target": 30}, {"target": 20}) == cfg
    got = lengths({**cfg, "conf_stop": 0.5}, {"qualifier": 40, "target": 30}, {"qualifier": 20, "target": 20})
    assert got == {"gamma": 1.5, "l_d": 2.0, "l_q": 1.5}
