"""A reference run: one member of the family decoding alone, exactly as AR decodes with the target.

Why: the race shows how close a pyramid comes to the speed of its qualifier (the target's int4 copy in the offline
family) while it still writes the target's text. The engine runs such a lane as method "ar" with the member in
the target's slot, so it decodes (greedy or sampled) exactly as AR would with that model as the target; its
record then names the member wherever the engine wrote "target" (`relabel`), so the chips, the forward counts and
times, the race's noise and the cost profile's prediction all read the model that really ran.
"""
from __future__ import annotations

from dataclasses import replace

from ..forward.lm import LM, ModelTriplet, open_lm
from .methods import ROLE_ORDER
from .trace import Step


def solo_lms(triplet: ModelTriplet, role: str, backend: str = "default", path: str = "hf") -> dict[str, LM]:
    """The engine's LMs for `role` decoding alone: one LM over its model, in the target's slot; a ValueError in
    words for a role that is not a family member or a model that cannot decode without another's states."""
    if role not in ROLE_ORDER:
        raise ValueError(f"unknown role {role!r} to decode alone; choose one of {', '.join(ROLE_ORDER)}")
    model = triplet.model(role)
    if getattr(model, "reads_target", False):
        raise ValueError(f"the {role} reads its verifier's hidden states, so it cannot decode alone")
    return {"target": open_lm(model, triplet.vocab_size, role, backend, path)}


def relabel(step: Step, role: str) -> Step:
    """A step the engine recorded with `role` in the target's slot, with `role` named wherever it says "target"
    (the new tokens' origins, forward times and counts, the tokens fed): the record of the model that ran."""
    def swap(d: dict) -> dict:
        return {role if k == "target" else k: v for k, v in d.items()}

    return replace(step, origins=[role if o == "target" else o for o in step.origins], time_s=swap(step.time_s),
                   n_forward=swap(step.n_forward), fed=swap(step.fed))
