"""The engine's own work in a run, counted from its records (`census`) and priced from the profile (`price`)."""

from __future__ import annotations

from typing import Any

from ..core.methods import method_spec
from ..core.trace import StageRound, Step
from .shape import shape_of
from .walk_stats import cut_short, trials

UNITS = ("step", "feed", "round", "div", "div1", "expand")


def engine_ms(profile: dict, unit: str, role: str | None = None) -> float:
    """One unit's price in ms (0.0 where the profile has none): `keep` is per role."""
    e = profile.get("engine_ms") or {}
    return float((e.get("keep") or {}).get(role or "", 0.0)) if unit == "keep" else float(e.get(unit, 0.0))


def priced(profile: dict) -> bool:
    """Whether the profile carries the engine's prices (else predictions price forwards only)."""
    return bool(profile.get("engine_ms"))


def tree_stage(method: str) -> str:
    """The stage whose proposal is the tree in a tree run: the first verification (a pyramid's stage 1)."""
    return "qualifier" if method_spec(method).pyramid else "target"


def _round_units(rnd: StageRound, tree: bool, out: dict[str, Any]) -> None:
    out["round"] += 1
    if tree:
        for role in (rnd.proposer, rnd.verifier):
            out["keep"][role] = out["keep"].get(role, 0) + 1
    if not rnd.exact:  # a fuzzy rule: a chain's decision scores every proposed row, a tree's each context reached
        if tree:
            out["div1"] += len(trials(rnd)) + (1 if cut_short(rnd) else 0)
        else:
            out["div"] += len(rnd.tokens) - 1


def census(steps: list[Step], method: str, config: dict | None = None) -> dict[str, Any]:
    """Units of engine work a recorded run did (`UNITS`, and tree compactions per role); adds up over runs (`add`)."""
    out: dict[str, Any] = {**{u: 0 for u in UNITS}, "keep": {}}
    tree, stage = shape_of(config) == "tree", tree_stage(method)
    for s in steps:
        out["step"] += 1
        out["feed"] += sum(s.n_forward.values()) if s.n_forward else len(s.fed.get("target", [])) or 1
        rounds = [("qualifier", r) for r in s.qualifier_rounds]
        rounds += [("target", s.target_round)] if s.target_round is not None else []
        for st, rnd in rounds:
            _round_units(rnd, tree and st == stage, out)
        if tree and rounds:
            out["expand"] += sum(s.fed.get(rounds[0][1].proposer, []))
    return out


def add(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Sum two censuses (pooling runs)."""
    for u in UNITS:
        into[u] = into.get(u, 0) + more.get(u, 0)
    keep = into.setdefault("keep", {})
    for role, n in (more.get("keep") or {}).items():
        keep[role] = keep.get(role, 0) + n
    return into


def price(units: dict[str, Any], profile: dict) -> float:
    """The census in ms on this profile."""
    ms = sum(float(units.get(u, 0)) * engine_ms(profile, u) for u in UNITS)
    return ms + sum(float(n) * engine_ms(profile, "keep", role) for role, n in (units.get("keep") or {}).items())
