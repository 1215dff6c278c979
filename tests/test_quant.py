"""A quantized copy as a family member: the int4 layer's arithmetic, the copy, its name, its refusals, its memory."""
from __future__ import annotations

import pytest
import torch
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core.engine import connect
from pyramid_demo.forward.lean import LeanLM
from pyramid_demo.models import loading, memory, presets
from pyramid_demo.models.errors import LoadError
from pyramid_demo.models.quant import Fp16Linear, Int4Linear, int4_copy, parse_quant, quantize_groups, refusal
from pyramid_demo.models.tiny import tiny_random_triplet


def _dequantized(lin: torch.nn.Linear, group: int) -> torch.Tensor:
    """The weight the int4 layer computes with: (code − 8)·scale + zero, scales and zeros in bf16."""
    codes, scale, zero = quantize_groups(lin.weight.detach(), group)
    s = scale.bfloat16().float().repeat_interleave(group, 1)
    z = zero.bfloat16().float().repeat_interleave(group, 1)
    return (codes.float() - 8) * s + z  # [N, K]


def _small_llama() -> torch.nn.Module:
    """A tiny Llama at a trained model's weight scale (the tiny-random preset's 0.5 saturates attention, where any
    rounding flips it)."""
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config

    cfg = tiny_config(320)
    cfg.initializer_range = 0.05
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_parse_quant_names_the_source_and_group() -> None:
    """'X@int4' is X at group 32; '@int4gN' sets the group; anything else after '@' is refused in one line."""
    assert parse_quant("owner/m@int4") == ("owner/m", 32)
    assert parse_quant("owner/m@int4g128") == ("owner/m", 128)
    assert parse_quant("owner/m") == ("owner/m", None)
    with pytest.raises(LoadError, match="@int4g32"):
        parse_quant("owner/m@int4g7")
    with pytest.raises(LoadError, match="only model suffix is @int4"):
        parse_quant("owner/m@fp8")


def test_group_quantization_recovers_4bit_codes_of_a_q4_1_block() -> None:
    """A Q4_1 block (w = d·q + m, codes spanning 0..15) re-quantized per group gives back its own codes."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (8, 64), generator=g)
    q[:, ::32] = 0
    q[:, 1::32] = 15  # every block spans the full range, as a Q4_1 block's min and max do
    d = torch.rand(8, 2, generator=g).repeat_interleave(32, 1) * 0.01 + 1e-3
    m = torch.randn(8, 2, generator=g).repeat_interleave(32, 1) * 0.01
    codes, _, _ = quantize_groups(d * q + m, 32)
    assert torch.equal(codes, q.to(torch.int32)), "min/max group quantization must recover a Q4_1 block's codes"


def test_int4_linear_computes_with_the_dequantized_weight() -> None:
    """Int4Linear(x) = x·Ŵᵀ + b for the dequantized Ŵ, up to bf16 rounding of the activations and output."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 192)
    layer = Int4Linear.from_linear(lin, 32)
    x = torch.randn(5, 128)
    ref = x.bfloat16().float() @ _dequantized(lin, 32).t() + lin.bias.detach()
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == (5, 192)
    assert (got - ref).abs().max() < 0.02 * ref.abs().max(), "the int4 layer must compute with its own codes"
    err_q = (ref - lin(x).detach()).abs().mean()
    assert err_q < 0.1 * lin(x).abs().mean(), "4-bit groups of 32 stay close to the full weight"


def test_fused_int4_linears_equal_the_parts_bitwise() -> None:
    """Joining int4 layers over one input (the lean forward's QKV and gate/up) changes no output bit."""
    torch.manual_seed(1)
    parts = [Int4Linear.from_linear(torch.nn.Linear(128, n, bias=False), 32) for n in (128, 64, 64)]
    fused = Int4Linear.fuse(parts)
    assert fused is not None and fused.out_features == 256
    x = torch.randn(3, 128)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], -1))
    assert Int4Linear.fuse([Int4Linear.from_linear(torch.nn.Linear(128, 32), 32)] * 2) is None  # not a row block


