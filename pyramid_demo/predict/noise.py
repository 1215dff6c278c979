"""Is one method faster than another, or within the timing noise (the spread of same-size forwards of one model)?"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.trace import Step
from .costs import step_forwards

MIN_GROUP = 5  # same-k forwards needed before a group's spread counts


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of xs by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def relative_spread(times: list[float]) -> float | None:
    """Interquartile range ÷ median of repeated timings of the same work (None for fewer than 2)."""
    if len(times) < 2:
        return None
    med = quantile(times, 0.5)
    return (quantile(times, 0.75) - quantile(times, 0.25)) / med if med > 0 else None


def same_k_forwards(steps: Iterable[Step]) -> dict[tuple[str, int], list[float]]:
    """Seconds of single forwards by (role, new tokens k), from steps where that role made exactly one forward."""
    out: dict[tuple[str, int], list[float]] = {}
    for s in steps:
        for role, ks in step_forwards(s).items():
            t = s.time_s.get(role)
            if len(ks) == 1 and t is not None and t > 0:
                out.setdefault((role, ks[0]), []).append(t)
    return out


def timing_noise(groups: dict[tuple[str, int], list[float]]) -> float | None:
    """The run's relative timing noise: groups' spreads weighted by size, over groups of ≥ MIN_GROUP (else None)."""
    total = n = 0.0
    for times in groups.values():
        spread = relative_spread(times) if len(times) >= MIN_GROUP else None
        if spread is not None:
            total += spread * len(times)
            n += len(times)
    return total / n if n else None


def compare(a: float, b: float, noise: float) -> int:
    """1 when speed a beats b by more than the noise (a > b·(1 + noise)), −1 when b beats a so, 0 for a tie."""
    return 1 if a > b * (1 + noise) else -1 if b > a * (1 + noise) else 0


def leaders(speeds: dict[str, float], noise: float) -> list[str]:
    """The fastest method and every other within noise of it, fastest first (several: a tie within noise)."""
    if not speeds:
        return []
    best = max(speeds.values())
    return sorted((m for m, v in speeds.items() if compare(best, v, noise) == 0), key=lambda m: -speeds[m])
