"""A loaded model's weights as the lean forward (`forward.lean`) reads them: fused linears, built once per model.

Why its own module: preparing the weights is apart from running them. Here: which models the lean forward
covers (`supports_lean`), q/k/v and gate/up joined into one linear each (`_linear`: plain linears concatenated,
packed ones where the joined shape stays batch-invariant, quantized ones by their own `fuse`), and a cache per
model object, rebuilt when a cast, re-pack or swapped layer changes them (`lean_weights`). The engine's `LeanLM`
and training's batched forward (`training/lean_batch.py`) share what is built here.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .cache import LONGEST_PASS
from .packed import PackedLinear, rows_invariant

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load (not dynamic / longrope)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Linear = Callable[[torch.Tensor], torch.Tensor]  # [n, in] -> [n, out]


def _linear(mods: list[Any]) -> Linear:
    """One callable giving cat([m(x) for m in mods], -1). Plain `nn.Linear`s are fused into one weight
    (concatenated once: one GEMV reads them all); anything else (PackedLinear, quantised layers) is
    called as is, since its weight may exist only in a packed form."""
    if all(type(m) is torch.nn.Linear for m in mods):
        if len(mods) == 1:
            w, b = mods[0].weight.detach(), mods[0].bias  # shared, no copy
            b = None if b is None else b.detach()
        else:
            w = torch.cat([m.weight.detach() for m in mods])  # [sum out, in]
            has_b = any(m.bias is not None for m in mods)
            b = torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(m.out_features)
                           for m in mods]) if has_b else None
        return lambda x: F.linear(x, w, b)
    fused = _fuse_packed(mods)
    fuse = getattr(type(mods[0]), "fuse", None)  # a quantized layer that knows how to join its kind (`models.quant`)
    if fused is None and fuse is not None and all(type(m) is type(mods[0]) for m in mods):
        fused = fuse(mods)
    if fused is not None:
        return fused.forward
    fns = [m.forward for m in mods]  # .forward: skip nn.Module's hook dispatch
    if len(fns) == 1:
        return fns[0]
    return lambda x: torch.cat([f(x) for f in fns], -1)


def _fuse_packed(mods: list[Any]) -> PackedLinear | None:
    """Several packed linears over one input as one packed linear (one oneDNN call instead of several: on a CPU
    a small call costs mostly its fixed overhead). Only when the fused shape is batch-invariant with the same
    padding, so a k-token pass still equals k one-token steps; else None (called one by one)."""
    if len(mods) < 2 or not all(isinstance(m, PackedLinear) for m in mods):
        return None
    w = torch.cat([m.packed.to_dense() for m in mods])  # [sum out, in]
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=any(m.bias is not None for m in mods), dtype=w.dtype)
    lin.weight.data = w
    if lin.bias is not None:
        lin.bias.data = torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in mods])
    fused = PackedLinear(lin, max(m.min_rows for m in mods))
    return fused if rows_invariant(fused, LONGEST_PASS) else None


@dataclass
class LeanLayer:
    attn_norm: torch.Tensor  # [d]
    qkv: Linear  # [n, d] -> [n, (H + 2·H_kv)·D]
    o: Linear  # [n, H·D] -> [n, d]
    mlp_norm: torch.Tensor  # [d]
    gate_up: Linear  # [n, d] -> [n, 2·I]
    down: Linear  # [n, I] -> [n, d]


@dataclass
class LeanWeights:
    """A loaded model's weights as the lean forward reads them; built once per model object."""

    layers: list[LeanLayer]
    embed: torch.Tensor  # [V, d]
    norm: torch.Tensor  # [d]
    head: Linear  # [n, d] -> [n, V]
    eps: float
    n_heads: int
    n_kv: int
    head_dim: int
    inv_freq: torch.Tensor  # [D/2] fp32, exactly what HF's rotary embedding uses
    rope_scale: float  # HF's attention_scaling (yarn); 1.0 otherwise
    window: int | None  # Mistral's sliding window: a query sees its last `window` keys
    dtype: torch.dtype


