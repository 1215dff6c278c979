"""Which machine a cached probe belongs to: a choice measured on one CPU, instruction set, torch or thread count
says nothing about another, so the cache is keyed by all of them (`numerics`), and each entry carries them too."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def native_bf16() -> bool:
    """Whether this CPU has bf16 instructions: without them bf16 is emulated and never worth probing."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.machine().lower() in ("arm64", "aarch64") and platform.system() == "Darwin"
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))


ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "bf16", "sve")  # kernels pick by these


def cpu_flags() -> str:
    """The CPU's sorted instruction-set flags the kernels choose by (a VM may hide some, and round differently)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    have = {f for line in text.splitlines() if line.lower().startswith(("flags", "features")) for f in
            line.split(":", 1)[-1].split()}
    return ",".join(f for f in ISA_FLAGS if f in have) or platform.machine()


def numerics() -> dict[str, str | int]:
    """Everything besides the model and forward that changes a forward's rounding here (CPU, kernels, threads)."""
    return {"cpu": cpu_name(), "isa": cpu_flags(), "capability": str(torch.backends.cpu.get_cpu_capability()),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def machine_key() -> str:
    """This machine as the cache names it: every field of `numerics`, threads included."""
    n = numerics()
    return (f"{n['cpu']} | {n['isa']} | {n['capability']} | torch {n['torch']} | {n['threads']} threads")


def probe_wanted(device: torch.device) -> bool:
    """Whether a load with no --dtype on `device` probes (a CPU, the probe not turned off)."""
    return device.type == "cpu" and os.environ.get("PYRAMID_DEMO_PROBE", "").strip() != "0"
