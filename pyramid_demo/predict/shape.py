"""A run's proposal shape, "chain" or "tree", read in one place by the costs and the throughput model.

Why one function: the shape is a setting (`config["shape"]`, resolved from "auto" before the engine runs);
a config without it (an older record) ran a chain. Everything that prices a run asks here, never a key or a label.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHAPES = ("chain", "tree")


def shape_of(method: str, config: Mapping[str, Any] | None = None) -> str:
    """"chain" or "tree": the run's own (resolved) setting; a config without one ran a chain. `method` is kept
    for the callers' symmetry with the other pricing functions (a method has no shape of its own)."""
    got = (config or {}).get("shape")
    return str(got) if got in SHAPES else "chain"
