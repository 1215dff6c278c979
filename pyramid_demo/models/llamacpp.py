"""Which roles run on llama.cpp (`forward.llamacpp`): a model loaded from a GGUF keeps that file as its llama.cpp
source (the target: an F32 copy, its checkpoint's reference precision; the offline qualifier: the bundled Q4_1
file itself, the same codes as its int4 copy). Each such role is timed on both forwards it could run, for the
pass lengths the runs feed, and runs on the faster one; the choice is cached per CPU, build and file."""
from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..forward import llamacpp
from .bundled import cache_root
from .errors import LoadError

log = logging.getLogger(__name__)

TIMED = (1, 2, 3, 5, 9, 17)  # pass lengths a run feeds: a step, verification passes up to the longest ℓ_Q + 1
OPTIONS = ("llama.cpp", "torch")
REPS = 4
KEY_VERSION = 2  # raise when what the entry holds changes
CACHE_FILE = "kernels.json"  # the kernel choice's cache (`models.kernels`)
_SOURCES: weakref.WeakKeyDictionary[Any, Callable[[], Path]] = weakref.WeakKeyDictionary()
_LOADED: dict[str, llamacpp.GgufModel] = {}
_LOCK = threading.Lock()
CHOSEN: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, dict[int, float]]]] = weakref.WeakKeyDictionary()


def register(model: Any, source: Callable[[], Path]) -> None:
    """`model` can run on llama.cpp over the GGUF `source()` gives (made on first use: an F32 copy takes seconds)."""
    _SOURCES[model] = source


def source_of(model: Any) -> Callable[[], Path] | None:
    try:
        return _SOURCES.get(model)
    except TypeError:
        return None


def f32_source(gguf: Path) -> Callable[[], Path]:
    """A GGUF's F32 copy in the project's cache (made once by llama.cpp's quantizer), keyed by the file's identity."""
    def make() -> Path:
        st = gguf.stat()
        tag = hashlib.sha1(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:12]
        dest = cache_root() / "gguf" / f"{gguf.stem}.{tag}.F32.gguf"
        return dest if dest.is_file() else llamacpp.f32_copy(gguf, dest)
    return make


def loaded(path: Path) -> llamacpp.GgufModel:
    """One llama.cpp model per file per process (weights shared by every run); LoadError naming a bad file."""
    key = str(path)
    with _LOCK:
        if key not in _LOADED:
            try:
                _LOADED[key] = llamacpp.GgufModel(path)
            except ValueError as e:
                raise LoadError(str(e)) from e
        return _LOADED[key]


def _key(path: Path, torch_kind: str) -> str:
    from .probe.machine import machine_key

    st = path.stat()
    return f"llamacpp|v{KEY_VERSION}|{machine_key()}|{path.name}|{st.st_size}|torch={torch_kind}"


def longest_faster(ms: dict[str, dict[int, float]]) -> int:
    """The longest pass length up to which llama.cpp is faster than torch at every timed length (0: at none)."""
    upto = 0
    for k in TIMED:
        if ms["llama.cpp"][k] > ms["torch"][k]:
            break
        upto = k
    return upto


def measure(model: torch.nn.Module, gguf: llamacpp.GgufModel, vocab_size: int) -> dict[str, dict[int, float]]:
    """ms of one cached forward of each TIMED length on either forward, interleaved rounds, min over rounds."""
    from ..predict.measure import ForwardTimer

    timers = {}
    for kind in OPTIONS:
        llamacpp.attach(model, gguf if kind == "llama.cpp" else None)
        timers[kind] = ForwardTimer(model, vocab_size, path="lean")
        timers[kind].time(1)
    best: dict[str, dict[int, float]] = {kind: {} for kind in OPTIONS}
    for _ in range(REPS):
        for kind, timer in timers.items():
            for k in TIMED:
                best[kind][k] = min(best[kind].get(k, float("inf")), 1e3 * timer.time(k))
    llamacpp.attach(model, None)
    return best


def choose(model: torch.nn.Module, vocab_size: int, torch_kind: str) -> str:
    """Attach llama.cpp to `model` for the pass lengths at which it times faster than its torch forward
    (`torch_kind`: what that forward is, e.g. "compiled"), cached per CPU, file and torch forward; returns
    "llama.cpp" (for some lengths), "torch", or "torch (why)"."""
    from .probe import store

    source = source_of(model)
    if source is None or next(model.parameters()).device.type != "cpu":
        return "torch"
    if llamacpp.binding() is None:
        return f"torch (llama.cpp not available: {llamacpp.unavailable_reason()[:80]})"
    try:
        path = source()
        gguf = loaded(path)
    except (LoadError, OSError, RuntimeError, ValueError) as e:
        log.warning("llama.cpp copy not used: %s", e)
        return f"torch (llama.cpp copy failed: {str(e)[:80]})"
    key = _key(path, torch_kind)
    entry = store.read(CACHE_FILE).get(key, {})
    try:
        ms = {kind: {int(k): float(v) for k, v in entry["ms"][kind].items()} for kind in OPTIONS}
        assert all(set(ms[kind]) == set(TIMED) for kind in OPTIONS)
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError):  # none yet, or stale: measure
        ms = measure(model, gguf, vocab_size)
        store.write(CACHE_FILE, key, {"ms": {kind: {str(k): round(v, 2) for k, v in t.items()}
                                             for kind, t in ms.items()}})
    upto = longest_faster(ms)
    CHOSEN[model] = (upto, ms)
    llamacpp.attach(model, gguf if upto else None, upto)
    return "llama.cpp" if upto else "torch"


def describe(model: Any) -> str:
    """What `model` runs on, in words, with the figures that chose it ("" when it has no llama.cpp copy)."""
    got = CHOSEN.get(model)
    if got is None:
        return ""
    upto, ms = got
    fig = ", ".join(f"k={k} {ms['llama.cpp'][k]:.1f} vs {ms['torch'][k]:.1f} ms" for k in (1, TIMED[-1]))
    g = llamacpp.gguf_of(model, 1)
    if not upto or g is None:
        return f"torch (its llama.cpp copy is slower here: {fig})"
    name = g.path.name.split(".")[-2]
    more = "every pass" if upto >= TIMED[-1] else f"passes of ≤ {upto} rows, torch for longer ones"
    return f"llama.cpp {name} for {more} ({fig})"


def bundled_sources(target: Any, qualifier: Any, gguf: Path) -> None:
    """The offline family: the target over the bundled file's F32 copy, its quantized copy over the file itself."""
    register(target, f32_source(gguf))
    if qualifier is not target:
        register(qualifier, lambda: gguf)
