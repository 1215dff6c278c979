"""The paper's throughput model (PyramidSD §3): tokens/s from single-model speeds, a teaching aid beside the profile."""

from __future__ import annotations

from ..core.methods import method_spec
from ..core.trace import RunResult
from .expected import shape_of


def stage_speed(beta: float, length: float, v_p: float, v_v: float, plus_one: bool = False) -> float:
    """V = β·(ℓ+1) / (ℓ/V_P + 1/V_V): one stage as one model; `plus_one`: β·ℓ + 1 tokens a round (right at low β)."""
    return (beta * length + 1 if plus_one else beta * (length + 1)) / (length / v_p + 1 / v_v)


def lengths(
    cfg: dict,
    proposed: dict[str, int],
    rounds: dict[str, int],
    accepted: dict[str, int] | None = None,
    method: str | None = None,
) -> dict:
    """γ, ℓ_D and ℓ_Q for the formulas: configured, or under conf_stop the measured mean per round. A tree run
    adds "levels" and "per_round" (tokens committed per round), which replace γ / ℓ_D and β·(ℓ+1) there."""
    out: dict = {k: cfg.get(k) for k in ("gamma", "l_d", "l_q")}
    if cfg.get("conf_stop"):
        mean = {st: proposed[st] / rounds[st] for st in rounds if rounds[st] and st in proposed}
        if "target" in mean:
            out["gamma"] = out["l_q"] = mean["target"]
        if "qualifier" in mean:
            out["l_d"] = mean["qualifier"]
    if method is not None and shape_of(cfg) == "tree":
        spec = method_spec(method)
        cap = cfg.get("l_d") if spec.pyramid else cfg.get("tree_nodes")
        out["levels"] = min(int(cfg.get("tree_depth") or 1), int(cap or cfg.get("tree_depth") or 1))
        out["per_round"] = {st: (accepted or {}).get(st, 0) / n + 1 for st, n in rounds.items() if n}
    return out


def predict_parts(
    method: str, lens: dict, acc: dict[str, float], speeds: dict[str, float], plus_one: bool = False
) -> float | None:
    """The paper's formulas from lengths, acceptance per stage and single-model speeds (role → tok/s); AR's: V_T."""
    m = method_spec(method)
    try:
        if m.proposer is None:
            return speeds["target"]
        first = "qualifier" if m.pyramid else "target"
        if "levels" in lens:
            inner = lens["per_round"][first] / (lens["levels"] / speeds["draft"] + 1 / speeds[first])
        else:
            inner = stage_speed(
                acc[first], lens["l_d" if m.pyramid else "gamma"], speeds["draft"], speeds[first], plus_one
            )
        return stage_speed(acc["target"], lens["l_q"], inner, speeds["target"], plus_one) if m.pyramid else inner
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def predict(result: RunResult, speeds: dict[str, float]) -> float | None:
    """Predicted tokens/s for a finished run (the paper's form, β·(ℓ+1) tokens per round)."""
    s = result.stats
    lens = lengths(result.config, s.proposed, s.rounds, s.accepted, result.method)
    return predict_parts(result.method, lens, s.acceptance, speeds)
