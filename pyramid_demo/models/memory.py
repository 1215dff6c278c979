"""Memory a family needs, from its configs only (arithmetic, not a measurement), and the check refusing a misfit."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from ..forward import lookup
from . import feature_draft
from .bundled import _complete, bundled_gguf, converted_dir
from .errors import LoadError
from .presets import BUNDLED_TARGET, FEATURE_DRAFT, OFFLINE, Preset
from .quant import DEFAULT_GROUP, parse_quant
from .tiny import tiny_config, tiny_tokenizer

log = logging.getLogger(__name__)

GB = 10**9  # decimal gigabytes, as GPU makers count (a "24 GB" card holds 24 GiB ≈ 25.8 GB)
DEFAULT_MAX_LEN = 2048  # prompt + new tokens + look-ahead, when the caller does not say
OVERHEAD_FRACTION = 0.10  # activations, logits, allocator slack
OVERHEAD_FIXED = 256 * 1024**2
SKIP_ENV = "PYRAMID_DEMO_SKIP_MEMORY_CHECK"
QUANT_BYTES = {"8bit": 1.0, "4bit": 0.5}  # for linear layers; embeddings and head stay 16-bit
ROLES = ("draft", "qualifier", "target")


@dataclass(frozen=True)
class ModelSize:
    """One role's share: parameters it owns (shared ones in the target's row) and KV bytes per token."""

    role: str
    ref: str
    params: int
    weight_bytes: int
    kv_bytes_per_token: int


@dataclass(frozen=True)
class Estimate:
    """A family's memory need; `unknown` names models whose config could not be read."""

    family: str
    dtype: torch.dtype
    max_len: int
    quantize: str | None = None
    models: tuple[ModelSize, ...] = ()
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def weight_bytes(self) -> int:
        return sum(m.weight_bytes for m in self.models)

    @property
    def kv_bytes(self) -> int:
        return sum(m.kv_bytes_per_token for m in self.models) * self.max_len

    @property
    def overhead_bytes(self) -> int:
        return int(OVERHEAD_FRACTION * (self.weight_bytes + self.kv_bytes)) + OVERHEAD_FIXED

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.overhead_bytes

    def summary(self) -> str:
        """One line for the CLI and the app."""
        if not self.models:
            return f"memory estimate for {self.family}: unknown ({'; '.join(self.notes) or 'no config'})"
        dt = str(self.dtype).removeprefix("torch.") + (f", {self.quantize} weights" if self.quantize else "")
        parts = ", ".join(f"{m.role} {_fmt_params(m.params)}" for m in self.models)
        text = (
            f"memory estimate for {self.family} ({dt}): {fmt_bytes(self.total_bytes)} = weights "
            f"{fmt_bytes(self.weight_bytes)} ({parts} parameters) + KV cache {fmt_bytes(self.kv_bytes)} "
            f"({self.max_len:,} tokens × 3 models) + overhead {fmt_bytes(self.overhead_bytes)}"
        )
        if self.unknown:
            text += f"; not counted (config unavailable): {', '.join(self.unknown)}"
        return text + " [computed from configs, not measured]"

    def short(self) -> str:
        """A few words for the app's family box."""
        if not self.models:
            return "unknown until its configs can be read"
        text = (
            f"≈ {fmt_bytes(self.total_bytes)} in {str(self.dtype).removeprefix('torch.')} for {self.max_len:,} "
            f"tokens (weights {fmt_bytes(self.weight_bytes)}, KV cache {fmt_bytes(self.kv_bytes)})"
        )
        return text + (" — some configs unavailable" if self.unknown else "")


def fmt_bytes(n: float) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:.1f} MB"


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


# ---------------------------------------------------------------- counting
@functools.lru_cache(maxsize=32)
def _count(config_json: str, model_type: str) -> tuple[int, int]:
    """(all parameters, embedding + head parameters) of a config, counted on `meta`."""
    from accelerate import init_empty_weights

    d = json.loads(config_json)
    d.pop("model_type", None)
    cfg = AutoConfig.for_model(model_type, **d)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(cfg)
    model.tie_weights()  # not done under init_empty_weights; a tied head is one tensor
    total = sum(p.numel() for p in model.parameters())  # tied weights appear once
    emb = {
        id(p): p.numel()
        for mod in (model.get_input_embeddings(), model.get_output_embeddings())
        if mod is not None
        for p in mod.parameters()
    }
    return total, sum(emb.values())


def count_params(config: Any) -> tuple[int, int]:
    """(parameters, of which embedding and head) for a transformers config, no weights built."""
    d = config.to_dict()
    d.pop("quantization_config", None)
    return _count(json.dumps(d, sort_keys=True, default=str), config.model_type)


