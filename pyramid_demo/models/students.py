"""Distilled draft and qualifier students for the offline SmolLM2-135M-Instruct target.

A student is an ordinary `LlamaForCausalLM` with the target's config but only a few
transformer layers. Its token embedding, final norm, rotary embedding and LM head are the
target's own modules (shared, never stored twice), and so may be its first few layers
(the qualifier's bottom layers are the target's, frozen); only the trained layers ship, in
`pyramid_demo/models/weights/{draft,qualifier}.safetensors` (int8 matrices with one fp16 scale
per 64 weights of a row, fp16 norms). They were made by `python -m training distill` (see
`pyramid_demo/models/weights/README.md`).

    from pyramid_demo.models import students
    if students.available():
        draft = students.build(target, "draft")        # eval(), same dtype/device as target
        qualifier = students.build(target, "qualifier")
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
ROLES = ("draft", "qualifier")
FORMAT = "pyramid-student-v1"


def weight_path(role: str, weights_dir: str | Path | None = None) -> Path:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    return Path(weights_dir or WEIGHTS_DIR) / f"{role}.safetensors"


def available(weights_dir: str | Path | None = None) -> bool:
    """True when the shipped draft and qualifier weight files exist."""
    return all(weight_path(r, weights_dir).is_file() for r in ROLES)


def info(role: str, weights_dir: str | Path | None = None) -> dict:
    """The metadata stored with a student's weights (depth, target, recipe, evaluation)."""
    with safe_open(str(weight_path(role, weights_dir)), framework="pt") as f:
        meta = f.metadata() or {}
    out = dict(meta)
    for k in ("num_layers", "shared_layers", "init_layers"):
        if k in out:
            out[k] = json.loads(out[k])
    return out


def skeleton(target: torch.nn.Module, num_layers: int, shared: int = 0) -> LlamaForCausalLM:
    """A `num_layers`-deep Llama sharing the target's embedding, norm, rotary and head, and
    whose first `shared` layers are the target's own first layers (the same modules).

    The other layers are left uninitialised (meta tensors are replaced by
    `init_from_target` or `build`)."""
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    if hasattr(cfg, "quantization_config"):
        try:
            delattr(cfg, "quantization_config")
        except AttributeError:
            pass
    with torch.device("meta"):
        student = LlamaForCausalLM(cfg)
    tm = target.model
    student.model.embed_tokens = tm.embed_tokens
    student.model.norm = tm.norm
    student.model.rotary_emb = tm.rotary_emb
    student.lm_head = target.lm_head
    for i in range(shared):
        student.model.layers[i] = tm.layers[i]
    student.shared_layers = shared
    return student


def _target_param(target: torch.nn.Module) -> torch.Tensor:
    return target.model.embed_tokens.weight


def init_from_target(target: torch.nn.Module, layer_ids: list[int], shared: int = 0) -> LlamaForCausalLM:
    """A student whose layers are the target's layers `layer_ids`: the first `shared` of them
    the target's own modules (frozen, shared), the rest independent trainable copies."""
    if list(layer_ids[:shared]) != list(range(shared)):
        raise ValueError("shared layers must be the target's first layers")
    student = skeleton(target, len(layer_ids), shared)
    ref = _target_param(target)
    for i, j in enumerate(layer_ids):
        if i < shared:
            continue
        layer = copy.deepcopy(target.model.layers[j])
        layer.self_attn.layer_idx = i
        student.model.layers[i] = layer.to(device=ref.device, dtype=ref.dtype)
    return student


def layer_state(student: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The student's own (not shared) layers, keyed `{layer index}.{name}`."""
    shared = getattr(student, "shared_layers", 0)
    return {k: v.detach().cpu() for k, v in student.model.layers.state_dict().items()
            if int(k.split(".")[0]) >= shared}


GROUP = 64  # int8 quantisation group along each row


def quantize(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """int8 with one fp16 scale per group of 64 weights in a row for matrices; fp16 vectors."""
    out = {}
    for k, w in sd.items():
        w = w.detach().float().cpu()
        if w.dim() == 2 and w.shape[1] % GROUP == 0:
            g = w.reshape(w.shape[0], -1, GROUP)
            scale = (g.abs().amax(dim=2, keepdim=True) / 127.0).clamp_min(1e-8).to(torch.float16)
            q = torch.round(g / scale.float()).clamp(-127, 127).to(torch.int8)
            out[k + ".q"] = q.reshape(w.shape).contiguous()
            out[k + ".scale"] = scale.squeeze(2).contiguous()
        else:
            out[k] = w.to(torch.float16).contiguous()
    return out


def dequantize(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in raw.items():
        if k.endswith(".scale"):
            continue
        if k.endswith(".q"):
            base = k[:-2]
            scale = raw[base + ".scale"].float()  # [rows, cols / GROUP]
            g = v.float().reshape(v.shape[0], scale.shape[1], -1)
            out[base] = (g * scale.unsqueeze(2)).reshape(v.shape)
        else:
            out[k] = v.float()
    return out


def save(student: torch.nn.Module, path: str | Path, metadata: dict | None = None) -> int:
    """Write only the student's layers (int8 + scales); returns the file size in bytes."""
    meta = {"format": FORMAT, "num_layers": json.dumps(len(student.model.layers)),
            "shared_layers": json.dumps(getattr(student, "shared_layers", 0))}
    for k, v in (metadata or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(quantize(layer_state(student)), str(tmp), metadata=meta)
    tmp.replace(path)
    return path.stat().st_size


def load_layers(path: str | Path) -> tuple[int, int, dict[str, torch.Tensor]]:
    raw = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            raw[k] = f.get_tensor(k)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    shared = int(json.loads(meta.get("shared_layers", "0")))
    return int(json.loads(meta["num_layers"])), shared, dequantize(raw)


def build_from_file(target: torch.nn.Module, path: str | Path) -> LlamaForCausalLM:
    n, shared, sd = load_layers(path)
    student = skeleton(target, n, shared)
    ref = _target_param(target)
    for i in range(shared, n):
        prefix = f"{i}."
        part = {k[len(prefix):]: v.to(device=ref.device, dtype=ref.dtype)
                for k, v in sd.items() if k.startswith(prefix)}
        student.model.layers[i].load_state_dict(part, strict=True, assign=True)
    student.to(device=ref.device)
    return student.eval()


def subset_path(weights_dir: str | Path | None = None) -> Path:
    """The ranked token subset of a reduced-vocabulary head (`python -m training distill vocab`)."""
    return Path(weights_dir or WEIGHTS_DIR) / "vocab.safetensors"


def subset_ids(weights_dir: str | Path | None = None, n: int | None = None) -> torch.Tensor:
    """The first n (default: all shipped) ids of the shipped ranking, most frequent first."""
    from .reduced_head import load_subset

    ids = load_subset(subset_path(weights_dir))[0]
    return ids if n is None else ids[:n]


def build(target: torch.nn.Module, role: str, weights_dir: str | Path | None = None,
          reduced_head: bool = False) -> torch.nn.Module:
    """The shipped `role` student ("draft" or "qualifier") for the SmolLM2-135M target.

    Shares `target`'s embed_tokens / norm / rotary_emb / lm_head modules; the trained layers
    are loaded in the target's dtype and on its device; returned in eval() mode. With
    `reduced_head`, its own `lm_head` is a `ReducedHead` over the shipped token subset (a copy
    of those rows of the target's head; the target's head is not touched)."""
    path = weight_path(role, weights_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m training distill`")
    student = build_from_file(target, path)
    if reduced_head:
        from .reduced_head import reduce_head

        reduce_head(student, subset_ids(weights_dir))
    return student
