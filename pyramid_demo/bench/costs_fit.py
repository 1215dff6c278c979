"""The engine's per-unit prices fitted on a bench's runs (NNLS), each variant priced from the others only."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..clock import ratio
from ..predict import costs
from ..predict.expected import ar_ms, engine_ms

FEATURES = (*costs.UNITS, "keep")


def features(units: dict) -> list[float]:
    """A census as one row of counts (compactions summed over roles)."""
    return [float(units.get(u, 0)) for u in costs.UNITS] + [float(sum((units.get("keep") or {}).values()))]


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """min ‖a x − b‖ over x ≥ 0 (Lawson–Hanson active set): a [n, m], b [n] → x [m]."""
    m = a.shape[1]
    x = np.zeros(m)
    passive = np.zeros(m, dtype=bool)
    for _ in range(iters):
        w = a.T @ (b - a @ x)  # [m]: the gradient of the residual
        if passive.all() or (w[~passive] <= 1e-12).all():
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(m)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg] + 1e-300))
            x = x + step * (z - x)
            passive &= x > 1e-12
    return x


def _fit(rows: list[dict], prices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`prices` refitted on the rows' engine seconds for every unit they counted (`seen`, also returned)."""
    a = np.array([features(r["cost_record"]["engine"]) for r in rows])  # [n, m]
    seen = a.sum(0) > 0
    if seen.any():
        prices[seen] = nnls(a[:, seen], np.array([float(r["engine_overhead_s"]) for r in rows]))
    return prices, seen


def _census_rows(rows: list[dict]) -> list[dict]:
    """The engine rows with a census of the engine's work and its measured time outside the forwards."""
    return [
        r
        for r in rows
        if r.get("kind") == "engine"
        and (r.get("cost_record") or {}).get("engine")
        and r.get("engine_overhead_s") is not None
    ]


def loo_engine_s(rows: list[dict], profile: dict) -> dict[str, list[float]]:
    """Per variant, its rows' engine seconds priced from the other variants' rows (in row order)."""
    eng = _census_rows(rows)
    micro = [engine_ms(profile, u) / 1000 for u in costs.UNITS] + [
        float(np.mean(list(((profile.get("engine_ms") or {}).get("keep") or {"": 0.0}).values()))) / 1000
    ]
    out: dict[str, list[float]] = {}
    for label in dict.fromkeys(r["variant"] for r in eng):
        others = [r for r in eng if r["variant"] != label]
        prices = _fit(others, np.array(micro))[0] if others else np.array(micro)
        out[label] = [float(np.dot(features(r["cost_record"]["engine"]), prices)) for r in eng if r["variant"] == label]
    return out


def _profiled(row: dict, profile: dict) -> dict[str, float]:
    """A row's forwards per role on the profile (s)."""
    rec = row["cost_record"]
    return costs.predict_counts(rec["forwards"], profile, rec.get("tree_forwards"))


def loo_busy(rows: list[dict], profile: dict) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per variant, each role's measured ÷ profiled forward time over the other variants' rows (its own
    where no other variant ran the role); and the same pooled over every row, for display."""
    num: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    den: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        for r, t in _profiled(row, profile).items():
            if got := row.get(f"fwd_time_{r}_s"):  # as measured in the run (s)
                num[row["variant"]][r] += got
                den[row["variant"]][r] += t
    roles = sorted({r for d in den.values() for r in d})  # one order every run
    tot_n = {r: sum(d.get(r, 0.0) for d in num.values()) for r in roles}
    tot_d = {r: sum(d.get(r, 0.0) for d in den.values()) for r in roles}
    pooled = {r: tot_n[r] / tot_d[r] for r in roles if tot_d[r] > 0}
    if sum(tot_d.values()) > 0:
        pooled["all"] = sum(tot_n.values()) / sum(tot_d.values())

    def others(label: str, r: str) -> float:  # the other variants' ratio, else the pooled one
        d = tot_d[r] - den[label][r]
        return (tot_n[r] - num[label][r]) / d if d > 1e-12 else pooled.get(r, 1.0)

    return {label: {r: others(label, r) for r in roles} for label in dict.fromkeys(r["variant"] for r in rows)}, pooled


def predict_rows(rows: list[dict], profile: dict) -> dict[str, float]:
    """Sets `predicted_profile_s` and `predicted_s` (forwards × the other variants' busy factor, plus engine time
    priced from their runs) on every engine row with a cost record, and both speed-ups over AR; the busy factors."""
    eng_rows = [r for r in rows if r.get("kind") == "engine" and r.get("cost_record")]
    busy, pooled = loo_busy(eng_rows, profile)
    fitted = {label: iter(secs) for label, secs in loo_engine_s(eng_rows, profile).items()}  # in row order
    for row in eng_rows:
        fwd = _profiled(row, profile)
        micro = costs.price(row["cost_record"].get("engine") or {}, profile) / 1000
        row["predicted_profile_s"] = sum(fwd.values()) + micro
        eng = next(fitted.get(row["variant"], iter(())), micro)
        b = busy[row["variant"]]
        row["predicted_s"] = sum(t * b.get(r, pooled.get("all", 1.0)) for r, t in fwd.items()) + eng
    ar = {(r["repeat"], r["prompt_index"]): r for r in eng_rows if r["method"] == "ar"}
    step = ar_ms(profile) / 1000
    for row in eng_rows:
        n, ref = row["n_new_tokens"], ar.get((row.get("repeat"), row.get("prompt_index")))
        per_ar = (
            ref["predicted_s"] / ref["n_new_tokens"]
            if ref and ref["n_new_tokens"]
            else step * busy[row["variant"]].get("target", pooled.get("all", 1.0))
        )
        row["predicted_speedup_vs_ar"] = ratio(per_ar * n, row["predicted_s"])
        row["predicted_profile_speedup_vs_ar"] = ratio(step * n, row["predicted_profile_s"])
        row["predicted_profile_tokens_per_s"] = ratio(n, row["predicted_profile_s"])
    return pooled


def fitted_prices(rows: list[dict]) -> dict[str, float]:
    """The engine's per-unit prices in ms fitted on every engine row, for display beside the timed ones."""
    eng = _census_rows(rows)
    if not eng:
        return {}
    x, seen = _fit(eng, np.zeros(len(FEATURES)))
    return {f: round(1000 * float(v), 5) for f, v, s in zip(FEATURES, x, seen) if s}
