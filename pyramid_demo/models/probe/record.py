"""The probe's choice as a typed record; display strings derive from its fields and are never read back."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ...forward.lean import ATTENTIONS
from .exactness import describe, describe_trees
from .machine import numerics as current_numerics

FORMAT = 7  # the cache entry's layout and what it checked (7: fp32 candidates only); others are probed again
HOW = {"probe": "chosen by a probe of the target's forwards just now",
       "cached": "chosen by this machine's cached probe", "flag": "as asked on the command line",
       "device": "this device's default", "off": "the probe is off: PYRAMID_DEMO_PROBE=0"}
BACKEND_TEXT = {"default": "default backends", "onednn": "oneDNN on", "no-onednn": "oneDNN off",
                "packed": "oneDNN, weights packed once"}


@dataclass(frozen=True)
class Choice:
    """How a family loads here. `timings_ms` and `exactness` are keyed by candidate ("dtype/backend/path");
    `uncovered` maps a role to the architecture the lean forward does not cover (that role runs HF's)."""

    dtype: str  # float32 | bfloat16 | float16
    backend: str  # default | packed | onednn | no-onednn
    how: str  # probe | cached | flag | device | off
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # candidate -> {k: ms}
    probe_s: float = 0.0
    exactness: dict[str, dict] = field(default_factory=dict)  # candidate -> `summarise` record
    path: str = "hf"  # the forward: "hf" (transformers) or "lean" (`forward.lean`, where the model is covered)
    uncovered: dict[str, str] = field(default_factory=dict)  # role -> architecture left on HF's forward
    roles: dict[str, dict] = field(default_factory=dict)  # role -> its record on the forward it runs (this choice)
    numerics: dict[str, Any] = field(default_factory=current_numerics)  # what it was measured under (threads...)
    attention: str = "auto"  # the lean forward's attention (`forward.lean.ATTENTIONS`) the records were measured on

    @property
    def key(self) -> str:
        """This choice's candidate name, as `timings_ms` and `exactness` key it."""
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
    def identity(self) -> tuple:
        """Every field a loaded family's view shows, as plain values: a key that holds no display text."""
        return (self.dtype, self.backend, self.path, self.how, tuple(sorted(self.uncovered.items())),
                json.dumps(self.record, sort_keys=True), json.dumps(self.roles, sort_keys=True),
                json.dumps(self.numerics, sort_keys=True), self.attention)

    # ---------------------------------------------------------------- derived display
    @property
    def exact_note(self) -> str:
        trees = describe_trees(self.record)
        return describe(self.record) + (f"; {trees}" if trees else "")

    @property
    def tree_exact(self) -> bool | None:
        """Whether tree passes are bitwise one-token steps here (None: not checked, or no tree forward)."""
        t = (self.record or {}).get("trees")
        return None if not t else bool(t["exact"])

    @property
    def forward_text(self) -> str:
        """Which forward runs, and where the lean one does not apply (so a fallback is never silent)."""
        shown = ", lean forward" if self.path == "lean" else ""
        if self.uncovered:
            roles = ", ".join(f"the {r} ({a})" for r, a in self.uncovered.items())
            shown += f", HF's forward for {roles}: the lean forward does not cover this architecture"
        return shown

    @property
    def roles_text(self) -> str:
        """The proposers whose passes were measured unequal to their steps (the lossless claim rests on the target)."""
        off = [r for r, rec in self.roles.items() if r != "target" and not rec.get("exact")]
        return (f"; the {' and '.join(off)}'s passes differ from its one-token steps (its proposals may differ at "
                "near-ties; the output's exactness rests on the target)") if off else ""

    @property
    def summary(self) -> str:
        """The choice and its exactness, for the family box, the CLI and the race's status."""
        return (f"{self.dtype}, {BACKEND_TEXT[self.backend]}{self.forward_text} ({HOW[self.how]}); "
                f"{self.exact_note}{self.roles_text}")

    @property
    def timings_text(self) -> str:
        return "; ".join(f"{c}: " + ", ".join(f"k={k} {v:.1f} ms" for k, v in t.items())
                         for c, t in self.timings_ms.items())

    @property
    def note(self) -> str:
        """The summary with the probe's timings, for logs."""
        return self.summary + (f" — probed: {self.timings_text}" if self.timings_ms else "")

    # ---------------------------------------------------------------- the cache's entry
    def to_entry(self) -> dict[str, Any]:
        return {"format": FORMAT, "dtype": self.dtype, "backend": self.backend, "path": self.path,
                "timings_ms": self.timings_ms, "exactness": self.exactness, "probe_s": self.probe_s,
                "uncovered": self.uncovered, "roles": self.roles, "numerics": self.numerics,
                "attention": self.attention,
                "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}

    @classmethod
    def from_entry(cls, entry: Any) -> Choice | None:
        """A cached choice, or None (probe again) for an older format, no exactness record, or other numerics."""
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or not entry.get("exactness"):
            return None
        if entry.get("backend") not in BACKEND_TEXT or entry.get("path") not in ("hf", "lean"):
            return None
        if entry.get("numerics") != current_numerics() or entry.get("attention") not in ATTENTIONS:
            return None
        try:
            return cls(str(entry["dtype"]), str(entry["backend"]), "cached", dict(entry.get("timings_ms") or {}),
                       float(entry.get("probe_s") or 0.0), dict(entry["exactness"]), str(entry["path"]),
                       dict(entry.get("uncovered") or {}), dict(entry.get("roles") or {}), dict(entry["numerics"]),
                       str(entry["attention"]))
        except (KeyError, TypeError, ValueError):
            return None
