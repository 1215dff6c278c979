"""The lean forward's built weights follow the model: a swapped layer is never served from stale fused weights."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pyramid_demo.forward import packed
from pyramid_demo.forward.lean import LeanLM
from pyramid_demo.forward.lean_weights import lean_weights
from pyramid_demo.forward.lm import CachedLM

V = 200
IDS = [(i * 37 + 5) % (V - 10) + 3 for i in range(24)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                      initializer_range=0.5)
    return LlamaForCausalLM(cfg).eval()


class Wrapped(torch.nn.Module):
    """A linear layer without a `.weight` of its own, as a quantised or packed layer is."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.inner = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _fresh(lin: torch.nn.Linear, seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    new = torch.nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
    with torch.no_grad():
        new.weight.copy_(torch.randn(new.weight.shape, generator=g))
    return new


def test_a_swapped_layer_without_a_weight_rebuilds_the_lean_weights(one_thread):
    """Rule: swapping one weightless layer for another of the same type (q_proj here) builds the lean weights
    anew, so the lean forward computes what HF's forward computes with the new layer, not the old one."""
    model = _model()
    for lay in model.model.layers:
        lay.self_attn.q_proj = Wrapped(lay.self_attn.q_proj)
    old = lean_weights(model)
    model.model.layers[1].self_attn.q_proj = Wrapped(_fresh(model.model.layers[1].self_attn.q_proj.inner, 1))
    assert lean_weights(model) is not old, "a swapped q_proj kept the stale lean weights"
    want = CachedLM(model, V, "t").feed(IDS, 4)
    got = LeanLM(model, V, "t").feed(IDS, 4)
    assert (got - want).abs().max() < 1e-4


@pytest.mark.skipif(not packed.available(torch.bfloat16), reason="this CPU's oneDNN does not run bf16")
def test_a_new_packed_linear_with_other_padding_rebuilds_the_lean_weights(one_thread):
    """Rule: after `q_proj` is swapped for a new `PackedLinear(min_rows=8)`, the fused q/k/v is rebuilt with it."""
    model = _model().to(torch.bfloat16)
    packed.pack_linears([model], 1)
    old = lean_weights(model)
    lay = model.model.layers[0].self_attn
    dense = torch.nn.Linear(lay.q_proj.in_features, lay.q_proj.out_features, bias=False, dtype=torch.bfloat16)
    dense.weight.data = lay.q_proj.dense()  # a joined part reads its columns of the fused weight
    lay.q_proj = packed.PackedLinear(dense, min_rows=8)
    assert lean_weights(model) is not old, "a new PackedLinear kept the stale fused weights"