def kv_per_token(config: Any, nbytes: int, layers: int | None = None) -> int:
    """Bytes of keys and values one token adds to a model's cache."""
    c = config.get_text_config()  # a multimodal config keeps the decoder's sizes apart
    heads = getattr(c, "num_attention_heads", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return 2 * (layers if layers is not None else c.num_hidden_layers) * kv_heads * head_dim * nbytes


def weight_bytes(params: int, embed: int, dtype: torch.dtype, quantize: str | None) -> int:
    if quantize:
        return int(embed * min(dtype.itemsize, 2) + (params - embed) * QUANT_BYTES[quantize])
    return params * dtype.itemsize


# ---------------------------------------------------------------- configs, without weights
def _config_for(ref: str, can_fetch: Callable[[], bool] | None = None) -> Any:
    """A config for a Hub id, folder or .gguf without weights (None if not); the Hub only if `can_fetch()`."""
    path = Path(ref)
    try:
        if ref == BUNDLED_TARGET:
            return _bundled_config()
        if ref.endswith(".gguf") and path.is_file():
            return _gguf_config(str(path))
        if path.is_absolute():
            return AutoConfig.from_pretrained(ref) if path.is_dir() else None
        try:
            return AutoConfig.from_pretrained(ref, local_files_only=True)
        except (OSError, ValueError):
            return None if can_fetch is None or not can_fetch() else AutoConfig.from_pretrained(ref)  # config.json only
    except Exception as e:  # noqa: BLE001 - an estimate must never stop a load by itself
        log.info("no config for %s: %r", ref, e)
        return None


def _bundled_config() -> Any:
    """The offline target's config: the converted copy's config.json, else the GGUF metadata."""
    dest = converted_dir()
    if _complete(dest):
        return AutoConfig.from_pretrained(str(dest))
    return _gguf_config(str(bundled_gguf()))


@functools.cache
def _gguf_config(path: str) -> Any:
    """A GGUF file's config, read once per process and shared, never changed (parsing the header takes a second)."""
    return AutoConfig.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)


def _sizes(role: str, ref: str, cfg: Any, dt: torch.dtype, quantize: str | None, shared: bool = False) -> ModelSize:
    """A role's size; `shared`: a model already counted (only its cache is its own)."""
    params, embed = (0, 0) if shared else count_params(cfg)
    return ModelSize(role, ref, params, weight_bytes(params, embed, dt, quantize), kv_per_token(cfg, dt.itemsize))


def int4_size(role: str, ref: str, cfg: Any, dt: torch.dtype, group: int) -> ModelSize:
    """A quantized copy (`quant.int4_copy`): 4-bit linears, a bf16 scale and zero per group, a 16-bit head."""
    params, embed = count_params(cfg)
    body = params - embed  # the layers' linears (norms are a rounding error)
    head = cfg.vocab_size * cfg.hidden_size
    nbytes = int(body * (0.5 + 4 / group) + head * 2)  # bytes a weight: 4 bits, plus a group's bf16 scale and zero
    return ModelSize(role, ref, body + head, nbytes, kv_per_token(cfg, dt.itemsize))


def _feature_draft_size(cfg: Any, dt: torch.dtype, quantize: str | None) -> ModelSize:
    """The offline feature draft: trained tensors (the file's header), head rows, joined copies; one layer's cache."""
    with safe_open(str(feature_draft.weight_path()), framework="pt") as fh:
        sizes = {k: math.prod(fh.get_slice(k).get_shape()) for k in fh.keys()}
        n_subset = int((fh.metadata() or {}).get("n_subset", 0))
    taps = len(feature_draft.file_taps(feature_draft.weight_path()))
    params = sum(sizes.values()) + n_subset * cfg.hidden_size  # its own tensors and its head's rows
    nbytes = dt.itemsize
    # per token: its predicted state, and the states its verifier hands it (the tapped layers' too)
    kv = kv_per_token(cfg, nbytes, 1) + (2 + taps) * cfg.hidden_size * nbytes
    joint = sum(sizes.get(k, 0) for k in ("q", "k", "v", "gate", "up"))  # `joint_weights`: copies beside its own
    return ModelSize("draft", FEATURE_DRAFT, params, weight_bytes(params, 0, dt, quantize) + joint * nbytes, kv)


