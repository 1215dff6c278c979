"""One decision per model, made once at load: the core forward compiled where a package for these weights was built
here and agrees with eager, else eager (Hugging Face's for an architecture the core does not cover); nothing is timed.
What setup measures is a record to show, never an input to a choice (docs/how-it-works.md, "One manifest")."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..forward import compiled
from ..forward.cache import cache_root, probe_ids
from ..forward.core import CoreLM
from ..forward.lm import Forward, described, forward_of
from ..forward.weights import weights
from ..predict import measure
from .checks import check_family

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 2  # what an entry holds; raise it when that changes (older entries are then not read)
ISA = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "neon", "asimd", "bf16", "sve")
VECTOR_UNITS = {  # the vector unit in words: the first whose flag this CPU has
    "amx_tile": "AMX",
    "avx512_bf16": "AVX-512 BF16",
    "avx512f": "AVX-512",
    "avx2": "AVX2",
    "neon": "NEON",
    "asimd": "NEON",
}
WHY = {
    "hf": "Hugging Face's forward (an architecture the core forward does not cover)",
    "feature": "its own one-layer forward over the verifier's states",
    "lookup": "prompt lookup: no model (it copies what followed the latest earlier match of the text's last tokens)",
}


# ---------------------------------------------------------------- this machine
def cpu_flags() -> list[str]:
    """The instruction-set flags kernels choose by, in ISA's order (a VM may hide some)."""
    have = {
        f
        for line in compiled.cpuinfo().splitlines()
        if line.lower().startswith(("flags", "features"))
        for f in line.split(":", 1)[-1].split()
    }
    return [f for f in ISA if f in have]


def cpu_class() -> str:
    """This CPU in words, as every reported figure names it: model, cores, and the vector units that matter."""
    name = next(
        (ln.split(":", 1)[1].strip() for ln in compiled.cpuinfo().splitlines() if ln.lower().startswith("model name")),
        platform.processor() or platform.machine(),
    )
    f = set(cpu_flags())
    isa = next((unit for flag, unit in VECTOR_UNITS.items() if flag in f), platform.machine())
    return f"{name}, {os.cpu_count()} cores, {isa}"


