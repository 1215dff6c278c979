"""HF's forward on a sliding-window model (Mistral-style): the cache rolls back past the window, exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from mock_lm import as_run
from transformers import MistralConfig, MistralForCausalLM

from pyramid_demo.core.engine import decode, prefill, roles_for
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.forward.lm import HFLM

pytestmark = pytest.mark.usefixtures("one_thread")
V, WINDOW = 64, 4


def mistral(window: int | None, seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    cfg = MistralConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=window,
        max_position_embeddings=128,
    )
    return MistralForCausalLM(cfg).eval()


def noisy(model: MistralForCausalLM, scale: float, seed: int) -> MistralForCausalLM:
    """A copy of `model` with noise on every weight: a draft that agrees with it only partly."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


@torch.no_grad()
def uncached_greedy(model: MistralForCausalLM, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    return seq[len(ids) :]


def test_cached_steps_past_the_window_equal_the_uncached_forward():
    """One-token cached steps well past the window, with a rollback of 3 in between, give the logits of the
    uncached forward over the same tokens (the window is kept in the mask), which differ from a model without
    a window (so the window is really in force)."""
    m = mistral(WINDOW)
    lm = HFLM(m, V, "target")
    ids = list(range(1, 13))  # 12 tokens: three windows
    lm.forward(ids, 0, 1)
    try:
        lm.truncate(9)  # a rejection: drop 3 positions past the window
    except RuntimeError as e:
        pytest.fail(f"the cache could not roll back past the sliding window: {e}")
    steps = torch.cat([lm.forward([t], pos, 1) for pos, t in zip(range(9, 12), ids[9:])])  # [3, V]
    with torch.no_grad():
        full = m(input_ids=torch.tensor([ids]), use_cache=False).logits[0, 9:12]  # [3, V]
        unwindowed = mistral(None)(input_ids=torch.tensor([ids]), use_cache=False).logits[0, 9:12]
    assert torch.allclose(steps, full, atol=1e-5), "cached logits past a rollback ≠ the uncached forward"
    assert not torch.allclose(full, unwindowed, atol=1e-3), "the window made no difference (a vacuous test)"


@pytest.mark.parametrize("method", ["sd", "psd_a"])
def test_lossless_methods_run_past_the_window_and_stay_exact(method):
    """SD and the lossless pyramid at T=0 on a sliding-window family run 30 tokens (rolling back after each
    rejection, far past the window) and give the target's own greedy text."""
    target = mistral(WINDOW)
    models = {"target": target, "draft": noisy(target, 0.05, 1), "qualifier": noisy(target, 0.02, 2)}
    ids = [3, 7, 11, 5]
    cfg = DecodeConfig(method=method, stage2="sd", gamma=3, l_d=2, l_q=4, max_new_tokens=30)
    lms = {r: HFLM(models[r], V, r) for r in roles_for(method)}
    prefill(lms, ids)
    try:
        steps = list(decode(lms, ids, as_run(cfg), (), None))
    except RuntimeError as e:
        pytest.fail(f"{method} died rolling back a sliding-window cache: {e}")
    out = [t for s in steps for t in s.new_tokens]
    assert out == uncached_greedy(target, ids, 30), "a lossless method left the target's greedy text"
    assert any(s.target_round.n_accepted < len(s.target_round.tokens) - 1 for s in steps), "no rollback happened"


def test_hfs_forward_takes_no_tree_where_a_layer_slides():
    """Rule: HF's forward gets a tree as a 4-D mask that carries no sliding window, so over a model whose layers slide
    the HF adapter takes chains only (a tree asked for runs as a chain); without a window it takes trees."""
    assert not HFLM(mistral(4), V, "target").trees
    assert HFLM(mistral(None), V, "target").trees
