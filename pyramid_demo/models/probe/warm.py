"""Before a race: warm every model and take the family's cost profile (cached), so no lane's clock pays for it."""
from __future__ import annotations

import logging
import time
from typing import Any

from ...predict import measure
from .machine import machine_key
from .search import new_timer
from .store import PROFILE_FILE, read, write

log = logging.getLogger(__name__)


def cost_profile(triplet: Any, roles: tuple[str, ...] = ("draft", "qualifier", "target"),
                 max_k: int = measure.MAX_K) -> dict:
    """The family's cost profile here (`predict.costs`): cached, else measured now; "how" says which."""
    from ...forward.llamacpp import attached_upto

    dtype = str(triplet.dtype).removeprefix("torch.")
    lc = ",".join(f"{r}≤{attached_upto(triplet.model(r))}" for r in roles if attached_upto(triplet.model(r)))
    key = (f"{machine_key()} | {','.join(triplet.names)} | {triplet.device} | {dtype} | {triplet.backend} | "
           f"{triplet.path} | compiled {','.join(getattr(triplet, 'compiled', ()))} | llama.cpp {lc} | k≤{max_k} | "
           f"{measure.PROFILE_VERSION}")
    hit = read(PROFILE_FILE).get(key)
    if hit:
        return {**hit, "how": "cached", "probe_s": 0.0}
    t0 = time.perf_counter()
    extras: dict = {}
    ms = measure.measure_profile({r: triplet.model(r) for r in roles}, triplet.vocab_size, triplet.backend, max_k,
                               path=triplet.path, make_timer=new_timer, extras_out=extras)
    floor = {r: measure.memory_floor_ms(triplet.model(r), triplet.backend) for r in roles}
    prof = {"ms": {r: {str(k): v for k, v in row.items()} for r, row in ms.items()}, **extras,
            "context": measure.CONTEXT,
            "floor": floor, "reps": 3, "dtype": dtype, "backend": triplet.backend, "path": triplet.path,
            "device": str(triplet.device), "machine": machine_key(), "models": list(triplet.names),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    write(PROFILE_FILE, key, prof)
    return {**prof, "how": "probe", "probe_s": round(time.perf_counter() - t0, 2)}


def prepare(triplet: Any, prompt_ids: list[int]) -> dict:
    """Warm every model, then the cost profile; returns {"profile", "warm_s", "profile_s"} (one-time costs)."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    warm_s = measure.warm_up(models, triplet.vocab_size, triplet.backend, prompt_ids, triplet.path)
    try:
        profile = cost_profile(triplet)
    except Exception as e:  # noqa: BLE001 - a failed profile must not stop a race
        log.warning("no cost profile: %r", e)
        profile = None
    return {"profile": profile, "warm_s": round(warm_s, 3),
            "profile_s": profile.get("probe_s", 0.0) if profile else 0.0}
