"""Hosting hooks: ZeroGPU time budgets (a race that cannot fit is cut to fewer tokens), placement, memory estimates."""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..core.methods import lanes

log = logging.getLogger(__name__)

CAP_ENV = "PYRAMID_DEMO_GPU_CAP_S"
DEFAULT_CAP_S = 120  # ZeroGPU's usual per-call limit for visitors; raise it with $CAP_ENV if yours is longer
MIN_S = 10  # never ask for less
START_S = 15.0  # loading weights to the GPU (cached in RAM after the first race) and warm-up
SAFETY = 1.5  # measured times vary; asking a little more is cheaper than an aborted race
# seconds per new token for one method on a ZeroGPU slice, pessimistic (prefill included), until a race is measured
GUESS_S_PER_TOKEN = {"tiny-random": 0.01, "smollm2-offline": 0.04, "smollm2": 0.06, "qwen2.5": 0.08, "llama3": 0.09}
FALLBACK_S_PER_TOKEN = 0.1  # a custom family

_MEASURED: dict[str, float] = {}  # preset -> seconds per new token per method, from finished races
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Budget:
    """A race's GPU allocation: seconds to ask for, the new tokens that fit, and why it was cut ("": not cut)."""

    duration_s: int
    max_new_tokens: int
    message: str = ""


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space (the platform sets SPACES_ZERO_GPU)."""
    return os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in {"1", "true", "yes"}


def cap_s() -> int:
    try:
        return max(MIN_S, int(float(os.environ.get(CAP_ENV, DEFAULT_CAP_S))))
    except ValueError:
        return DEFAULT_CAP_S


def per_token_s(preset: str) -> float:
    """This process's measured seconds per new token (one method) for the family, else a guess."""
    with _LOCK:
        return _MEASURED.get(preset, GUESS_S_PER_TOKEN.get(preset, FALLBACK_S_PER_TOKEN))


def record(preset: str, results: dict[str, Any]) -> None:
    """Learn the family's per-token time from a finished race's RunResults (prefill included)."""
    runs = [r.stats for r in results.values() if r.stats.n_new_tokens]
    if not runs:
        return
    per = sum(s.decode_s + s.prefill_s for s in runs) / sum(s.n_new_tokens for s in runs)
    with _LOCK:
        old = _MEASURED.get(preset)
        _MEASURED[preset] = per if old is None else max(per, 0.5 * (old + per))  # lean pessimistic


def plan_budget(preset: str, n_methods: int, max_new_tokens: int) -> Budget:
    """Seconds for a race of `n_methods` × `max_new_tokens` within the cap, cutting the tokens to fit."""
    per, cap = per_token_s(preset), cap_s()
    want = START_S + SAFETY * n_methods * max_new_tokens * per
    if want <= cap:
        return Budget(max(MIN_S, math.ceil(want)), max_new_tokens)
    fit = max(1, min(int((cap - START_S) / (SAFETY * n_methods * per)), max_new_tokens))
    msg = (
        f"Max new tokens cut from {max_new_tokens} to {fit}: {n_methods} methods × {max_new_tokens} tokens "
        f"at ~{per * 1000:.0f} ms a token would need ~{want:.0f} s of GPU, more than this Space's "
        f"{cap} s ZeroGPU allocation."
    )
    return Budget(cap, fit, msg)


def race_duration(
    prompt: str = "",
    preset: str = "",
    *_: Any,
    side_by_side: bool = False,
    qualifier_alone: bool = False,
    **settings: Any,
) -> int:
    """`spaces.GPU(duration=...)`: called with `handlers.race_event`'s own arguments (ids, session, progress unused)."""
    try:
        max_new = int(settings.get("max_new_tokens", 64))
    except (TypeError, ValueError):
        max_new = 64
    return plan_budget(preset, len(lanes(bool(side_by_side), bool(qualifier_alone))), max_new).duration_s


def fit_race(preset: str, n_methods: int, max_new_tokens: int) -> tuple[int, str]:
    """The max new tokens a race may use here, and a message when it was cut (ZeroGPU only)."""
    if not on_zerogpu():
        return max_new_tokens, ""
    b = plan_budget(preset, n_methods, max_new_tokens)
    return b.max_new_tokens, b.message


# ---------------------------------------------------------------- placement and memory
def placement_options() -> dict[str, str | None]:
    """The app's `--device-map` / `--quantize`: PYRAMID_DEMO_DEVICE_MAP=auto and PYRAMID_DEMO_QUANTIZE=8bit|4bit."""
    return {
        "device_map": os.environ.get("PYRAMID_DEMO_DEVICE_MAP") or None,
        "quantize": os.environ.get("PYRAMID_DEMO_QUANTIZE") or None,
    }


def memory_line(preset: str, max_new_tokens: int = 128, prompt_tokens: int = 512) -> str:
    """The family box's estimate in the dtype the family loads in here, from configs on this machine (no network)."""
    from ..models.loading import estimate, pick_device, pick_dtype
    from ..models.memory import GB, available_bytes

    try:
        dev = pick_device(None)
        quantize = placement_options()["quantize"]
        est = estimate(preset, pick_dtype(dev, None), prompt_tokens + max_new_tokens + 32, quantize, online=False)
        free = available_bytes(dev)
    except Exception as e:  # noqa: BLE001 - an estimate must never break the page
        return f"Estimate: unavailable ({type(e).__name__})"
    where = f"; {free / GB:.1f} GB free on {dev}" if free is not None and dev.type != "meta" else ""
    return f"Estimate here ({torch.device(dev)}): {est.short()}{where}"


def preload(preset: str) -> threading.Thread:
    """Load and warm the family shown first before the page serves, as a race loads it (a race never loads it twice)."""

    def work() -> None:
        from ..models.loading import load_triplet
        from ..models.warm import prepare

        try:
            prepare(load_triplet(preset, **placement_options()), [1, 2, 3])
        except Exception as e:  # noqa: BLE001 - the first race will say what is wrong, in the page
            log.warning("preloading %s failed: %r", preset, e)

    thread = threading.Thread(target=work, daemon=True, name="preload")
    thread.start()
    return thread
