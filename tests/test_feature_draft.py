"""A proposer that reads the target (EAGLE-style): what it reads, its cache, and SD's exactness with it."""

import dataclasses

import pytest
import torch
from mock_lm import as_run
from transformers import LlamaForCausalLM

from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.core import finish, project, rope_table
from pyramid_demo.forward.lm import open_lm
from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet
from training import feature_train as ft

pytestmark = pytest.mark.usefixtures("one_thread")


def _states(target, ids: list[int]) -> torch.Tensor:
    """The target's final normed state at every position of ids [n, d]."""
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


def _records(target, n_seq: int, n_new: int, seed: int) -> list[dict]:
    """The target's own greedy continuations of random prompts, with its states (training.features' layout)."""
    g = torch.Generator().manual_seed(seed)
    V = target.config.vocab_size
    out = []
    for _ in range(n_seq):
        ids = torch.randint(3, V, (4,), generator=g).tolist()
        for _ in range(n_new):
            with torch.no_grad():
                ids.append(int(target(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        out.append({"ids": torch.tensor(ids), "n_prompt": 4, "f": _states(target, ids)[:-1].clone()})
    return out


@pytest.fixture(scope="module")
def trained():
    """The tiny family with a feature draft fitted briefly to the target's greedy text (so it accepts)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a module fixture runs before `one_thread`
    t = tiny_random_triplet(seed=0)
    fd = FeatureDraft(t.target, torch.arange(t.vocab_size))
    recs = _records(t.target, 24, 20, seed=1)
    opt = torch.optim.Adam(fd.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(120):
        b = ft.collate([recs[(step * 4 + j) % len(recs)] for j in range(4)])
        loss, _ = ft.loss_fn(fd, b, passes=2, gen=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    fd.eval()
    torch.set_num_threads(threads)
    return dataclasses.replace(t, draft=fd), recs


def test_inference_reads_what_training_read(trained):
    """Teacher-forced rows of the run-time cache (FeatureLM, fed the target's states) predict the same
    states as the training forward's first pass; the first row fed its own prediction matches pass 2."""
    t, recs = trained
    r = recs[0]
    ids = r["ids"].tolist()
    b = ft.collate([r])
    with torch.no_grad():
        p1, p2 = t.draft.forward_train(b["f_prev"], b["tokens"], passes=2)
    lms = {"draft": open_lm(t.draft, t.vocab_size, "draft"), "target": open_lm(t.target, t.vocab_size, "target")}
    n = 12
    prefill(lms, ids[: n + 1])  # rows 0 .. n-1 fed with true states
    d = lms["draft"]
    assert torch.allclose(d.pred[:n], p1[0, :n], atol=1e-5), "cached rows differ from the training forward"
    d.forward([ids[n]], n, 1)  # row n reads the target's state at n-1: known, since the target scored it
    assert torch.allclose(d.pred[n], p1[0, n], atol=1e-5)
    d.forward([ids[n + 1]], n + 1, 1)  # row n+1: the target has not scored n, so it reads its own prediction
    assert torch.allclose(d.pred[n + 1], p2[0, n + 1], atol=1e-5), "the drafted row is not pass 2's"


def test_rows_fed_a_predicted_state_are_dropped_once_the_target_scores_them(trained):
    """After a target pass the proposer keeps only rows that read the target's own states."""
    t, recs = trained
    ids = recs[1]["ids"].tolist()
    lms = {"draft": open_lm(t.draft, t.vocab_size, "draft"), "target": open_lm(t.target, t.vocab_size, "target")}
    prefill(lms, ids[:8])
    d, tg = lms["draft"], lms["target"]
    d.forward(ids[7:10], 7, 1)  # row 7 true (state 6 known), rows 8, 9 predicted
    assert d.true_upto == 8
    assert d.truncate(10) == 10, "nothing scored yet: the predicted rows stay"
    tg.forward(ids[7:10], 7, 3)  # the target scores positions 7 .. 9
    assert d.truncate(10) == 8, "rows 8 and 9 read predicted states the target has now replaced"


def test_sd_with_a_feature_draft_equals_target_greedy_and_accepts(trained):
    """SD at T=0 with a proposer that reads the target is still the target's own greedy text, and the
    proposer's tokens are accepted (the check is not vacuous)."""
    t, recs = trained
    for prompt in ("the quick brown fox", recs[0]["ids"][:4].tolist()):  # unseen text; a prompt it was fitted on
        ar = generate(t, prompt, DecodeConfig(method="ar", max_new_tokens=32))
        sd = generate(t, prompt, DecodeConfig(method="sd", gamma=4, max_new_tokens=32))
        assert sd.token_ids == ar.token_ids
    assert sd.stats.accepted["target"] > 0


def test_feature_draft_in_a_lossless_pyramid_equals_target_greedy(trained):
    """The feature draft under a qualifier (PSD_A, stage 2 'sd') keeps the target's greedy text."""
    t, recs = trained
    prompt = recs[2]["ids"][:4].tolist()
    ar = generate(t, prompt, DecodeConfig(method="ar", max_new_tokens=30))
    out = generate(t, prompt, DecodeConfig(method="psd_a", stage2="sd", l_d=2, l_q=4, max_new_tokens=30))
    assert out.token_ids == ar.token_ids
    assert out.stats.accepted["qualifier"] > 0


@pytest.mark.slow
def test_sampled_sd_with_a_feature_draft_follows_the_target():
    """At T=1, SD with a feature draft samples the target's law: over 2,500 runs the joint law of the first
    two tokens (vocabulary 4) is within total variation 0.06 of the target's (noise alone ~0.03)."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_config(4)).eval()
    fd = FeatureDraft(target, torch.arange(4)).eval()
    prompt = [1, 2]
    with torch.no_grad():
        p_a = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
        p_b = torch.stack(
            [torch.softmax(target(input_ids=torch.tensor([prompt + [a]])).logits[0, -1], -1) for a in range(4)]
        )
    expected = p_a[:, None] * p_b  # [4, 4]
    cfg = DecodeConfig(method="sd", temperature=1.0, gamma=2, max_new_tokens=2)
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(4, 4)
    accepted = 0
    for _ in range(2500):
        lms = {r: open_lm(target if r == "target" else fd, 4, r) for r in roles_for("sd")}
        prefill(lms, prompt)
        steps = list(decode(lms, prompt, as_run(cfg), (), gen))
        out = [x for s in steps for x in s.new_tokens]
        accepted += sum(s.target_round.n_accepted for s in steps)
        counts[out[0], out[1]] += 1
    assert accepted > 0
    assert 0.5 * (counts / 2500 - expected).abs().sum().item() < 0.06


def test_fused_inference_weights_compute_the_training_layers_and_follow_a_weight_change():
    """The layer without gradients (joined weights) computes what the layer with them does, through the core's
    pieces, and follows an in-place change of a weight."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_config(32)).eval()
    fd = FeatureDraft(target, torch.arange(32))
    x = torch.randn(2, 5, 64)
    cos, sin = rope_table(fd.inv_freq, 5, torch.float32)

    def both():
        c, s = cos[:, None], sin[:, None]
        with torch.enable_grad():
            w = fd.weights()
            a = project(w.layers[0], x, c, s, w)
            fa = finish(w.layers[0], x, a[0], fd.eps)
        with torch.no_grad():
            w = fd.weights()
            b = project(w.layers[0], x, c, s, w)
            fb = finish(w.layers[0], x, b[0], fd.eps)
        for u, w in zip((*a, fa), (*b, fb)):
            assert torch.allclose(u, w, atol=1e-5)

    both()
    with torch.no_grad():
        fd.k.mul_(2.0)  # an in-place change (as an optimizer step or a load makes) rebuilds the fused weights
        fd.up.add_(0.5)
    both()
