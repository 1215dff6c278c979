"""The dtype and CPU backend for this machine, chosen by a probe of several seconds, and the family's
measured cost profile (see `core.costs`); both cached as JSON under `bundled.cache_root()`.

On a CPU each candidate — fp32; bf16 with packed oneDNN linears (or plain oneDNN where packing is not
offered); bf16 with oneDNN off (bf16 only where the CPU has native bf16 instructions) — is checked
for exactness and timed on the real target:
- exactness (`core.exactness`): k-token passes against one-token steps, k = 2 … the longest pass the
  settings allow, over several contexts; packed linears are first padded to the smallest row count
  that makes them batch-invariant on this CPU (`core.packed.invariant_pad`);
- speed: cached forwards of k = 1 and k = VERIFY_K new tokens, weighted as a race spends them.
The fastest exact candidate wins; if none is exact, the fastest whose top-1 always matched, and every
place that reports the choice says that lossless methods may then differ from AR at near-ties. The
choice and its exactness record are cached per machine (CPU model, torch version, threads) × family;
a cached choice without an exactness record is probed again. On CUDA: bf16 where supported, else
fp16; on MPS: fp16 (not probed here: `scripts/gpu_check.sh` checks exactness there). `--dtype` and
`--backend` override the choice (its exactness then comes from the cached record, if any).
PYRAMID_DEMO_PROBE=0 turns the probe off (fp32, torch's default backend, as before the probe).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from ..core import costs, exactness
from ..core.attention import use_rowwise
from ..core.config import LONGEST_PASS
from ..core.lean import supports_lean
from ..core.lm import BACKENDS, open_lm
from ..core.packed import available as packed_available
from ..core.packed import bf16_linears, invariant_pad, pack_linears
from .bundled import cache_root

log = logging.getLogger(__name__)

VERIFY_K = 5  # a verification pass: a proposal of 4 plus the verifier's own token
REPS = 4
# A race's target forwards: AR's N one-token steps, and four speculative methods that each verify
# about once per 1.4 tokens (the offline family's acceptance, α ≈ 0.3 at γ 4: E = 1.43), ≈ 2.8N passes
SCORE_WEIGHTS = {1: 1.0, VERIFY_K: 3.0}
# exactness plan: (context length, pass lengths k); the first context's steps reach the longest pass
EXACT_PLAN = ((100, (*range(2, 10), 17, 33, LONGEST_PASS)), (60, tuple(range(2, 10))), (140, tuple(range(2, 10))))
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
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # "dtype/backend/path" -> {k: ms}
    probe_s: float = 0.0
    exactness: dict[str, dict] = field(default_factory=dict)  # "dtype/backend/path" -> `exactness.summarise` record
    path: str = "hf"  # the forward: "hf" (transformers) or "lean" (`core.lean`, where the model is covered)

    @property
    def key(self) -> str:
        return f"{self.dtype}/{self.backend}/{self.path}"

    @property
    def record(self) -> dict | None:
        """This choice's exactness record on this machine, if one was measured."""
        return self.exactness.get(self.key)

    @property
    def exact(self) -> bool | None:
        return None if self.record is None else bool(self.record["exact"])

    @property
    def pad_rows(self) -> int:
        return int((self.record or {}).get("pad_rows") or 1)

    @property
    def exact_note(self) -> str:
        return exactness.describe(self.record)

    @property
    def note(self) -> str:
        what = {"probe": "chosen by a probe of the target's forwards just now",
                "cached": "chosen by this machine's cached probe", "flag": "as asked on the command line",
                "device": "this device's default", "off": "the probe is off: PYRAMID_DEMO_PROBE=0"}[self.how]
        shown = {"default": "default backends", "onednn": "oneDNN on", "no-onednn": "oneDNN off",
                 "packed": "oneDNN, weights packed once"}[self.backend]
        shown += ", lean forward" if self.path == "lean" else ""
        times = "; ".join(f"{c}: " + ", ".join(f"k={k} {v:.1f} ms" for k, v in t.items())
                          for c, t in self.timings_ms.items())
        return f"{self.dtype}, {shown} ({what}); {self.exact_note}" + (f" — probed: {times}" if times else "")


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


def candidate_model(target: torch.nn.Module, dt: str, backend: str) -> tuple[torch.nn.Module, int]:
    """The target as the loader would run it under (dt, backend), and the packed linears' padding."""
    if dt == "float32":
        return target, 1
    model = copy.deepcopy(target).to(getattr(torch, dt))
    use_rowwise(model)  # as the loader runs 16-bit CPU models (see `core.attention`)
    pad = 1
    if backend == "packed":
        pad = invariant_pad(bf16_linears([model]), LONGEST_PASS) or 1
        pack_linears([model], pad)
    return model, pad


