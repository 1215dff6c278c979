"""A loaded model's weights as the core forward reads them (`forward.core`): q/k/v and gate/up joined into one
linear each (every weight resident once), read from the model as it is now (a cast or swapped layer is seen at
once). Shared by every run, the compiled package's build and training's batched forward."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .fusable import Fusable, join, joined_whole

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


def _linear(mods: list[Any]) -> Linear:
    """One callable for cat([m(x) for m in mods], -1) holding no weight of its own (fused views, `fusable.join`)."""
    if all(type(m) is torch.nn.Linear for m in mods) and _same_kind(mods):
        if len(mods) == 1:
            b = mods[0].bias
            return Dense(mods[0].weight.detach(), None if b is None else b.detach())  # shared, no copy
        return _fuse_dense(mods)
    if len(mods) > 1 and all(type(m) is type(mods[0]) and isinstance(m, Fusable) for m in mods):
        whole = joined_whole(mods)  # already fused by an earlier build: reuse it
        if whole is None:
            fuse = getattr(type(mods[0]), "fuse", None)
            whole = fuse(mods) if fuse is not None else None
            if whole is not None:
                join(mods, whole)
        if whole is not None:
            return whole.forward
    fns = [m.forward for m in mods]  # .forward: skip nn.Module's hook dispatch
    return fns[0] if len(fns) == 1 else lambda x: torch.cat([f(x) for f in fns], -1)  # parts that cannot be fused


def _same_kind(mods: list[torch.nn.Linear]) -> bool:
    w = mods[0].weight
    return all(
        m.weight.dtype == w.dtype and m.weight.device == w.device and m.in_features == mods[0].in_features for m in mods
    )


def _fuse_dense(mods: list[torch.nn.Linear]) -> Dense:
    """The parts' weights as one tensor [sum out, in]: an earlier build's view, else a concatenation re-pointed."""
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
            p.data = fused[at : at + m.out_features]
        at += m.out_features


@dataclass
class Layer:
    attn_norm: torch.Tensor  # [d]
    qkv: Linear  # [n, d] -> [n, (H + 2·H_kv)·D]
    o: Linear  # [n, H·D] -> [n, d]
    mlp_norm: torch.Tensor  # [d]
    gate_up: Linear  # [n, d] -> [n, 2·I]
    down: Linear  # [n, I] -> [n, d]


@dataclass
class Weights:
    """A loaded model's weights as the core forward reads them; built once per model object."""

    layers: list[Layer]
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


def covered(model: Any) -> bool:
    """Whether the core forward covers this model: Llama/Qwen2/Mistral on one device, SiLU, static RoPE."""
    if type(model).__name__ not in ARCHITECTURES:
        return False
    cfg = model.config
    try:
        inner, emb = model.model, model.get_input_embeddings()
        rope_type = getattr(inner.rotary_emb, "rope_type", "default")
    except AttributeError:
        return False
    if emb.weight.dtype not in DTYPES or emb.weight.device.type == "meta":
        return False
    if len({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}) > 1:
        return False  # spread over devices or offloaded
    if any(p.device != emb.weight.device for p in model.parameters()):
        return False
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish") or rope_type not in STATIC_ROPE:
        return False
    if type(model).__name__ == "Qwen2ForCausalLM" and any(
        t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())
    ):
        return False
    return True


_LOCK = threading.Lock()  # a first build re-points the model's parameters: one at a time


def weights(model: Any) -> Weights:
    """The model's core weights. Built on each call (a millisecond or so: every weight stays where it is); the first
    build joins q/k/v and gate/up and re-points the model's parameters at the joined tensors, later ones find them
    joined and copy nothing. Built outside inference mode: fusing re-points the model's (trainable) parameters."""
    with _LOCK, torch.inference_mode(False), torch.no_grad():
        cfg, inner = model.config, model.model
        layers = [
            Layer(
                attn_norm=lay.input_layernorm.weight.detach(),
                qkv=_linear([lay.self_attn.q_proj, lay.self_attn.k_proj, lay.self_attn.v_proj]),
                o=_linear([lay.self_attn.o_proj]),
                mlp_norm=lay.post_attention_layernorm.weight.detach(),
                gate_up=_linear([lay.mlp.gate_proj, lay.mlp.up_proj]),
                down=_linear([lay.mlp.down_proj]),
            )
            for lay in inner.layers
        ]
        embed = model.get_input_embeddings().weight.detach()
        rot = inner.rotary_emb
        window = getattr(cfg, "sliding_window", None) if type(model).__name__ == "MistralForCausalLM" else None
        return Weights(
            layers=layers,
            embed=embed,
            norm=inner.norm.weight.detach(),
            head=_linear([model.lm_head]),
            eps=float(inner.norm.variance_epsilon),
            n_heads=cfg.num_attention_heads,
            n_kv=cfg.num_key_value_heads,
            head_dim=inner.layers[0].self_attn.head_dim,
            inv_freq=rot.inv_freq.detach().float(),
            rope_scale=float(getattr(rot, "attention_scaling", 1.0)),
            window=window,
            dtype=embed.dtype,
        )
