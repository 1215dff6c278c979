"""The last step of every model load, shared by `loading` and `bundled` (neither imports the other for it)."""

from __future__ import annotations

import torch


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
