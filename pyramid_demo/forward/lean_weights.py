"""A loaded model's weights as the lean forward (`forward.lean`) reads them: fused linears, built once per model.

Why its own module: preparing the weights is apart from running them. Here: which models the lean forward
covers (`supports_lean`), q/k/v and gate/up joined into one linear each (`_linear`: plain linears concatenated
once, their own weights then views of the joined one; packed ones where the joined shape stays batch-invariant,
quantized ones by their own `fuse`, the parts then columns of the fused layer), so every weight is resident once,
and a cache per model object, rebuilt when a cast, re-pack or swapped layer changes them (`lean_weights`). The
engine's `LeanLM` and training's batched forward (`training/lean_batch.py`) share what is built here.
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
from .packed import Fusable, PackedLinear, join, joined_whole, rows_invariant

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load (not dynamic / longrope)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Linear = Callable[[torch.Tensor], torch.Tensor]  # [n, in] -> [n, out]


@dataclass(frozen=True, eq=False)
class Dense:
    """x·Wᵀ + b over plain weights; a fused one is the tensor its parts' `nn.Linear.weight`s are views of."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None  # [out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True, eq=False)
class Concat:
    """Parts that cannot be fused, called one by one: cat([f(x) for f in parts], -1)."""

    parts: tuple[Linear, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([f(x) for f in self.parts], -1)


def _linear(mods: list[Any]) -> Linear:
    """One callable giving cat([m(x) for m in mods], -1), holding no weight of its own. Plain `nn.Linear`s are
    fused into one weight (one GEMV reads them all) whose rows their own weights then are (views); layers whose
    weight only their kernel reads (`packed.Fusable`: oneDNN-packed, int4, fp16) are fused by their kind and become
    columns of the fused layer (`packed.join`); anything else is called as it is."""
    if all(type(m) is torch.nn.Linear for m in mods) and _same_kind(mods):
        if len(mods) == 1:
            b = mods[0].bias
            return Dense(mods[0].weight.detach(), None if b is None else b.detach())  # shared, no copy
        return _fuse_dense(mods)
    if len(mods) > 1 and all(type(m) is type(mods[0]) and isinstance(m, Fusable) for m in mods):
        whole = joined_whole(mods)  # already fused by an earlier build: reuse it
        if whole is None:
            fuse = _fuse_packed if isinstance(mods[0], PackedLinear) else getattr(type(mods[0]), "fuse", None)
            whole = fuse(mods) if fuse is not None else None
            if whole is not None:
                join(mods, whole)
        if whole is not None:
            return whole.forward
    fns = tuple(m.forward for m in mods)  # .forward: skip nn.Module's hook dispatch
    return fns[0] if len(fns) == 1 else Concat(fns)


def _same_kind(mods: list[torch.nn.Linear]) -> bool:
    w = mods[0].weight
    return all(m.weight.dtype == w.dtype and m.weight.device == w.device and m.in_features == mods[0].in_features
               for m in mods)


def _fuse_dense(mods: list[torch.nn.Linear]) -> Dense:
    """The parts' weights as one tensor [sum out, in] (and biases [sum out]): the view they already are parts of
    when an earlier build fused them, else a concatenation their own weights are then pointed into."""
    w = _adjacent([m.weight.detach() for m in mods])
    if w is None:
        w = torch.cat([m.weight.detach() for m in mods])  # [sum out, in]: the one copy
        _repoint([m.weight for m in mods], mods, w)
    if all(m.bias is None for m in mods):
        return Dense(w, None)
    biases = [m.bias for m in mods]
    b = _adjacent([x.detach() for x in biases if x is not None]) if all(x is not None for x in biases) else None
    if b is None:
        b = torch.cat([x.detach() if x is not None else w.new_zeros(m.out_features) for x, m in zip(biases, mods)])
        _repoint(biases, mods, b)
    return Dense(w, b)


def _adjacent(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """cat(ts) as a view, when they lie back to back in one storage (an earlier fusing left them so); else None."""
    if not all(t.is_contiguous() and t.shape[1:] == ts[0].shape[1:] for t in ts):
        return None
    ptr, at = ts[0].untyped_storage().data_ptr(), ts[0].storage_offset()
    for t in ts:
        if t.untyped_storage().data_ptr() != ptr or t.storage_offset() != at:
            return None
        at += t.numel()
    return ts[0].as_strided((sum(t.shape[0] for t in ts), *ts[0].shape[1:]), ts[0].stride())


def _repoint(params: list[Any], mods: list[torch.nn.Linear], fused: torch.Tensor) -> None:
    """Point each module's parameter (None: a part without one, whose rows are zeros) at its rows of `fused`."""
    at = 0
    for p, m in zip(params, mods):
        if p is not None:
            p.data = fused[at: at + m.out_features]
        at += m.out_features


def _fuse_packed(mods: list[Any]) -> PackedLinear | None:
    """Several packed linears over one input as one packed linear (one oneDNN call instead of several: on a CPU
    a small call costs mostly its fixed overhead). Only when the fused shape is batch-invariant with the same
    padding, so a k-token pass still equals k one-token steps; else None (called one by one). The parts are
    left as they are (`_linear` joins them)."""
    if len(mods) < 2 or not all(isinstance(m, PackedLinear) for m in mods):
        return None
    w = torch.cat([m.dense() for m in mods])  # [sum out, in]
    bias = None
    if any(m.bias is not None for m in mods):
        bias = torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in mods])
    fused = PackedLinear(w, max(m.min_rows for m in mods), bias)
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
    """A module's own weight as (dtype, address): a cast moves it; a packed oneDNN or fbgemm weight has no address,
    so its identity stands in (the module itself is in the signature, so it stays alive); a fused layer's part,
    by its whole and columns."""
    whole = getattr(m, "part_of", None)
    if whole is not None:
        return ("part", id(whole), m.cols)
    t = getattr(m, "weight", None)
    t = getattr(m, "packed", None) if t is None else t
    if isinstance(t, torch.Tensor):
        return (t.dtype, t.data_ptr() if t.layout == torch.strided else id(t))
    return ("opaque", id(t)) if t is not None and isinstance(m, Fusable) else ()


def _signature(model: Any) -> tuple:
    """What the built weights depend on: a cast, a re-pack or a swapped layer builds them anew. Every module
    with a weight of its own counts, by identity (a new `PackedLinear` has no `.weight` to tell it apart)."""
    emb = model.get_input_embeddings().weight
    own = tuple((m, *_tensor_id(m)) for m in model.modules() if _tensor_id(m))
    return (emb.data_ptr(), emb.dtype, len(model.model.layers), own)


def _build(model: Any) -> LeanWeights:
    """The lean weights; fusing re-points the model's own linears at the fused tensors (never inference tensors:
    the model's parameters are trained and updated in place outside inference mode)."""
    with torch.inference_mode(False), torch.no_grad():
        return _build_now(model)


def _build_now(model: Any) -> LeanWeights:
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
        inv_freq=rot.inv_freq.detach().float(), rope_scale=float(getattr(rot, "attention_scaling", 1.0)),
        window=window, dtype=embed.dtype)


_WEIGHTS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, LeanWeights]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def lean_weights(model: Any) -> LeanWeights:
    """The model's lean weights, built on first use and kept while the model lives (runs share them). The signature
    is taken after a build, which re-points fused parts; a stale build is dropped first (its tensors freed)."""
    with _LOCK:
        hit = _WEIGHTS.get(model)
        if hit is None or hit[0] != _signature(model):
            _WEIGHTS.pop(model, None)
            built = _build(model)
            hit = (_signature(model), built)
            _WEIGHTS[model] = hit
        return hit[1]