def check_triplet(triplet: Any) -> dict:
    """The exactness record of a loaded family's target as it runs (its device, dtype and backend)."""
    return exactness.check_model(
        lambda: open_lm(triplet.target, triplet.vocab_size, "probe", triplet.backend, triplet.path),
        triplet.vocab_size, EXACT_PLAN)


def score(timings: dict[str, float]) -> float:
    """A candidate's weighted forward time, as a race spends it (SCORE_WEIGHTS)."""
    return sum(w * timings[str(k)] for k, w in SCORE_WEIGHTS.items())


def pick(timings: dict[str, dict[str, float]], records: dict[str, dict]) -> str:
    """The fastest exact candidate; else the fastest whose top-1 always matched; else the fastest."""
    pool = ([c for c in timings if records.get(c, {}).get("exact")]
            or [c for c in timings if records.get(c, {}).get("top1")] or list(timings))
    return min(pool, key=lambda c: score(timings[c]))


def probe_target(target: torch.nn.Module, vocab_size: int, check_all: bool = False) -> Choice:
    """Time each candidate (dtype, backend, forward path; k=1 and k=VERIFY_K), then check exactness from
    the fastest down until one is exact (`check_all`: every candidate, for a full table), and `pick`.

    Candidates are timed in interleaved rounds (each round: every candidate, every k), min over rounds,
    so a machine that gets busier during the probe penalises all alike."""
    t0 = time.perf_counter()
    runs, timers = {}, {}
    paths = ("lean", "hf") if supports_lean(target) else ("hf",)
    for dt, backend in candidates():
        model, pad = candidate_model(target, dt, backend)
        for path in paths:
            c = f"{dt}/{backend}/{path}"
            runs[c] = (model, pad, backend, path)
            timers[c] = make_timer(model, vocab_size, backend, path=path)
    best_s: dict[str, dict[int, float]] = {c: {} for c in timers}
    for _ in range(REPS + 1):  # the first round warms up; min() keeps the best
        for c, timer in timers.items():
            for k in SCORE_WEIGHTS:
                best_s[c][k] = min(best_s[c].get(k, float("inf")), timer.time(k))
    timings = {c: {str(k): round(1000 * v, 3) for k, v in ks.items()} for c, ks in best_s.items()}
    records: dict[str, dict] = {}
    for c in sorted(timings, key=lambda c: score(timings[c])):
        model, pad, backend, path = runs[c]
        records[c] = exactness.check_model(lambda: open_lm(model, vocab_size, "probe", backend, path),
                                           vocab_size, EXACT_PLAN, pad)
        if records[c]["exact"] and not check_all:
            break
    dt, backend, path = pick(timings, records).split("/")
    return Choice(dt, backend, "probe", timings, round(time.perf_counter() - t0, 2), records, path)


def remember(family: str, got: Choice) -> Choice:
    """Cache a probe's choice for this machine × family (what `choose` reads next time)."""
    _write(CHOICE_FILE, f"{machine_key()} | {family}",
           {"dtype": got.dtype, "backend": got.backend, "path": got.path, "timings_ms": got.timings_ms,
            "exactness": got.exactness, "probe_s": got.probe_s,
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())})
    log.info("probe for %s: %s in %.1f s", family, got.note, got.probe_s)
    return got


