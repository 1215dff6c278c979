"""The probe's JSON cache, one file per kind and one entry per key: a lost file only costs a later re-probe."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..bundled import cache_root

log = logging.getLogger(__name__)

CHOICE_FILE, PROFILE_FILE = "dtype_probe.json", "cost_profiles.json"


def probe_root() -> Path:
    """Where choices and profiles are cached: $PYRAMID_DEMO_PROBE_CACHE, else `bundled.cache_root()`."""
    env = os.environ.get("PYRAMID_DEMO_PROBE_CACHE")
    return Path(env).expanduser() if env else cache_root()


def read(name: str) -> dict[str, Any]:
    """A cache file's entries by key ({} when missing or unreadable)."""
    try:
        data = json.loads((probe_root() / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(name: str, key: str, value: dict[str, Any]) -> None:
    """Add one entry to a cache file, atomically (a lost write only costs a later re-probe)."""
    try:
        data = read(name)
        data[key] = value
        root = probe_root()
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(root / name)
    except OSError as e:
        log.warning("cannot cache %s in %s: %s", name, probe_root(), e)
