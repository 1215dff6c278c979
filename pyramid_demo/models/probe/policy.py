"""Which dtype, backend and forward a family loads in: a flag where given, the device's default off a CPU,
else this machine's cached probe, else a probe now. One decision, then the backend flag on top."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ...forward.backend import BACKENDS
from ...forward.lean_weights import supports_lean
from .machine import machine_key, probe_wanted
from .record import Choice
from .search import check_family, probe_target
from .store import CHOICE_FILE, read, write

log = logging.getLogger(__name__)

MAX_PROBE_PARAMS = 2e9  # above this, casting a copy of the target is too costly: no probe
ROLES = ("draft", "qualifier", "target")


def _key(family: str) -> str:
    return f"{machine_key()} | {family}"


def cached_choice(family: str) -> Choice | None:
    """This machine's cached choice for `family`, or None (none yet, or cached in an older format)."""
    return Choice.from_entry(read(CHOICE_FILE).get(_key(family)))


def remember(family: str, got: Choice) -> Choice:
    """Cache a probe's choice for this machine × family (what `choose` reads next time)."""
    write(CHOICE_FILE, _key(family), got.to_entry())
    log.info("probe for %s: %s in %.1f s", family, got.note, got.probe_s)
    return got


def device_dtype(device: torch.device) -> str:
    """The dtype a device runs when nothing is probed: bf16 on CUDA (fp16 without it), fp32 on a CPU, else fp16."""
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32" if device.type == "cpu" else "float16"


def _probed(family: str, load_fp32_target: Callable[[], tuple]) -> Choice:
    """A probe of the family's fp32 target now, cached; `load_fp32_target` gives (target, vocab[, reads_target])."""
    target, vocab, *rest = load_fp32_target()
    if sum(p.numel() for p in target.parameters()) > MAX_PROBE_PARAMS:
        return Choice("float32", "default", "device")
    publish = bool(rest and rest[0])
    return remember(family, probe_target(target, vocab, publish=True) if publish else probe_target(target, vocab))


def check_roles(family: str, choice: Choice, models: dict[str, torch.nn.Module], vocab_size: int) -> Choice:
    """The choice with every role's exactness on the forward it runs here (`search.check_family`), measured
    once after a probe and cached with it; a choice that was not probed (a flag, a device default) is not."""
    if choice.how not in ("probe", "cached") or choice.roles:
        return choice
    roles = check_family(models, vocab_size, choice.backend, choice.path)
    stored = cached_choice(family)
    if stored is not None:  # the cached choice as it was chosen, with the roles' records added
        write(CHOICE_FILE, _key(family), replace(stored, roles=roles).to_entry())
    return replace(choice, roles=roles)


def choose(family: str, device: torch.device, dtype: Any, backend: str | None,
           load_fp32_target: Callable[[], tuple[torch.nn.Module, int]], placed: bool = False) -> Choice:
    """The (dtype, backend, forward) to load `family` in: a given `dtype` or `backend` overrides; else the probe's
    cached choice or a probe now (`placed`: spread or quantised by accelerate, no probe)."""
    auto_be = backend in (None, "", "auto")
    if not auto_be and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")
    on_cpu = device.type == "cpu" and not placed
    if dtype not in (None, "", "auto"):  # exactness from this machine's probe record, if it measured this candidate
        known = cached_choice(family) if on_cpu else None
        got = Choice(str(dtype).removeprefix("torch."), "default", "flag", exactness=known.exactness if known else {},
                     path="lean" if on_cpu else "hf", attention=known.attention if known else "auto")
    elif not on_cpu:
        got = Choice(device_dtype(device), "default", "device")
    elif not probe_wanted(device):
        got = Choice("float32", "default", "off")
    else:
        got = cached_choice(family) or _probed(family, load_fp32_target)
    if auto_be:
        return got
    return replace(got, backend=str(backend), how="flag" if got.how in ("probe", "cached") else got.how)


def forward_for(choice: Choice, models: dict[str, torch.nn.Module]) -> Choice:
    """The choice with the forward that will actually run on these models: roles the lean forward does not
    cover run HF's and are named in `uncovered` (a proposer reading the target runs its own forward)."""
    if choice.path != "lean":
        return choice
    seen: dict[int, bool] = {}
    uncovered = {r: type(m).__name__ for r, m in models.items()
                 if not getattr(m, "reads_target", False) and not seen.setdefault(id(m), supports_lean(m))}
    if not uncovered:
        return choice
    return replace(choice, path="hf" if len(uncovered) == len(models) else "lean", uncovered=uncovered)
