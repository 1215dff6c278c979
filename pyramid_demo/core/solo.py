"""A reference run: one member decoding alone as "ar" in the target's slot, its record naming it (`relabel`)."""

from __future__ import annotations

from dataclasses import replace

from ..forward.lm import LM, ModelTriplet
from .methods import ROLE_ORDER
from .trace import Step


def solo_lms(triplet: ModelTriplet, role: str) -> dict[str, LM]:
    """The engine's LMs for `role` decoding alone in the target's slot; ValueError where it cannot."""
    if role not in ROLE_ORDER:
        raise ValueError(f"unknown role {role!r} to decode alone; choose one of {', '.join(ROLE_ORDER)}")
    model = triplet.model(role)
    if getattr(model, "reads_verifier", False):
        raise ValueError(f"the {role} reads its verifier's hidden states, so it cannot decode alone")
    return {"target": triplet.open(role)}


def relabel(step: Step, role: str) -> Step:
    """A step recorded with `role` in the target's slot, naming `role` wherever it says "target"."""

    def swap(d: dict) -> dict:
        return {role if k == "target" else k: v for k, v in d.items()}

    return replace(
        step,
        origins=[role if o == "target" else o for o in step.origins],
        time_s=swap(step.time_s),
        n_forward=swap(step.n_forward),
        fed=swap(step.fed),
    )
