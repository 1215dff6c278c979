"""A quantized copy as a family member: the int4 layer's arithmetic, the copy, its name, its refusals, its memory."""

from __future__ import annotations

import pytest
import torch
from mock_lm import BigramLM, bigram_table

from pyramid_demo.core.engine import connect
from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.weights import weights
from pyramid_demo.models import loading, memory, presets
from pyramid_demo.models.errors import LoadError
from pyramid_demo.models.quant import Fp16Linear, Int4Linear, int4_copy, label, parse_quant, quantize_groups, refusal
from pyramid_demo.models.tiny import tiny_random_triplet


def _dequantized(lin: torch.nn.Linear, group: int) -> torch.Tensor:
    """The weight the int4 layer computes with: (code − 8)·scale + zero, scales and zeros in bf16."""
    codes, scale, zero = quantize_groups(lin.weight.detach(), group)
    return _dequant(codes, scale, zero, group)


def _dequant(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    s = scale.float().repeat_interleave(group, 1)
    z = zero.float().repeat_interleave(group, 1)
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


def test_codes_are_the_nearest_under_the_bf16_scales_the_kernel_reads() -> None:
    """Each code is the nearest one under the bf16 scale and zero the kernel reads (rounded before quantizing, as
    gpt-fast does), and the layer holds exactly those scales and zeros: codes from fp32 qparams shift groups."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 256, generator=g) * 0.02 + torch.randn(96, 1, generator=g) * 0.05  # [N, K]
    codes, scale, zero = quantize_groups(w, 32)
    assert scale.dtype == zero.dtype == torch.bfloat16
    lo, hi = w.reshape(-1, 32).amin(1), w.reshape(-1, 32).amax(1)
    assert torch.equal(scale.flatten(), ((hi - lo) / 15).bfloat16())
    s = scale.float().repeat_interleave(32, 1)
    err = (_dequant(codes, scale, zero, 32) - w).abs()
    for step in (-1, 1):
        other = codes + step
        ok = (other >= 0) & (other <= 15)
        err_other = (_dequant(other, scale, zero, 32) - w).abs()
        assert (err <= err_other + 1e-6 * s)[ok].all(), "a code is not the nearest under the kernel's qparams"
    layer = Int4Linear.from_linear(_linear_of(w), 32)
    assert torch.equal(layer.scales_zeros, torch.stack([scale, zero], 2).transpose(0, 1))  # [K/32, N, 2]


def _linear_of(w: torch.Tensor) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    return lin


def test_a_q4_1_weight_comes_back_through_the_kernel() -> None:
    """A weight from Q4_1 blocks (w = d·q + m per group, codes 0..15 spanning each block, d and m in bf16) is
    quantized back to its own codes and scales, and the kernel's dequantized weight (its output for the identity)
    is the source's weight exactly wherever the block's zero m + 8d is a bf16 number, within half its step
    elsewhere."""
    g = torch.Generator().manual_seed(0)
    n, k, group = 64, 128, 32
    q = torch.randint(0, 16, (n, k), generator=g)
    q[:, ::group], q[:, 1::group] = 0, 15
    d = torch.randint(16, 256, (n, k // group), generator=g).float() / 1024  # 8 significant bits: bf16 numbers
    m = torch.randint(-255, 256, (n, k // group), generator=g).float() / 1024
    w = d.repeat_interleave(group, 1) * q + m.repeat_interleave(group, 1)  # exact in fp32
    codes, scale, zero = quantize_groups(w, group)
    assert torch.equal(codes, q.to(torch.int32)) and torch.equal(scale.float(), d)
    z = m + 8 * d
    exact = (z.bfloat16().float() == z).repeat_interleave(group, 1)  # [N, K]
    assert 0 < exact.float().mean() < 1
    layer = Int4Linear.from_linear(_linear_of(w), group)
    kernel = layer(torch.eye(k)).t()  # [N, K]: the kernel's dequantized weight, in bf16
    assert torch.equal(kernel, _dequant(codes, scale, zero, group).bfloat16().float())
    assert torch.equal(kernel[exact], w.bfloat16().float()[exact]), "an exact block did not come back"
    half_step = (z.abs() * 2.0**-8).repeat_interleave(group, 1)  # half a bf16 step of the zero, at most
    assert ((_dequant(codes, scale, zero, group) - w).abs() <= half_step)[~exact].all()


def test_each_layer_of_a_copy_runs_the_fixed_format_and_fused_parts_hold_nothing() -> None:
    """In an int4 copy every body linear is int4 and the head fp16 (where fbgemm runs); embeddings and norms are the
    source's. Once the core weights are built, layers fused for it (gate/up; q/k/v where the int4 row block allows)
    are columns of the fused layer, holding no bytes of their own, and the head is called as it is, not re-packed."""
    from pyramid_demo.forward.weights import weights
    from pyramid_demo.models.quant import fp16_available

    if not fp16_available():
        pytest.skip("no fbgemm: the copy is int4 throughout")
    t = _small_llama()
    c = int4_copy(t, 32)
    lay = c.model.layers[0]
    linears = [
        lay.self_attn.q_proj,
        lay.self_attn.k_proj,
        lay.self_attn.v_proj,
        lay.self_attn.o_proj,
        lay.mlp.gate_proj,
        lay.mlp.up_proj,
        lay.mlp.down_proj,
    ]
    assert all(type(m) is Int4Linear for m in linears) and type(c.lm_head) is Fp16Linear
    assert c.model.layers[0].input_layernorm.weight is t.model.layers[0].input_layernorm.weight
    w = weights(c)
    assert w.head.__self__ is c.lm_head, "the head must be called as it is, not re-packed"
    gate, up = lay.mlp.gate_proj, lay.mlp.up_proj
    assert gate.part_of is up.part_of is w.layers[0].gate_up.__self__ and gate.weight_bytes == 0
    # k/v are 32 wide, not a multiple of the CPU layout's 64-row block: q/k/v stay apart
    assert lay.self_attn.q_proj.part_of is None
    x = torch.randn(2, 64)
    assert torch.equal(gate(x), w.layers[0].gate_up(x)[:, :128])


def test_fusing_fp16_layers_builds_no_throwaway_linear(monkeypatch) -> None:
    """Fusing fp16 layers goes from their weights to the fused layer: no full-size `nn.Linear` is built and randomly
    initialized on the way; a single fp16 layer is not fused (no second copy)."""
    from pyramid_demo.models.quant import fp16_available

    if not fp16_available():
        pytest.skip("no fbgemm: no fp16 layers")
    parts = [Fp16Linear(lin.weight, lin.bias) for lin in (torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))]
    monkeypatch.setattr(torch.nn.Linear, "reset_parameters", lambda self: pytest.fail("a throwaway nn.Linear"))
    fused = Fp16Linear.fuse(parts)
    assert fused is not None and fused.out_features == 96 and Fp16Linear.fuse(parts[:1]) is None
    x = torch.randn(3, 64)
    assert torch.allclose(fused(x), torch.cat([p(x) for p in parts], -1), atol=1e-6)


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
    """Joining int4 layers over one input (the core forward's QKV and gate/up) changes no output bit."""
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


def test_core_forward_runs_the_copy_as_hf_does() -> None:
    """The core forward (fused int4 layers) gives the copy's HF logits, to float rounding."""
    c = int4_copy(tiny_random_triplet().target, 32)
    ids = [5, 9, 11, 3, 7]
    lm = CoreLM(weights(c), c.config.vocab_size, "qualifier")
    z = lm.forward(ids, 0, len(ids))
    with torch.no_grad():
        ref = c(torch.tensor([ids])).logits[0].float()
    assert torch.allclose(z, ref, atol=2e-2, rtol=0), (z - ref).abs().max()


def test_the_label_names_the_heads_own_format(monkeypatch) -> None:
    """An int4 copy whose head could not take fp16 weights (no fbgemm) is labelled with an int4 head: the label
    reads the head it holds, not the format it would hold elsewhere."""
    from pyramid_demo.models import quant

    m = _small_llama()
    monkeypatch.setattr(quant, "fp16_available", lambda: False)
    c = int4_copy(m, 32)
    assert isinstance(c.get_output_embeddings(), Int4Linear)
    assert label(c) == "int4 weights, int4 head"
    monkeypatch.undo()
    if quant.fp16_available():
        assert label(int4_copy(m, 32)) == "int4 weights, fp16 head"


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
    """The draft reads the states of the model it proposes to: the qualifier in a pyramid, else the target, publishes
    where the draft reads them (the draft's own `states`)."""
    from pyramid_demo.forward.cache import VerifierStates

    table = bigram_table(8, 0)

    def family(roles):
        lms = {r: BigramLM(table, r) for r in roles}
        lms["draft"].states = VerifierStates()
        return lms

    pyr = family(("draft", "qualifier", "target"))
    connect(pyr)
    assert pyr["qualifier"].publish is pyr["draft"].states is not None and pyr["target"].publish is None
    sd = family(("draft", "target"))
    connect(sd)
    assert sd["target"].publish is sd["draft"].states is not None