def table(got: Choice) -> str:
    """The probe's candidates as a markdown table: speed, exactness, padding, the pick."""
    head = ("| candidate (dtype / backend / forward) | k=1 ms | k=5 ms | weighted | bitwise passes | max diff "
            "| top-1 equal | pad rows | chosen |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    for c, t in sorted(got.timings_ms.items(), key=lambda ct: score(ct[1])):
        r = got.exactness.get(c)
        ex = (f"{r['bitwise_passes']}/{r['passes']}", f"{r['max_abs_diff']:.2g}", "yes" if r["top1"] else "no",
              str(r["pad_rows"])) if r else ("not checked",) + ("–",) * 3
        rows.append(f"| {c} | {t['1']:.1f} | {t[str(VERIFY_K)]:.1f} | {score(t):.1f} | " + " | ".join(ex)
                    + f" | {'**yes**' if c == got.key else ''} |")
    return "\n".join([head, *rows])


def choose(family: str, device: torch.device, dtype: Any, backend: str | None,
           load_fp32_target: Callable[[], tuple[torch.nn.Module, int]], placed: bool = False) -> Choice:
    """The (dtype, backend) to load `family` in. `dtype` (a torch.dtype, or None/"auto") and `backend`
    (None/"auto" or one of BACKENDS) given override; `load_fp32_target` gives the family's target in fp32
    and the vocabulary size, for the probe; `placed`: spread or quantised by accelerate (no probe)."""
    auto_dt = dtype in (None, "", "auto")
    auto_be = backend in (None, "", "auto")
    if not auto_be and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")
    key = f"{machine_key()} | {family}"
    if not auto_dt:  # exactness from this machine's probe record, if it measured this candidate
        known = _read(CHOICE_FILE).get(key, {}).get("exactness", {}) if device.type == "cpu" and not placed else {}
        return Choice(str(dtype).removeprefix("torch."), backend if not auto_be else "default", "flag",
                      exactness=known, path="lean" if device.type == "cpu" and not placed else "hf")
    if placed:
        return Choice("bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported()
                      else "float16" if device.type in ("cuda", "mps") else "float32",
                      "default" if auto_be else backend, "device")
    if device.type == "cuda":
        dt = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return Choice(dt, "default" if auto_be else backend, "device")
    if device.type != "cpu":
        return Choice("float16", "default" if auto_be else backend, "device")
    if not probe_wanted(device):
        return Choice("float32", "default" if auto_be else backend, "off")
    hit = _read(CHOICE_FILE).get(key)
    if hit and hit.get("exactness") and hit.get("path"):  # a choice cached without them is probed again
        got = Choice(hit["dtype"], hit["backend"], "cached", hit.get("timings_ms", {}), exactness=hit["exactness"],
                     path=hit["path"])
    else:
        target, vocab = load_fp32_target()
        n = sum(p.numel() for p in target.parameters())
        if n > MAX_PROBE_PARAMS:
            return Choice("float32", "default" if auto_be else backend, "device")
        got = remember(family, probe_target(target, vocab))
    if not auto_be:
        return replace(got, backend=backend, how="flag")
    return got


# ---------------------------------------------------------------- the cost profile
def cost_profile(triplet: Any, roles: tuple[str, ...] = ("draft", "qualifier", "target"),
                 max_k: int = costs.MAX_K) -> dict:
    """The family's cost profile on this machine, dtype and backend: from the cache, else measured
    now (a few seconds). A plain dict (see `core.costs`); "how" says cached or probe, "probe_s" its time."""
    dtype = str(triplet.dtype).removeprefix("torch.")
    key = (f"{machine_key()} | {','.join(triplet.names)} | {triplet.device} | {dtype} | {triplet.backend} | "
           f"{triplet.path} | k≤{max_k}")
    hit = _read(PROFILE_FILE).get(key)
    if hit:
        return {**hit, "how": "cached", "probe_s": 0.0}
    t0 = time.perf_counter()
    ms = costs.measure_profile({r: triplet.model(r) for r in roles}, triplet.vocab_size, triplet.backend, max_k,
                               path=triplet.path,
                               make_timer=lambda *a, **kw: make_timer(*a, **kw))
    floor = {r: costs.memory_floor_ms(triplet.model(r), triplet.backend) for r in roles}
    prof = {"ms": {r: {str(k): v for k, v in row.items()} for r, row in ms.items()}, "context": costs.CONTEXT,
            "floor": floor,
            "reps": 3, "dtype": dtype, "backend": triplet.backend, "path": triplet.path, "device": str(triplet.device),
            "machine": machine_key(), "models": list(triplet.names),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    _write(PROFILE_FILE, key, prof)
    return {**prof, "how": "probe", "probe_s": round(time.perf_counter() - t0, 2)}


def prepare(triplet: Any, prompt_ids: list[int]) -> dict:
    """Before a race's clocks start: warm every model, then the cost profile (cached, else measured).
    Returns {"profile", "warm_s", "profile_s"}: one-time costs the app reports apart from the lanes."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    warm_s = costs.warm_up(models, triplet.vocab_size, triplet.backend, prompt_ids, triplet.path)
    try:
        profile = cost_profile(triplet)
    except Exception as e:  # noqa: BLE001 - a failed profile must not stop a race
        log.warning("no cost profile: %r", e)
        profile = None
    return {"profile": profile, "warm_s": round(warm_s, 3),
            "profile_s": profile.get("probe_s", 0.0) if profile else 0.0}


def probe_wanted(device: torch.device) -> bool:
    """Whether a load with no --dtype on `device` probes (a CPU, the probe not turned off)."""
    return device.type == "cpu" and os.environ.get("PYRAMID_DEMO_PROBE", "").strip() != "0"


def cached_choice(family: str) -> str:
    """This machine's cached dtype/backend choice for `family`, as a line for the family box."""
    hit = _read(CHOICE_FILE).get(f"{machine_key()} | {family}")
    if not hit or not hit.get("exactness") or not hit.get("path"):
        return ""
    return Choice(hit["dtype"], hit["backend"], "cached", hit.get("timings_ms", {}), exactness=hit["exactness"],
                  path=hit["path"]).note
