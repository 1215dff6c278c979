"""The last step of every model load, shared by `loading` and `bundled` (neither imports the other for it)."""
from __future__ import annotations

import torch


def finish(model: torch.nn.Module, dev: torch.device) -> torch.nn.Module:
    """Put a loaded model on `dev`, in eval mode and frozen: the engine only runs inference."""
    if next(model.parameters()).device != dev:
        model.to(dev)
    model.eval()
    model.requires_grad_(False)
    return model
