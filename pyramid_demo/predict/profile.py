"""A cost profile's lookups: {"ms": {role: {k: ms}}} and, where measured, {"tree_ms": {role: {n: ms}}}."""

from __future__ import annotations

from .engine_costs import engine_ms


def _lookup(row_in: dict, k: int) -> float:
    """row[k]; beyond the profiled k, extrapolated along the last two points (below the first: the first)."""
    row = {int(a): float(b) for a, b in row_in.items()}
    if k in row:
        return row[k]
    ks = sorted(row)
    if k < ks[0]:
        return row[ks[0]]
    if len(ks) < 2:
        return row[ks[-1]]
    lo = max(a for a in ks if a < k)
    hi = min((a for a in ks if a > k), default=None)
    if hi is not None:  # between two profiled points: on the line through them
        return row[lo] + (row[hi] - row[lo]) * (k - lo) / (hi - lo)
    a, b = ks[-2], ks[-1]
    return max(row[b], row[b] + (row[b] - row[a]) / (b - a) * (k - b))


def cost_ms(profile: dict, role: str, k: int) -> float:
    """profile[role][k] in ms: a chain forward of k new tokens."""
    return _lookup(profile["ms"][role], k)


def cost_tree_ms(profile: dict, role: str, n: int) -> float:
    """A tree forward of n rows in ms: the profile's tree row where it has one, else the chain forward's."""
    row = (profile.get("tree_ms") or {}).get(role)
    return _lookup(row, n) if row else cost_ms(profile, role, n)


def ar_ms(profile: dict) -> float:
    """AR's time per token (what speed-ups are stated against): a target step, the engine's check, pick and cut."""
    return cost_ms(profile, "target", 1) + engine_ms(profile, "feed") + engine_ms(profile, "step")


def ar_speed(profile: dict) -> float:
    return 1000 / ar_ms(profile)
