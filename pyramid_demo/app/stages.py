"""The first race's one-time stages (convert, load, warm), with progress as elapsed time against the usual time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

# (the status line, what the stage usually takes on 2 cores, in seconds)
STAGES = {
    "convert": ("Converting the bundled SmolLM2 GGUF into a cached copy (first run on this machine only)", 40.0),
    "load": ("Loading the three models", 8.0),
    "warm": ("Warming up every model (not counted in any lane)", 4.0),
}
POLL_S = 0.5


def loading_stage(preset: str) -> str:
    """Which stage a load of `preset` is in now: convert or load."""
    from ..models import bundled

    return "convert" if preset == "smollm2-offline" and not bundled.is_converted() else "load"


def run_staged(work: Callable[[], Any], stage: Callable[[], str]) -> Iterator[tuple[str, float, float]]:
    """Run `work` in a thread, yielding (status, progress 0..1, elapsed s) every POLL_S; returns (raises) its result."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = work()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t0, since, current = time.perf_counter(), time.perf_counter(), None
    t.start()
    while t.is_alive():
        t.join(POLL_S)
        name = stage()
        if name != current:
            current, since = name, time.perf_counter()
        text, usual = STAGES[name]
        spent = time.perf_counter() - since
        yield f"⏳ {text}… {spent:.0f} s", min(0.95, spent / usual), time.perf_counter() - t0
    if "error" in out:
        raise out["error"]
    return out.get("value")
