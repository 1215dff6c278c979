"""Which machine a cached probe belongs to: a choice measured on one CPU, torch or thread count says
nothing about another, so the cache is keyed by all three."""
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
    """Whether this CPU has bf16 instructions (x86 AVX-512 BF16 / AMX, or Arm bf16): without them bf16 is
    emulated and never worth probing."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.machine().lower() in ("arm64", "aarch64") and platform.system() == "Darwin"
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))


def machine_key() -> str:
    """This machine as the cache names it: CPU, torch version, threads."""
    return f"{cpu_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def probe_wanted(device: torch.device) -> bool:
    """Whether a load with no --dtype on `device` probes (a CPU, the probe not turned off)."""
    return device.type == "cpu" and os.environ.get("PYRAMID_DEMO_PROBE", "").strip() != "0"
