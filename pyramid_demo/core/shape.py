"""A run's proposal shape, "chain" or "tree", read in one place by the costs and the throughput model.

Why one function: the shape is becoming a setting (`config["shape"]`); until every run's config carries it,
it follows from the method's row. Everything that prices a run asks here, never a key or a label.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .methods import method_spec

SHAPES = ("chain", "tree")


def shape_of(method: str, config: Mapping[str, Any] | None = None) -> str:
    """"chain" or "tree": the run's own setting where its config has one, else the method's row."""
    got = (config or {}).get("shape")
    if got in SHAPES:
        return str(got)
    return "tree" if getattr(method_spec(method), "tree", False) else "chain"  # a row without the flag: a chain