def machine() -> dict[str, Any]:
    """Everything besides the weights that changes a forward's numbers here."""
    return {
        "cpu": cpu_class(),
        "isa": ",".join(cpu_flags()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def machine_key() -> str:
    return " | ".join(str(v) for v in machine().values())


# ---------------------------------------------------------------- the manifest
def manifest_path() -> Path:
    return cache_root() / MANIFEST


def read() -> dict[str, Any]:
    """The manifest's entries by key ({} when missing or unreadable: a corrupt file only costs a re-measure)."""
    try:
        data = json.loads(manifest_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def entry(key: str) -> dict[str, Any] | None:
    got = read().get(key)
    return got if isinstance(got, dict) and got.get("format") == FORMAT else None


def write(key: str, value: dict[str, Any]) -> None:
    """Add one entry, atomically (written aside, then renamed into place)."""
    path = manifest_path()
    try:
        data = read()
        data[key] = {**value, "format": FORMAT}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        log.warning("cannot write %s: %s", path, e)


# ---------------------------------------------------------------- the decision
def package_key(stem: str) -> str:
    return f"{machine_key()} | package | {stem}"


def plan_role(model: Any, vocab_size: int) -> Forward:
    """What `model` runs: its compiled package where one exists here and agrees with eager, else `described`'s kind."""
    fwd = described(model)
    if fwd.kind != "eager":
        return replace(fwd, why=WHY[fwd.kind])
    if next(model.parameters()).device.type != "cpu":  # the plan holds the core's view of its weights: built once
        return replace(fwd, why="the core pass, eager (compiled packages are built for CPUs)")
    # the name its packages and records are keyed by, hashed once (none where nothing here could be found by it)
    fp = compiled.fingerprint(model) if compiled.built_any(model) or read() else ""
    stem = compiled.package_path(model, fp).stem if fp else ""
    runner = compiled.load(model, fp) if fp else None
    if runner is None:
        why = "the core pass, eager: no compiled package for these weights here (setup builds it)"
        return replace(fwd, why=why, stem=stem)
    key = package_key(stem)
    got = entry(key)
    if got is None:
        got = agreement(model, vocab_size, runner)
        write(key, got)
    if not got["agrees"]:
        why = (
            f"the core pass, eager: its compiled pass disagreed with the eager one (top-1 differed by more than the "
            f"eager pass's own rounding, {got['noise']:.2g}; max |Δlogit| {got['max_abs_diff']:.2g})"
        )
        return replace(fwd, why=why, stem=stem)
    same = "top-1 equal" if got["flips"] == 0 else f"top-1 equal but on {got['flips']} near-tie(s) within rounding"
    why = f"the core pass, compiled (agrees with eager: {same}, max |Δlogit| {got['max_abs_diff']:.2g})"
    return replace(fwd, kind="compiled", why=why, runner=runner, stem=stem)


@torch.inference_mode()
def agreement(model: Any, vocab_size: int, runner: Any) -> dict[str, Any]:
    """The compiled pass against eager on steps, a 4-row chain, a prefill and a tree: it agrees where every row's top-1
    is eager's or a near-tie within eager's own rounding (its 4-row chain against the same rows one at a time)."""
    ids = probe_ids(80, vocab_size)
    w = weights(model)
    outs = []
    for run in (None, runner):
        lm = CoreLM(w, vocab_size, "check", run)
        z = [lm.feed(ids[:60], 1), lm.feed(ids[:61], 1), lm.feed(ids[:65], 4)]
        z.append(lm.forward(ids[65:71], 65, parents=[-1, 0, 0, 1, 1, 2]))
        outs.append(torch.cat(z))  # [12, V]
    a, b = outs  # eager, compiled
    steps = CoreLM(w, vocab_size, "check")
    steps.feed(ids[:61], 1)
    one = torch.cat([steps.feed(ids[: 62 + i], 1) for i in range(4)])  # [4, V]: the chain's rows one at a time
    noise = float((a[2:6] - one).abs().max())
    top_a, top_b = a.argmax(-1), b.argmax(-1)  # [12]
    margin = a.gather(1, top_a[:, None]) - a.gather(1, top_b[:, None])  # [12, 1]: eager's gap between the two
    flips = top_a != top_b
    return {
        "agrees": bool((margin[flips] <= noise).all()),
        "flips": int(flips.sum()),
        "noise": noise,
        "max_abs_diff": float(torch.where(a == b, 0.0, (a - b).abs()).max()),
    }


def _compilable(model: Any) -> bool:
    """A CPU core forward: the only kind a package is built for."""
    return forward_of(model) == "eager" and next(model.parameters()).device.type == "cpu"


def missing_packages(model: Any) -> list[str]:
    """The plans (`compiled.PLANS`) whose package `model` lacks here; none where it runs no compiled core pass."""
    return compiled.missing(model, compiled.fingerprint(model)) if _compilable(model) else []


def build_package(model: Any, plan: str) -> None:
    """Build `model`'s package of `plan` (one `prepare` worker's job: minutes on one core)."""
    compiled.build(model, compiled.fingerprint(model), plan)


def ensure_package(model: Any) -> str:
    """Build `model`'s packages where missing (setup only: minutes on two cores); one line saying what happened."""
    if not _compilable(model):
        return "not compiled (not a CPU core forward)"
    ok, note = compiled.ensure(model, compiled.fingerprint(model))
    return note if ok else f"not compiled: {note}"


# ---------------------------------------------------------------- the family's record
def family_key(triplet: Any) -> str:
    """A family's record is found only for these weights, forwards and dtype on this machine."""
    parts = []
    for role in ("draft", "qualifier", "target"):
        m, fwd = triplet.model(role), triplet.plan[role]
        if fwd.kind in ("eager", "compiled"):
            name = fwd.stem or compiled.package_path(m, compiled.fingerprint(m)).stem  # planned before any record
        else:
            name = getattr(m, "ref", type(m).__name__)  # a lookup's setting
        parts.append(f"{role}={fwd.kind}:{name}")
    return f"{machine_key()} | family | {','.join(triplet.names)} | {triplet.dtype} | {' '.join(parts)}"


def family_record(triplet: Any) -> dict[str, Any] | None:
    """What setup measured for this family as it runs here (checks, cost profile), or None."""
    if triplet.device.type != "cpu" or not any(f"| family | {','.join(triplet.names)} |" in k for k in read()):
        return None  # nothing recorded for this family here: no weights to fingerprint
    return entry(family_key(triplet))


def measure_family(triplet: Any, profile: bool = True) -> dict[str, Any]:
    """Measure and record the family's checks (`checks.check_family`) and cost profile (setup, `prepare`)."""
    models = {r: triplet.model(r) for r in ("draft", "qualifier", "target")}
    t0 = time.perf_counter()
    rec: dict[str, Any] = {
        "checks": check_family(models, triplet.vocab_size, runners=triplet.runners),
        "machine": machine(),
    }
    if profile:
        extras: dict = {}
        ms = measure.measure_profile(models, triplet.vocab_size, extras_out=extras, runners=triplet.runners)
        rec["profile"] = {
            "ms": {r: {str(k): v for k, v in row.items()} for r, row in ms.items()},
            **extras,
            "context": measure.CONTEXT,
            "reps": 3,
            "dtype": str(triplet.dtype).removeprefix("torch."),
            "floor": {r: measure.memory_floor_ms(m) for r, m in models.items()},
            "device": str(triplet.device),
            "machine": machine_key(),
            "models": list(triplet.names),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }
    rec["measure_s"] = round(time.perf_counter() - t0, 1)
    if triplet.device.type == "cpu":
        write(family_key(triplet), rec)
    return rec
