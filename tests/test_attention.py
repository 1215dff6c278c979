"""Row-wise attention (core.attention): a verification pass equals one-token steps."""
import dataclasses

import torch
from transformers import LlamaForCausalLM

from pyramid_demo.core.attention import rowwise_attention, use_rowwise
from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.lm import CachedLM
from pyramid_demo.core.run import generate
from pyramid_demo.models.tiny import tiny_config, tiny_random_triplet


class _Heads(torch.nn.Module):
    num_key_value_groups = 2


def test_rows_attend_exactly_like_one_token_queries():
    """Each row of an n-token query equals a one-token query over its own causal prefix, bitwise."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=g).bfloat16()  # [B, H, n, D]
    k = torch.randn(1, 2, 12, 8, generator=g).bfloat16()  # [B, H_kv, L, D]: 7 cached + 5 new
    v = torch.randn(1, 2, 12, 8, generator=g).bfloat16()
    out, _ = rowwise_attention(_Heads(), q, k, v, None, scaling=0.35)  # [B, n, H, D]
    for i in range(5):
        one, _ = rowwise_attention(_Heads(), q[:, :, i: i + 1], k[:, :, : 8 + i], v[:, :, : 8 + i], None, scaling=0.35)
        assert torch.equal(out[:, i: i + 1], one)


def test_rowwise_model_matches_sdpa_model():
    """Switching a model to row-wise attention changes no logits beyond rounding (fp32)."""
    t = tiny_random_triplet(seed=3)
    ids = list(range(5, 30))
    ref = CachedLM(t.target, t.vocab_size, "target")
    ref.logits(ids[:20], 1)
    want = ref.logits(ids, 5)
    assert use_rowwise(t.target)
    got_lm = CachedLM(t.target, t.vocab_size, "target")
    got_lm.logits(ids[:20], 1)
    got = got_lm.logits(ids, 5)
    assert torch.allclose(got, want, atol=1e-5)


def _small_init_triplet():
    """tiny-random's tokenizer with realistically scaled weights (init 0.02), in bf16: at this
    scale a fused-attention pass rounds differently from one-token steps on this CPU."""
    t = tiny_random_triplet(seed=5)
    cfg = tiny_config(t.vocab_size)
    cfg.initializer_range = 0.02
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(LlamaForCausalLM(cfg).eval().to(torch.bfloat16))
    return dataclasses.replace(t, draft=models[0], qualifier=models[0], target=models[1])


def test_bf16_passes_equal_steps_and_sd_equals_ar():
    """bf16 with row-wise attention and oneDNN off: a 5-token pass gives the logits of five
    one-token steps bitwise, so SD at T=0 is AR's text token for token."""
    t = _small_init_triplet()
    for m in (t.draft, t.target):
        assert use_rowwise(m)
    ids = [7 + (i * 37) % (t.vocab_size - 10) for i in range(220)]
    with torch.backends.mkldnn.flags(enabled=False):
        for n0 in (20, 60, 120, 190):
            a = CachedLM(t.target, t.vocab_size, "target")
            a.logits(ids[:n0], 1)
            pass_z = a.logits(ids[: n0 + 5], 5)
            b = CachedLM(t.target, t.vocab_size, "target")
            b.logits(ids[:n0], 1)
            step_z = torch.cat([b.logits(ids[: n0 + 1 + i], 1) for i in range(5)])
            assert torch.equal(pass_z, step_z)
        ar = generate(t, ids[:20], DecodeConfig(method="ar", max_new_tokens=24))
        sd = generate(t, ids[:20], DecodeConfig(method="sd", max_new_tokens=24, gamma=4))
    assert sd.token_ids == ar.token_ids


def test_packed_linears_are_batch_invariant_and_match_the_model():
    """Packing a bf16 model's linears for oneDNN (core.packed) keeps its logits (to bf16 rounding)
    and a k-token pass equals k one-token steps bitwise, as SD at T=0 needs."""
    import pytest

    from pyramid_demo.core.packed import available, pack_linears
    if not available(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not run bf16")
    t = _small_init_triplet()
    ids = [7 + (i * 37) % (t.vocab_size - 10) for i in range(220)]
    plain = CachedLM(t.target, t.vocab_size, "target")
    plain.logits(ids[:60], 1)
    want = plain.logits(ids[:65], 5)
    assert use_rowwise(t.target) and pack_linears([t.target]) > 0
    a = CachedLM(t.target, t.vocab_size, "target")
    a.logits(ids[:60], 1)
    got = a.logits(ids[:65], 5)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    b = CachedLM(t.target, t.vocab_size, "target")
    b.logits(ids[:60], 1)
    assert torch.equal(got, torch.cat([b.logits(ids[: 61 + i], 1) for i in range(5)]))
