"""Row-wise attention (forward.attention): a verification pass equals one-token steps."""
import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM

from pyramid_demo.core.config import DecodeConfig
from pyramid_demo.core.run import generate
from pyramid_demo.forward.attention import rowwise_attention, use_rowwise
from pyramid_demo.forward.lm import CachedLM
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
    ref.feed(ids[:20], 1)
    want = ref.feed(ids, 5)
    assert use_rowwise(t.target)
    got_lm = CachedLM(t.target, t.vocab_size, "target")
    got_lm.feed(ids[:20], 1)
    got = got_lm.feed(ids, 5)
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
            a.feed(ids[:n0], 1)
            pass_z = a.feed(ids[: n0 + 5], 5)
            b = CachedLM(t.target, t.vocab_size, "target")
            b.feed(ids[:n0], 1)
            step_z = torch.cat([b.feed(ids[: n0 + 1 + i], 1) for i in range(5)])
            assert torch.equal(pass_z, step_z)
        ar = generate(t, ids[:20], DecodeConfig(method="ar", max_new_tokens=24))
        sd = generate(t, ids[:20], DecodeConfig(method="sd", max_new_tokens=24, gamma=4))
    assert sd.token_ids == ar.token_ids


def test_packed_linears_are_batch_invariant_and_match_the_model():
    """Packing a bf16 model's linears for oneDNN (forward.packed) keeps its logits (to bf16 rounding)
    and a k-token pass equals k one-token steps bitwise, as SD at T=0 needs."""
    import pytest

    from pyramid_demo.forward.packed import available, pack_linears
    if not available(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not run bf16")
    t = _small_init_triplet()
    ids = [7 + (i * 37) % (t.vocab_size - 10) for i in range(220)]
    plain = CachedLM(t.target, t.vocab_size, "target")
    plain.feed(ids[:60], 1)
    want = plain.feed(ids[:65], 5)
    assert use_rowwise(t.target) and pack_linears([t.target]) > 0
    a = CachedLM(t.target, t.vocab_size, "target")
    a.feed(ids[:60], 1)
    got = a.feed(ids[:65], 5)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    b = CachedLM(t.target, t.vocab_size, "target")
    b.feed(ids[:60], 1)
    assert torch.equal(got, torch.cat([b.feed(ids[: 61 + i], 1) for i in range(5)]))


# ---------------------------------------------------------------- the lean forward's padded attention, any threads
def _offline_heads(dtype: torch.dtype) -> LlamaForCausalLM:
    """One layer with the offline target's attention shapes (9 query heads over 3 KV heads of 64): the kernel's
    scratch, hence its rounding, depends on exactly these."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=64, hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=9,
                      num_key_value_heads=3, head_dim=64, max_position_embeddings=2048)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(dtype).eval()


POSITIONS = (60, 100, 113, 147, 211, 400, 430, 460, 560)  # inside buckets, across edges, past `lean.KV_SPLIT`
PASSES = (2, 3, 5, 9, 17, 33, 65)


def _threads(n: int):
    import contextlib

    @contextlib.contextmanager
    def at():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)
    return at()


def test_padded_attention_is_batch_invariant_at_one_and_two_threads():
    """Rule: the lean forward's attention gives every row of a pass bitwise what a one-token step gives it, at 1
    and at 2 threads, fp32 and bf16, over the batched shapes the runs send (rows of a 17-token pass among them).
    At 2 threads torch's CPU attention computes each (row, head) in one thread's scratch, and a scratch of
    another alignment rounds otherwise: without the aligned key length (`key_pad` 0, every pass batched) fp32 rows
    differ here."""
    from pyramid_demo.forward.lean import LeanLM, scratch_pad

    assert scratch_pad(3, 64) == 14
    for dtype in (torch.float32, torch.bfloat16):
        model = _offline_heads(dtype)
        for threads in (1, 2):
            with _threads(threads):
                lm = LeanLM(model, 64, "t")
                bad = [(p, k) for p in POSITIONS for k in PASSES
                       if not lm.check_attention(p, k, seed=p + 1000 * k)["bitwise"]]
                assert not bad, (dtype, threads, bad)


def test_a_pass_past_the_key_split_gives_each_row_a_steps_call(monkeypatch):
    """Rule: rows are batched into one attention call only where that call is batch-invariant: at one thread
    always (the kernel runs every item inline), at more only while the key length keeps every thread's scratch
    aligned (≤ `lean.KV_SPLIT` keys); past it, and under `set_attention(model, "rows")`, each row gets a one-token
    step's own call."""
    import torch.nn.functional as F

    from pyramid_demo.forward import lean

    model = _offline_heads(torch.float32)
    calls: list[int] = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    for threads, pos, kind, want in ((2, 100, "auto", 1), (2, 460, "auto", 5), (1, 460, "auto", 1),
                                     (2, 100, "rows", 5), (1, 100, "rows", 5)):
        lean.set_attention(model, kind)
        with _threads(threads):
            lm = lean.LeanLM(model, 64, "t")
            lm.feed([i % 60 + 1 for i in range(pos)], 1)
            calls.clear()
            lm.feed([i % 60 + 1 for i in range(pos + 5)], 5)
        assert len(calls) == want, (threads, pos, kind, len(calls))
    with pytest.raises(ValueError):
        lean.set_attention(model, "batched")


def test_the_probe_refuses_a_batch_variant_attention(monkeypatch):
    """Rule: the probe uses batched attention only where its attention check saw it bitwise; a kernel that rounds
    a batched call's rows otherwise (planted: one ulp on every batch of more than one) is refused, and the model
    then attends row by row, which the same check finds exact."""
    import torch.nn.functional as F

    from pyramid_demo.forward import lean
    from pyramid_demo.models import probe
    from pyramid_demo.models.probe import exactness

    model = _offline_heads(torch.float32)
    monkeypatch.setattr(probe.search, "EXACT_PLAN", ((100, (2, 5, 17)),))
    sdpa = F.scaled_dot_product_attention

    def variant(q, *a, **kw):
        out = sdpa(q, *a, **kw)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if q.shape[0] > 1 else out

    with _threads(1):
        assert probe.choose_attention(model, 64, "default") == "auto"
        monkeypatch.setattr(lean.F, "scaled_dot_product_attention", variant)
        lean.set_attention(model, "auto")
        rec = exactness.check_model(lambda: lean.LeanLM(model, 64, "t"), 64, ((100, (5,)),),
                                    kinds=("attention",))
        assert not rec["exact"] and rec["attention"]["bitwise_passes"] == 0
        assert probe.choose_attention(model, 64, "default") == "rows" and lean.attention_of(model) == "rows"
        rec = exactness.check_model(lambda: lean.LeanLM(model, 64, "t"), 64, ((100, (5,)),),
                                    kinds=("attention",))
        assert rec["exact"] and rec["attention"]["passes"] == len(exactness.ATTENTION_AT)


class _PaddedLinear(torch.nn.Module):
    """A linear whose calls of fewer than `min_rows` rows are padded with zero rows, as `forward.packed` pads: from
    some padding on, fp32 BLAS rows no longer depend on the call's row count (here: 4 rows at 1 thread, 16 at 2)."""

    def __init__(self, linear: torch.nn.Linear, min_rows: int = 1):
        super().__init__()
        self.weight, self.bias, self.min_rows = linear.weight, linear.bias, min_rows
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        rows = flat.shape[0]
        if rows < self.min_rows:
            flat = torch.cat([flat, flat.new_zeros(self.min_rows - rows, self.in_features)])
        return torch.nn.functional.linear(flat, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)


def test_lean_passes_and_trees_equal_steps_at_two_threads():
    """End to end at 2 threads: a model with the offline target's attention shapes (fp32, its linears padded to the
    row count from which BLAS rows are batch-invariant here) gives bitwise the logits of one-token steps on chain
    passes of up to 17 tokens and on tree passes, near the start of the cache and past the attention kernel's key
    split. fp32 is where the unaligned batched attention of before differed on most rows."""
    from pyramid_demo.forward.lean import LeanLM
    from pyramid_demo.forward.packed import invariant_pad
    from pyramid_demo.models.probe import exactness

    model = _offline_heads(torch.float32)
    with _threads(2):
        linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
        pad = invariant_pad(linears, 17, (1, 2, 4, 8, 16, 32), pack=_PaddedLinear)
        if pad is None:
            pytest.skip("this CPU's fp32 linears are batch-variant at every padding tried")
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, _PaddedLinear(child, pad))
        rec = exactness.check_model(lambda: LeanLM(model, 64, "t"), 64,
                                    ((100, (2, 5, 9, 17)), (450, (5, 17))), kinds=("attention", "chain", "tree"))
    assert rec["threads"] == 2 and rec["attention"]["exact"], rec
    assert rec["exact"] and rec["passes"] == 6, rec
    assert rec["trees"] and rec["trees"]["exact"] and rec["trees"]["passes"] >= 6, rec["trees"]
