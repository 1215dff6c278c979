"""Where a family's weights go: one device, `auto` (accelerate over GPUs and CPU RAM), optional 8-/4-bit; and the last
step of every model load (`finish`)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .errors import LoadError


@dataclass(frozen=True)
class Placement:
    """`device_map`: None (everything on one device) or "auto"; `quantize`: None, "8bit", "4bit"."""

    device_map: str | None = None
    quantize: str | None = None


def bitsandbytes_available() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def make_placement(
    device_map: str | None = None, quantize: str | None = None, device: torch.device | None = None
) -> Placement:
    """Validate the options into a Placement, or raise LoadError saying what to do instead."""
    dm = (device_map or "").strip().lower() or None
    q = (quantize or "").strip().lower() or None
    dm = None if dm in ("none", "single") else dm
    if dm not in (None, "auto"):
        raise LoadError(
            f"Unknown device map {device_map!r}: use 'auto' (spread over the visible GPUs and "
            "offload to CPU RAM) or leave it out (one device)."
        )
    q = None if q in ("none", "no", "off") else q
    if q is not None:
        q = {"8": "8bit", "int8": "8bit", "4": "4bit", "nf4": "4bit", "int4": "4bit"}.get(q, q)
        if q not in ("8bit", "4bit"):
            raise LoadError(f"Unknown quantisation {quantize!r}: use 8bit or 4bit.")
        if not bitsandbytes_available():
            raise LoadError(
                f"--quantize {q} needs the bitsandbytes package, which is not installed. On a "
                "CUDA machine run `pip install bitsandbytes`; or drop --quantize and use "
                "--device-map auto to spread the family over GPUs and CPU RAM."
            )
        if device is not None and device.type != "cuda":
            raise LoadError(
                f"--quantize {q} (bitsandbytes) needs a CUDA GPU; this run is on {device}. "
                "Use a 16-bit --dtype on this device instead."
            )
    return Placement(dm, q)


def pretrained_kwargs(p: Placement, dev: torch.device, dt: torch.dtype) -> dict[str, Any]:
    kw: dict[str, Any] = {"dtype": dt}
    if p.device_map == "auto":
        kw["device_map"] = "auto"  # accelerate: GPUs first, then CPU RAM (then disk)
    elif dev.type != "cpu" or p.quantize:
        kw["device_map"] = {"": dev}
    if p.quantize:
        from transformers import BitsAndBytesConfig

        if p.quantize == "8bit":
            kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        else:
            kw["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dt
            )
    return kw


def finish(model: torch.nn.Module, dev: torch.device) -> torch.nn.Module:
    """Put a loaded model on `dev`, in eval mode and frozen: the engine only runs inference."""
    if not is_placed(model) and next(model.parameters()).device != dev:
        model.to(dev)
    model.eval()
    model.requires_grad_(False)
    return model


def is_placed(model: torch.nn.Module) -> bool:
    """Spread over devices by accelerate, or quantised by bitsandbytes: never moved with `.to`."""
    dmap = getattr(model, "hf_device_map", None)
    multi = isinstance(dmap, dict) and len(set(map(str, dmap.values()))) > 1
    return multi or bool(getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False))
