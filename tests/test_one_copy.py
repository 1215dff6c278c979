"""The lean forward's fused linears hold no weight of their own: the model's layers are views (plain) or columns
(packed, quantized) of the fused ones, through casts, rebuilds, deep copies and training steps."""
from __future__ import annotations

import copy

import pytest
import torch
from test_lean import IDS, V, family

from pyramid_demo.forward import packed
from pyramid_demo.forward.lean import LeanLM
from pyramid_demo.forward.lean_weights import Dense, lean_weights
from pyramid_demo.forward.lm import CachedLM


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _shares(model: torch.nn.Module) -> bool:
    """Every layer's q/k/v and gate/up weights (and biases) live in the storage of the fused tensor the lean
    forward reads."""
    w = lean_weights(model)
    for lay, lean in zip(model.model.layers, w.layers):
        groups = ((lay.self_attn.q_proj, lay.self_attn.k_proj, lay.self_attn.v_proj, lean.qkv),
                  (lay.mlp.gate_proj, lay.mlp.up_proj, lean.gate_up))
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
    are, and a deep copy's are its own; HF's forward and the lean one still agree."""
    model = family("qwen2", init=0.5)
    assert _shares(model), "a fused weight is a copy beside the layers' own"
    assert (LeanLM(model, V, "t").feed(IDS[:12], 4) - CachedLM(model, V, "t").feed(IDS[:12], 4)).abs().max() < 1e-4
    fused = lean_weights(model).layers[0].qkv.weight.data_ptr()
    model.model.layers[1].self_attn.o_proj = torch.nn.Linear(64, 64, bias=False)  # another layer swapped: a rebuild
    assert lean_weights(model).layers[0].qkv.weight.data_ptr() == fused, "a rebuild copied the fused weight anew"
    twin = copy.deepcopy(model)
    assert _shares(twin) and _storage(twin.model.layers[0].self_attn.q_proj.weight) != _storage(
        model.model.layers[0].self_attn.q_proj.weight)
    model.to(torch.bfloat16)
    assert lean_weights(model).dtype == torch.bfloat16 and _shares(model)


def test_a_training_step_moves_the_fused_weights_with_the_layers(one_thread):
    """Rule: built under inference mode, the fused weights are still ordinary tensors the layers' parameters view,
    so an optimizer step outside inference mode updates what the lean forward reads, with no rebuild."""
    model = family("llama3", init=0.5)
    with torch.inference_mode():
        built = lean_weights(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.tensor([IDS[:8]])).logits.float().pow(2).mean()
    loss.backward()
    opt.step()
    assert lean_weights(model) is built
    with torch.no_grad():
        want = CachedLM(model, V, "t").feed(IDS[:12], 4)
    assert (LeanLM(model, V, "t").feed(IDS[:12], 4) - want).abs().max() < 1e-4


@pytest.mark.skipif(not packed.available(torch.bfloat16), reason="this CPU's oneDNN does not run bf16")
def test_packed_parts_become_columns_of_the_fused_layer(one_thread):
    """Rule: packed q/k/v fused for the lean forward leave the parts holding no packed weight of their own; HF's
    forward still computes each part (through the fused layer), and a deep copy gives plain linears with the
    parts' own rows."""
    model = family("qwen2").to(torch.bfloat16)
    plain = copy.deepcopy(model)
    packed.pack_linears([model], 1)
    lean = lean_weights(model).layers[0]
    attn = model.model.layers[0].self_attn
    whole = attn.q_proj.part_of
    assert whole is not None and lean.qkv.__self__ is whole and attn.k_proj.part_of is whole
    assert attn.q_proj.packed is None and attn.q_proj.weight_bytes == 0 and whole.weight_bytes > 0
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert attn.k_proj.cols == (64, 96) and torch.equal(attn.k_proj(x), whole(x)[:, 64:96])
    twin = copy.deepcopy(model)
    k = twin.model.layers[0].self_attn.k_proj
    assert type(k) is torch.nn.Linear and torch.equal(k.weight, plain.model.layers[0].self_attn.k_proj.weight)
    assert torch.equal(k.bias, plain.model.layers[0].self_attn.k_proj.bias)