def estimate_family(
    preset: Preset | None,
    refs: tuple[str, str, str],
    dtype: torch.dtype = torch.float32,
    max_len: int = DEFAULT_MAX_LEN,
    quantize: str | None = None,
    can_fetch: Callable[[], bool] | None = None,
) -> Estimate:
    """The memory a parsed family needs, from configs only; `can_fetch`: whether the Hub may be asked."""
    name = preset.name if preset else "custom family"
    if preset is not None and preset.name == "tiny-random":
        cfg = tiny_config(len(tiny_tokenizer()))
        rows = tuple(_sizes(role, ref, cfg, dtype, quantize) for role, ref in zip(ROLES, refs))
        return Estimate(name, dtype, max_len, quantize, rows)
    if preset is not None and preset.name == OFFLINE:
        try:
            cfg = _bundled_config()
        except LoadError as e:
            return Estimate(name, dtype, max_len, quantize, unknown=refs, notes=(str(e),))
        qualifier = int4_size("qualifier", preset.qualifier, cfg, dtype, DEFAULT_GROUP)  # as `offline` builds it
        draft = (
            _feature_draft_size(cfg, dtype, quantize) if feature_draft.available() else replace(qualifier, role="draft")
        )
        target = _sizes("target", BUNDLED_TARGET, cfg, dtype, quantize)
        return Estimate(name, dtype, max_len, quantize, (draft, qualifier, target))
    rows, unknown, seen = [], [], set()
    for role, ref in zip(ROLES, refs):
        if lookup.parse(ref) is not None:  # prompt lookup: no weights, no cache
            rows.append(ModelSize(role, ref, 0, 0, 0))
            continue
        base, group = parse_quant(ref)
        cfg = _config_for(base, can_fetch)
        if cfg is None:
            unknown.append(ref)
            continue
        if group is not None:
            rows.append(int4_size(role, ref, cfg, dtype, group))
        else:
            rows.append(_sizes(role, ref, cfg, dtype, quantize, shared=ref in seen))
            seen.add(ref)  # the same model twice is loaded once; its caches are still separate
    notes: tuple[str, ...] = ()
    if unknown:
        asked = ", and the Hub cannot be asked" if can_fetch else " (the network is not asked here)"
        notes = (f"no config for {', '.join(unknown)} in the local Hugging Face cache{asked}",)
    return Estimate(name, dtype, max_len, quantize, tuple(rows), tuple(unknown), notes)


# ---------------------------------------------------------------- what is free
def _cgroup_available() -> int | None:
    """A container's own limit (a Space's RAM), which /proc/meminfo does not show."""
    for limit_f, used_f in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_f).read_text().strip()
            if limit == "max" or int(limit) > 1 << 60:
                return None
            return int(limit) - int(Path(used_f).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def available_ram() -> int:
    """Free RAM for this process (psutil comes with accelerate), capped by a container's cgroup limit."""
    import psutil

    free = int(psutil.virtual_memory().available)
    cg = _cgroup_available()
    return free if cg is None else min(free, cg)


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (None: unknown, e.g. MPS, where no check is made)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])  # 'cuda' alone: the current device
    return available_ram() if device.type == "cpu" else None


def check_fits(est: Estimate, device: torch.device, device_map: str | None = None) -> None:
    """Raise LoadError when the estimate exceeds what is free (skipped if unknown or $SKIP_ENV)."""
    if os.environ.get(SKIP_ENV, "").strip() in {"1", "true", "yes"} or not est.models:
        return
    if device_map != "auto":
        free, where = available_bytes(device), str(device)
    else:  # every GPU (none without CUDA) and CPU RAM
        gpus = [int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())]
        free, where = sum(gpus) + available_ram(), f"{len(gpus)} GPU(s) + CPU RAM (device_map=auto)"
    if free is None or est.total_bytes <= free:
        return
    tips = []
    if est.dtype == torch.float32:
        tips.append("a 16-bit --dtype (bfloat16) halves the weights")
    if device.type == "cuda" and not est.quantize:
        tips.append("--quantize 4bit or 8bit (needs bitsandbytes)")
    if device_map != "auto":
        tips.append("--device-map auto spreads it over every GPU and offloads the rest to CPU RAM")
    if est.family != "tiny-random":
        tips.append("a smaller preset such as `smollm2-offline` or `tiny-random`")
    raise LoadError(
        f"Not enough memory for {est.family}: it needs about {est.total_bytes / GB:.2f} GB "
        f"(weights {est.weight_bytes / GB:.2f} GB, KV cache {est.kv_bytes / GB:.2f} GB for {est.max_len:,} "
        f"tokens, overhead {est.overhead_bytes / GB:.2f} GB) but {where} has {free / GB:.2f} GB free. "
        f"Options: {'; '.join(tips)}. Set {SKIP_ENV}=1 to try anyway."
    )
