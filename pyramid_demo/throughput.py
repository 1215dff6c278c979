"""The paper's throughput model (PyramidSD §3): predicted tokens/s from single-model speeds.

V_X is model X's single-model speed in tokens/s (one cached one-token forward per token);
β_XY is the acceptance rate of Y's tokens by X. Shown beside the measured speed.
"""
from __future__ import annotations

from .trace import RunResult


def v_sd(beta_td: float, l_d: int, v_d: float, v_t: float) -> float:
    """V_SD = β_TD·(ℓ_D+1) / (ℓ_D/V_D + 1/V_T)."""
    return beta_td * (l_d + 1) / (l_d / v_d + 1 / v_t)


def v_fsd(beta_qd: float, l_d: int, v_d: float, v_q: float) -> float:
    """V_FSD(Q,D) = β_QD·(ℓ_D+1) / (ℓ_D/V_D + 1/V_Q): the draft→qualifier stage as one model."""
    return beta_qd * (l_d + 1) / (l_d / v_d + 1 / v_q)


def v_psd(beta_tq: float, l_q: int, v_fsd_qd: float, v_t: float) -> float:
    """V_PSD = β_TQ·(ℓ_Q+1) / (ℓ_Q/V_FSD(Q,D) + 1/V_T)."""
    return beta_tq * (l_q + 1) / (l_q / v_fsd_qd + 1 / v_t)


def lengths(cfg: dict, proposed: dict[str, int], rounds: dict[str, int]) -> dict[str, float]:
    """γ, ℓ_D and ℓ_Q for the formulas: the configured ones, or under conf_stop (where they are
    maxima) the measured mean proposal length per round of each stage."""
    out = {k: cfg.get(k) for k in ("gamma", "l_d", "l_q")}
    if cfg.get("conf_stop"):
        mean = {st: proposed[st] / rounds[st] for st in rounds if rounds[st] and st in proposed}
        if "target" in mean:
            out["gamma"] = out["l_q"] = mean["target"]
        if "qualifier" in mean:
            out["l_d"] = mean["qualifier"]
    return out


def predict(result: RunResult, speeds: dict[str, float]) -> float | None:
    """Predicted tokens/s for a finished run, from its acceptance rates and `speeds` (role → tok/s).

    The paper's formulas use β·(ℓ+1) as tokens per round; AR's prediction is V_T itself.
    """
    acc = result.stats.acceptance
    cfg = lengths(result.config, result.stats.proposed, getattr(result.stats, "rounds", {}))
    try:
        if result.method == "ar":
            return speeds["target"]
        if result.method in ("sd", "fsd"):
            return v_sd(acc["target"], cfg["gamma"], speeds["draft"], speeds["target"])
        inner = v_fsd(acc["qualifier"], cfg["l_d"], speeds["draft"], speeds["qualifier"])
        return v_psd(acc["target"], cfg["l_q"], inner, speeds["target"])
    except (KeyError, ZeroDivisionError):
        return None


def single_model_speed(result: RunResult, role: str) -> float | None:
    """tokens/s of one model from a run: forwards per second of that role's decode passes."""
    s = result.stats
    n, t = s.forward_passes.get(role, 0), s.forward_time_s.get(role, 0.0)
    return n / t if n and t > 0 else None
