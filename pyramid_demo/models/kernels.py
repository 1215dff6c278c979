"""Every fp32 linear on its fastest CPU kernel, chosen by timing it on this machine.

Why: torch's default fp32 linear (MKL) is fast for one row but on some CPUs costs 2-5× more for the few rows
of a verification pass, while oneDNN with a weight packed once, or fbgemm's fp16 weights, keep a short pass near
a step's cost. Which wins depends on the CPU (AVX2, AVX-512, AMX) and the shape, so each distinct shape is timed
here, once per CPU: a one-token step plus a `PASS_ROWS`-token pass, the minimum of a few repetitions.
The target keeps fp32 arithmetic (its reference precision): it chooses between the default and oneDNN only.
Proposers may also take fp16 weights. The choice is cached per CPU and torch build beside the probe's records.
"""
from __future__ import annotations

import hashlib
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core.packed import PackedLinear
from .probe import store
from .quant import Fp16Linear, fp16_available

log = logging.getLogger(__name__)

PASS_ROWS = 5  # the rows of a typical verification pass, timed beside a one-row step
KERNELS = ("default", "onednn", "fp16")
REFERENCE = ("default", "onednn")  # fp32 arithmetic: what the target may use
LABELS = {"default": "default fp32", "onednn": "oneDNN fp32", "fp16": "fp16 weights",
          "int4": "int4 weights, fp16 head", "none": "its own layers"}
Shape = tuple[int, int, bool]  # (in, out, has bias)
CACHE_FILE = "kernels.json"  # beside the probe's records (`probe.store`)


def _cpu_key() -> str:
    """What the timings depend on: the CPU model and flags, the torch build, the thread count."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                flags += line
    except OSError:
        flags = platform.processor()
    raw = f"{flags}|{torch.__version__}|{torch.get_num_threads()}"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def _build(kernel: str, lin: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor] | torch.nn.Module:
    if kernel == "onednn":
        return PackedLinear(lin)
    if kernel == "fp16":
        return Fp16Linear(lin)
    return lin


def available(role: str) -> tuple[str, ...]:
    """The kernels `role` may run on this torch build."""
    out = REFERENCE if role == "target" else KERNELS
    return tuple(k for k in out if (k != "onednn" or torch.backends.mkldnn.is_available())
                 and (k != "fp16" or fp16_available()))


@torch.inference_mode()
def time_kernel(kernel: str, lin: torch.nn.Linear, reps: int = 7) -> float:
    """Seconds for a one-row call plus a PASS_ROWS-row call (each the minimum of `reps`)."""
    f = _build(kernel, lin)
    total = 0.0
    for rows in (1, PASS_ROWS):
        x = torch.randn(rows, lin.in_features)
        f(x)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            f(x)
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


def _plain(model: torch.nn.Module) -> dict[Shape, torch.nn.Linear]:
    """One CPU fp32 `nn.Linear` of each distinct shape in `model`."""
    out: dict[Shape, torch.nn.Linear] = {}
    for m in model.modules():
        if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu":
            out.setdefault((m.in_features, m.out_features, m.bias is not None), m)
    return out


def choose(model: torch.nn.Module, role: str) -> dict[Shape, str]:
    """The fastest kernel for each shape of `model`'s fp32 linears, as `role` may run them (cached per CPU)."""
    shapes = _plain(model)
    allowed = available(role)
    if not shapes or len(allowed) < 2:
        return {s: "default" for s in shapes}
    key = f"{_cpu_key()}|{role}"
    cached = dict(store.read(CACHE_FILE).get(key, {}))
    out: dict[Shape, str] = {}
    for shape, lin in shapes.items():
        name = "x".join(map(str, shape[:2])) + ("+b" if shape[2] else "")
        if cached.get(name) in allowed:
            out[shape] = cached[name]
            continue
        times = {k: time_kernel(k, lin) for k in allowed}
        out[shape] = cached[name] = min(times, key=lambda k: times[k])
        log.info("%s %s: %s", role, name, ", ".join(f"{k} {t * 1e3:.2f} ms" for k, t in times.items()))
    store.write(CACHE_FILE, key, cached)
    return out


def apply(model: torch.nn.Module, choice: dict[Shape, str]) -> int:
    """Swap `model`'s fp32 linears for their chosen kernel (a layer shared by two parents swapped once);
    returns how many were swapped. Inference only: the new modules hold packed copies of the weights."""
    done: dict[int, torch.nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child.weight.dtype != torch.float32:
                continue
            kernel = choice.get((child.in_features, child.out_features, child.bias is not None), "default")
            if kernel == "default":
                continue
            if id(child) not in done:
                done[id(child)] = _build(kernel, child)  # type: ignore[assignment]
            setattr(parent, name, done[id(child)])
    return len(done)


def choose_family(models: dict[str, torch.nn.Module]) -> str:
    """Put each role's fp32 linears on their fastest kernel (a model shared by roles as the strictest of them
    may run, the target first); one line saying what each role runs."""
    seen: dict[int, dict[Shape, str]] = {}
    choices: dict[str, dict[Shape, str]] = {}
    for role in sorted(models, key=lambda r: r != "target"):
        m = models[role]
        if id(m) not in seen:
            seen[id(m)] = choose(m, role)
            apply(m, seen[id(m)])
        choices[role] = seen[id(m)] or {(0, 0, False): _quantized(m)}
    return summary(choices)


def _quantized(model: torch.nn.Module) -> str:
    """The kernel label of a model with no fp32 linears left (an int4 copy)."""
    return "int4" if getattr(model, "int4_group", None) else "none"


def summary(choices: dict[str, dict[Shape, str]]) -> str:
    """One line: each role's kernels, e.g. 'target: oneDNN fp32; qualifier: int4 (head fp16)'."""
    parts = []
    for role, choice in choices.items():
        kinds = sorted(set(choice.values()), key=lambda k: (KERNELS + ("int4", "none")).index(k))
        parts.append(f"{role}: " + " + ".join(LABELS[k] for k in kinds))
    return "; ".join(parts)
