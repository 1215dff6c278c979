"""The core forward's weights follow the model (`forward.weights`): its fused linears hold no weight of their own (the
model's layers are views of the fused ones) through casts, rebuilds, deep copies and training steps, and a swapped
layer is never served from stale fused weights."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pyramid_demo.forward.core import CoreLM
from pyramid_demo.forward.lm import HFLM
from pyramid_demo.forward.weights import Dense, weights

V = 300
IDS = [(i * 37 + 5) % (V - 10) + 3 for i in range(40)]
SIZE = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.5,
)


def family(name: str) -> torch.nn.Module:
    """A tiny random Llama or Qwen2 (its q/k/v biases given values a zero init would hide), large weights: a stale or
    misplaced weight shows in the logits."""
    torch.manual_seed(0)
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**SIZE)).eval()
    model = Qwen2ForCausalLM(Qwen2Config(**SIZE)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _shares(model: torch.nn.Module) -> bool:
    """Every layer's q/k/v and gate/up weights (and biases) live in the storage of the fused tensor the core
    forward reads."""
    w = weights(model)
    for lay, fused_lay in zip(model.model.layers, w.layers):
        groups = (
            (lay.self_attn.q_proj, lay.self_attn.k_proj, lay.self_attn.v_proj, fused_lay.qkv),
            (lay.mlp.gate_proj, lay.mlp.up_proj, fused_lay.gate_up),
        )
        for *parts, fused in groups:
            assert isinstance(fused, Dense)
            if any(_storage(p.weight) != _storage(fused.weight) for p in parts):
                return False
            if fused.bias is not None and any(_storage(p.bias) != _storage(fused.bias) for p in parts):
                return False
    return True


def test_fused_weights_are_the_layers_own_storage_through_cast_rebuild_and_copy(one_thread):
    """Rule: the fused q/k/v (with Qwen2's biases) and gate/up are the storage the model's own linears read, so each
    weight is resident once; a cast rebuilds them shared again, a rebuild for another reason reuses them as they
    are, and a deep copy's are its own; HF's forward and the core one still agree."""
    model = family("qwen2")
    assert _shares(model), "a fused weight is a copy beside the layers' own"
    assert (CoreLM(weights(model), V, "t").feed(IDS[:12], 4) - HFLM(model, V, "t").feed(IDS[:12], 4)).abs().max() < 1e-4
    fused = weights(model).layers[0].qkv.weight.data_ptr()
    model.model.layers[1].self_attn.o_proj = torch.nn.Linear(64, 64, bias=False)  # another layer swapped: a rebuild
    assert weights(model).layers[0].qkv.weight.data_ptr() == fused, "a rebuild copied the fused weight anew"
    twin = copy.deepcopy(model)
    assert _shares(twin) and _storage(twin.model.layers[0].self_attn.q_proj.weight) != _storage(
        model.model.layers[0].self_attn.q_proj.weight
    )
    model.to(torch.bfloat16)
    assert weights(model).dtype == torch.bfloat16 and _shares(model)


def test_a_training_step_moves_the_fused_weights_with_the_layers(one_thread):
    """Rule: built under inference mode, the fused weights are still ordinary tensors the layers' parameters view,
    so an optimizer step outside inference mode updates what the core forward reads: the next build reads the same
    tensors (no copy)."""
    model = family("llama")
    with torch.inference_mode():
        built = weights(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.tensor([IDS[:8]])).logits.float().pow(2).mean()
    loss.backward()
    opt.step()
    again = weights(model)
    assert all(
        a.qkv.weight.data_ptr() == b.qkv.weight.data_ptr()
        and a.gate_up.weight.data_ptr() == b.gate_up.weight.data_ptr()
        for a, b in zip(again.layers, built.layers)
    )
    with torch.no_grad():
        want = HFLM(model, V, "t").feed(IDS[:12], 4)
    assert (CoreLM(weights(model), V, "t").feed(IDS[:12], 4) - want).abs().max() < 1e-4


class Wrapped(torch.nn.Module):
    """A linear layer without a `.weight` of its own, as a quantised layer is."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.inner = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _fresh(lin: torch.nn.Linear, seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    new = torch.nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
    with torch.no_grad():
        new.weight.copy_(torch.randn(new.weight.shape, generator=g) * 0.5)
    return new


def test_a_swapped_layer_without_a_weight_rebuilds_the_core_weights(one_thread):
    """Rule: swapping one weightless layer for another of the same type (q_proj here) builds the core weights
    anew, so the core forward computes what HF's forward computes with the new layer, not the old one."""
    model = family("llama")
    for lay in model.model.layers:
        lay.self_attn.q_proj = Wrapped(lay.self_attn.q_proj)
    old = weights(model)
    model.model.layers[1].self_attn.q_proj = Wrapped(_fresh(model.model.layers[1].self_attn.q_proj.inner, 1))
    assert weights(model) is not old, "a swapped q_proj kept the stale core weights"
    want = HFLM(model, V, "t").feed(IDS[:24], 4)
    got = CoreLM(weights(model), V, "t").feed(IDS[:24], 4)
    assert (got - want).abs().max() < 1e-4
