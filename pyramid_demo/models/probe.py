"""The dtype and CPU backend for this machine, chosen by a probe of a few seconds, and the family's
measured cost profile (see `core.costs`); both cached as JSON under `bundled.cache_root()`.

On a CPU the target's cached forwards are timed (k = 1 and k = VERIFY_K new tokens over a ~100-token
context, min of a few reps) under each candidate: fp32; bf16 with oneDNN on; bf16 with oneDNN off
(bf16 only where the CPU has native bf16 instructions). The fastest by the sum of the two times wins.
The choice is cached per machine (CPU model, torch version, threads) × family. On CUDA: bf16 where
supported, else fp16; on MPS: fp16 (no timing). `--dtype` and `--backend` override it.
PYRAMID_DEMO_PROBE=0 turns the probe off (fp32, torch's default backend, as before the probe).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..core import costs
from ..core.attention import use_rowwise
from ..core.lm import BACKENDS
from ..core.packed import available as packed_available
from ..core.packed import pack_linears
from .bundled import cache_root

log = logging.getLogger(__name__)

VERIFY_K = 5  # a verification pass: a proposal of 4 plus the verifier's own token
REPS = 4
# bf16 through oneDNN comes as "packed" (weights packed once: fast and batch-invariant, see
# `core.packed`) where this torch and CPU offer it, else as plain oneDNN (re-packs every call and
# rounds a k-token pass differently from one-token steps); "no-onednn" is batch-invariant too
CANDIDATES = (("float32", "default"), ("bfloat16", "packed"), ("bfloat16", "onednn"), ("bfloat16", "no-onednn"))
MAX_PROBE_PARAMS = 2e9  # above this, casting a copy of the target is too costly: no probe
CHOICE_FILE, PROFILE_FILE = "dtype_probe.json", "cost_profiles.json"
make_timer = costs.ForwardTimer  # tests replace this timer


@dataclass
class Choice:
    dtype: str  # float32 | bfloat16 | float16
    backend: str  # default | onednn | no-onednn
    how: str  # probe | cached | flag | device | off
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # "dtype/backend" -> {k: ms}
    probe_s: float = 0.0

    @property
    def note(self) -> str:
        what = {"probe": "fastest in a probe of the target's forwards just now",
                "cached": "fastest in this machine's cached probe", "flag": "as asked on the command line",
                "device": "this device's default", "off": "the probe is off: PYRAMID_DEMO_PROBE=0"}[self.how]
        shown = {"default": "default backends", "onednn": "oneDNN on", "no-onednn": "oneDNN off",
                 "packed": "oneDNN, weights packed once"}[self.backend]
        times = "; ".join(f"{c}: " + ", ".join(f"k={k} {v:.1f} ms" for k, v in t.items())
                          for c, t in self.timings_ms.items())
        return f"{self.dtype}, {shown} ({what})" + (f" — probed: {times}" if times else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (x86 AVX-512 BF16 / AMX, or Arm bf16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.machine().lower() in ("arm64", "aarch64") and platform.system() == "Darwin"
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))


def machine_key() -> str:
    return f"{cpu_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def probe_root() -> Path:
    """Where choices and profiles are cached: $PYRAMID_DEMO_PROBE_CACHE, else `bundled.cache_root()`."""
    env = os.environ.get("PYRAMID_DEMO_PROBE_CACHE")
    return Path(env).expanduser() if env else cache_root()


def _read(name: str) -> dict:
    try:
        return json.loads((probe_root() / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write(name: str, key: str, value: dict) -> None:
    """Add one entry to a cache file (a lost write only costs a later re-probe)."""
    try:
        data = _read(name)
        data[key] = value
        root = probe_root()
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(root / name)
    except OSError as e:
        log.warning("cannot cache %s in %s: %s", name, probe_root(), e)


def candidates() -> list[tuple[str, str]]:
    packed = packed_available(torch.bfloat16)
    return [c for c in CANDIDATES if c[0] == "float32" or native_bf16() and c[1] != ("onednn" if packed else "packed")]


def probe_target(target: torch.nn.Module, vocab_size: int) -> Choice:
    """Time the target under each candidate and pick the fastest (sum of k=1 and k=VERIFY_K ms).

    Candidates are timed in interleaved rounds (each round: every candidate, every k), min over rounds,
    so a machine that gets busier during the probe penalises all alike."""
    t0 = time.perf_counter()
    timers = {}
    for dt, backend in candidates():
        model = target if dt == "float32" else copy.deepcopy(target).to(getattr(torch, dt))
        if model is not target:  # as the loader runs 16-bit CPU models (see `core.attention`)
            use_rowwise(model)
        if backend == "packed":
            pack_linears([model])
        timers[f"{dt}/{backend}"] = make_timer(model, vocab_size, backend)
    best_s: dict[str, dict[int, float]] = {c: {} for c in timers}
    for _ in range(REPS + 1):  # the first round warms up; min() keeps the best
        for c, timer in timers.items():
            for k in (1, VERIFY_K):
                best_s[c][k] = min(best_s[c].get(k, float("inf")), timer.time(k))
    timings = {c: {str(k): round(1000 * v, 3) for k, v in ks.items()} for c, ks in best_s.items()}
    best = min(timings, key=lambda c: sum(timings[c].values()))
    dt, backend = best.split("/")
    return Choice(dt, backend, "probe", timings, round(time.perf_counter() - t0, 2))


def choose(family: str, device: torch.device, dtype: Any, backend: str | None,
           load_fp32_target: Callable[[], tuple[torch.nn.Module, int]], placed: bool = False) -> Choice:
    """The (dtype, backend) to load `family` in. `dtype` (a torch.dtype, or None/"auto") and `backend`
    (None/"auto" or one of BACKENDS) given override; `load_fp32_target` gives the family's target in fp32
    and the vocabulary size, for the probe; `placed`: spread or quantised by accelerate (no probe)."""
    auto_dt = dtype in (None, "", "auto")
    auto_be = backend in (None, "", "auto")
    if not auto_be and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")
    if not auto_dt:
        return Choice(str(dtype).removeprefix("torch."), backend if not auto_be else "default", "flag")
    if placed:
        return Choice("bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported()
                      else "float16" if device.type in ("cuda", "mps") else "float32",
                      "default" if auto_be else backend, "device")
    if device.type == "cuda":
        dt = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return Choice(dt, "default" if auto_be else backend, "device")
    if device.type != "cpu":
        return Choice("float16", "default" if auto_be else backend, "device")
    if os.environ.get("PYRAMID_DEMO_PROBE", "").strip() == "0":
        return Choice("float32", "default" if auto_be else backend, "off")
    key = f"{machine_key()} | {family}"
    hit = _read(CHOICE_FILE).get(key)
    if hit:
        got = Choice(hit["dtype"], hit["backend"], "cached", hit.get("timings_ms", {}))
    else:
        target, vocab = load_fp32_target()
        n = sum(p.numel() for p in target.parameters())
        if n > MAX_PROBE_PARAMS:
            return Choice("float32", "default" if auto_be else backend, "device")
        got = probe_target(target, vocab)
        _write(CHOICE_FILE, key, {"dtype": got.dtype, "backend": got.backend, "timings_ms": got.timings_ms,
                                  "probe_s": got.probe_s, "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())})
        log.info("probe for %s: %s in %.1f s", family, got.note, got.probe_s)
    if not auto_be:
        got.backend, got.how = backend, "flag"
    return got


# ---------------------------------------------------------------- the cost profile
def cost_profile(triplet: Any, roles: tuple[str, ...] = ("draft", "qualifier", "target"),
                 max_k: int = costs.MAX_K) -> dict:
    """The family's cost profile on this machine, dtype and backend: from the cache, else measured
    now (a few seconds). A plain dict (see `core.costs`); "how" says cached or probe, "probe_s" its time."""
    dtype = str(triplet.dtype).removeprefix("torch.")
    key = f"{machine_key()} | {','.join(triplet.names)} | {triplet.device} | {dtype} | {triplet.backend} | k≤{max_k}"
    hit = _read(PROFILE_FILE).get(key)
    if hit:
        return {**hit, "how": "cached", "probe_s": 0.0}
    t0 = time.perf_counter()
    ms = costs.measure_profile({r: triplet.model(r) for r in roles}, triplet.vocab_size, triplet.backend, max_k,
                               make_timer=lambda *a: make_timer(*a))
    prof = {"ms": {r: {str(k): v for k, v in row.items()} for r, row in ms.items()}, "context": costs.CONTEXT,
            "reps": 3, "dtype": dtype, "backend": triplet.backend, "device": str(triplet.device),
            "machine": machine_key(), "models": list(triplet.names),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    _write(PROFILE_FILE, key, prof)
    return {**prof, "how": "probe", "probe_s": round(time.perf_counter() - t0, 2)}


def prepare(triplet: Any, prompt_ids: list[int]) -> dict:
    """Before a race's clocks start: warm every model, then the cost profile (cached, else measured).
    Returns {"profile", "warm_s", "profile_s"}: one-time costs the app reports apart from the lanes."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    warm_s = costs.warm_up(models, triplet.vocab_size, triplet.backend, prompt_ids)
    try:
        profile = cost_profile(triplet)
    except Exception as e:  # noqa: BLE001 - a failed profile must not stop a race
        log.warning("no cost profile: %r", e)
        profile = None
    return {"profile": profile, "warm_s": round(warm_s, 3),
            "profile_s": profile.get("probe_s", 0.0) if profile else 0.0}


def cached_choice(family: str) -> str:
    """This machine's cached dtype/backend choice for `family`, as a line for the family box."""
    hit = _read(CHOICE_FILE).get(f"{machine_key()} | {family}")
    if not hit:
        return ""
    return Choice(hit["dtype"], hit["backend"], "cached", hit.get("timings_ms", {})).note