def supports_lean(model: Any) -> bool:
    """Whether the lean forward covers this model: a Llama/Qwen2/Mistral causal LM whole on the CPU,
    SiLU MLP, a static RoPE, full attention (Mistral's single sliding window is handled)."""
    if type(model).__name__ not in ARCHITECTURES:
        return False
    cfg = model.config
    try:
        inner, emb = model.model, model.get_input_embeddings()
        rope_type = getattr(inner.rotary_emb, "rope_type", "default")
    except AttributeError:
        return False
    if emb.weight.device.type != "cpu" or emb.weight.dtype not in DTYPES:
        return False
    if any(str(d) not in ("cpu", "0") and d != 0 for d in (getattr(model, "hf_device_map", None) or {}).values()):
        return False  # spread over devices or offloaded
    if any(p.device.type != "cpu" for p in model.parameters()):
        return False
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish") or rope_type not in STATIC_ROPE:
        return False
    if type(model).__name__ == "Qwen2ForCausalLM" and any(
            t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        return False
    return True


def _tensor_id(m: torch.nn.Module) -> tuple:
    """A module's own weight as (dtype, address): a cast moves it; a packed oneDNN weight has no address, so
    the buffer's identity stands in (the module itself is in the signature, so it stays alive)."""
    t = getattr(m, "weight", None)
    t = getattr(m, "packed", None) if t is None else t
    if not isinstance(t, torch.Tensor):
        return ()
    return (t.dtype, t.data_ptr() if t.layout == torch.strided else id(t))


def _signature(model: Any) -> tuple:
    """What the built weights depend on: a cast, a re-pack or a swapped layer builds them anew. Every module
    with a weight of its own counts, by identity (a new `PackedLinear` has no `.weight` to tell it apart)."""
    emb = model.get_input_embeddings().weight
    own = tuple((m, *_tensor_id(m)) for m in model.modules() if _tensor_id(m))
    return (emb.data_ptr(), emb.dtype, len(model.model.layers), own)


def _build(model: Any) -> LeanWeights:
    cfg, inner = model.config, model.model
    attn0 = inner.layers[0].self_attn
    layers = [LeanLayer(
        attn_norm=lay.input_layernorm.weight.detach(),
        qkv=_linear([lay.self_attn.q_proj, lay.self_attn.k_proj, lay.self_attn.v_proj]),
        o=_linear([lay.self_attn.o_proj]),
        mlp_norm=lay.post_attention_layernorm.weight.detach(),
        gate_up=_linear([lay.mlp.gate_proj, lay.mlp.up_proj]),
        down=_linear([lay.mlp.down_proj]),
    ) for lay in inner.layers]
    embed = model.get_input_embeddings().weight.detach()
    rot = inner.rotary_emb
    window = getattr(cfg, "sliding_window", None) if type(model).__name__ == "MistralForCausalLM" else None
    return LeanWeights(
        layers=layers, embed=embed, norm=inner.norm.weight.detach(), head=_linear([model.lm_head]),
        eps=float(inner.norm.variance_epsilon),
        n_heads=cfg.num_attention_heads, n_kv=cfg.num_key_value_heads, head_dim=attn0.head_dim,
        inv_freq=rot.inv_freq.detach().float().clone(), rope_scale=float(getattr(rot, "attention_scaling", 1.0)),
        window=window, dtype=embed.dtype)


_WEIGHTS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, LeanWeights]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def lean_weights(model: Any) -> LeanWeights:
    """The model's lean weights, built on first use and kept while the model lives (runs share them)."""
    sig = _signature(model)
    with _LOCK:
        hit = _WEIGHTS.get(model)
        if hit is None or hit[0] != sig:
            hit = (sig, _build(model))
            _WEIGHTS[model] = hit
        return hit[1]
