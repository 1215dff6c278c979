"""A cost profile's lookups, apart so that `costs` and `tree_costs` share them without importing each other:
{"ms": {role: {k: ms}}}, one cached forward of k new tokens per model (`costs.measure_profile`)."""
from __future__ import annotations


def cost_ms(profile: dict, role: str, k: int) -> float:
    """profile[role][k] in ms; beyond the profiled k, extrapolated along the last two points."""
    row = {int(a): float(b) for a, b in profile["ms"][role].items()}
    if k in row:
        return row[k]
    ks = sorted(row)
    if k < ks[0]:
        return row[ks[0]]
    if len(ks) < 2:
        return row[ks[-1]]
    a, b = ks[-2], ks[-1]
    return max(row[b], row[b] + (row[b] - row[a]) / (b - a) * (k - b))


def ar_speed(profile: dict) -> float:
    """AR's tok/s on this profile: one target step per token, and the engine's check and pick of it
    (`engine_ms.feed`, where the profile has the engine's prices): what every speed-up is stated against."""
    return 1000 / (cost_ms(profile, "target", 1) + float((profile.get("engine_ms") or {}).get("feed", 0.0)))
