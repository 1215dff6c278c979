"""A run's proposal shape, "chain" or "tree", read in one place (a config without it, an older record, ran a chain)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def shape_of(config: Mapping[str, Any] | None) -> str:
    """ "tree" where the run's (resolved) setting says so, else "chain"."""
    return "tree" if (config or {}).get("shape") == "tree" else "chain"