def test_int4_copy_swaps_every_linear_and_shares_the_rest() -> None:
    """The copy quantizes every linear (the head to fp16 on a CPU with fbgemm), shares embeddings and norms, and
    leaves its source untouched."""
    t = _small_llama()
    before = t.lm_head.weight.detach().clone()
    c = int4_copy(t, 32)
    assert not any(type(m) is torch.nn.Linear for m in c.modules()), "every linear must be quantized"
    assert isinstance(c.lm_head, Fp16Linear | Int4Linear)
    assert c.get_input_embeddings().weight.data_ptr() == t.get_input_embeddings().weight.data_ptr()
    assert c.model.norm.weight.data_ptr() == t.model.norm.weight.data_ptr()
    assert type(t.model.layers[0].self_attn.q_proj) is torch.nn.Linear and torch.equal(t.lm_head.weight, before)
    x = torch.tensor([[5, 9, 11, 3]])
    with torch.no_grad():
        zt, zc = t(x).logits[0], c(x).logits[0]  # [4, V]
    rel = ((zt - zc).norm() / zt.norm()).item()  # 4 bits a weight: about 0.12 of its std per layer here
    assert rel < 0.25, f"the copy's logits must stay near its source's (relative error {rel:.3f})"


def test_lean_forward_runs_the_copy_as_hf_does() -> None:
    """The lean forward (fused int4 layers) gives the copy's HF logits, to float rounding."""
    c = int4_copy(tiny_random_triplet().target, 32)
    ids = [5, 9, 11, 3, 7]
    lm = LeanLM(c, c.config.vocab_size, "qualifier")
    z = lm.forward(ids, 0, len(ids))
    with torch.no_grad():
        ref = c(torch.tensor([ids])).logits[0].float()
    assert torch.allclose(z, ref, atol=2e-2, rtol=0), (z - ref).abs().max()


def test_refusal_names_what_would_work() -> None:
    """A width the group does not divide is refused naming a group that fits; an unsupported device too."""
    m = torch.nn.Sequential(torch.nn.Linear(64, 64))
    assert "@int4g64" in refusal(m, 128)
    assert refusal(m, 32) is None
    with pytest.raises(LoadError, match="not a multiple of 256"):
        int4_copy(m, 256)


def test_family_names_the_targets_copy() -> None:
    """'target@int4' in a custom family is the family's target, quantized; the target slot refuses a copy."""
    _, refs = loading.parse_spec("a/draft,target@int4,b/target")
    assert refs == ("a/draft", "b/target@int4", "b/target")
    with pytest.raises(LoadError, match="reference precision"):
        loading.parse_spec("a/draft,b/q,b/target@int4")
    assert presets.PRESETS["llama3-int4"].qualifier == presets.PRESETS["llama3-int4"].target + "@int4"


def test_memory_estimate_counts_the_copy() -> None:
    """The int4 copy's weights cost about a quarter of its source's linears plus a 16-bit head."""
    from pyramid_demo.models.tiny import tiny_config

    cfg = tiny_config(300)
    size = memory.int4_size("qualifier", "x@int4", cfg, torch.float32, 32)
    params, embed = memory.count_params(cfg)
    assert size.weight_bytes == int((params - embed) * (0.5 + 4 / 32) + 300 * 64 * 2)
    assert size.kv_bytes_per_token == memory.kv_per_token(cfg, 4)


def test_a_pyramids_draft_reads_the_qualifier_sd_draft_the_target() -> None:
    """The draft reads the states of the model it proposes to: the qualifier in a pyramid, else the target."""
    table = bigram_table(8, 0)

    def family(roles):
        lms = {r: BigramLM(table, r) for r in roles}
        lms["draft"].states = None
        return lms

    pyr = family(("draft", "qualifier", "target"))
    connect(pyr)
    assert pyr["qualifier"].publish is pyr["draft"].states is not None and pyr["target"].publish is None
    sd = family(("draft", "target"))
    connect(sd)
    assert sd["target"].publish is sd["draft"].states is not None
