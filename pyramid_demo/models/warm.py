"""Before a race: warm every model, read the cost profile setup measured (nothing measured on a visitor's request)."""

from __future__ import annotations

from typing import Any

from ..predict import measure
from .runtime import family_record, measure_family


def cost_profile(triplet: Any, measure_now: bool = False) -> dict | None:
    """The family's cost profile as setup recorded it ("how": "cached"); `measure_now` measures one ("measured")."""
    rec = family_record(triplet)
    if rec and rec.get("profile"):
        return {**rec["profile"], "how": "cached"}
    if not measure_now:
        return None
    return {**measure_family(triplet)["profile"], "how": "measured"}


def prepare(triplet: Any, prompt_ids: list[int]) -> dict:
    """Warm every model (no lane's clock pays first-call costs); the cached profile, if any."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    warm_s = measure.warm_up(models, triplet.vocab_size, prompt_ids, triplet.runners)
    return {"profile": cost_profile(triplet), "warm_s": round(warm_s, 3)}
