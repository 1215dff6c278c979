"""The paper's throughput model (PyramidSD §3): predicted tokens/s from single-model speeds.

V_X is model X's single-model speed in tokens/s (one cached one-token forward per token);
β_XY is the acceptance rate of Y's tokens by X. Shown beside the measured speed.
"""
from __future__ import annotations

from .methods import method_spec
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


def lengths(cfg: dict, proposed: dict[str, int], rounds: dict[str, int]) -> dict[str, float | None]:
    """γ, ℓ_D and ℓ_Q for the formulas: the configured ones, or under conf_stop (where they are
    maxima) the measured mean proposal length per round of each stage."""
    out: dict[str, float | None] = {k: cfg.get(k) for k in ("gamma", "l_d", "l_q")}
    if cfg.get("conf_stop"):
        mean = {st: proposed[st] / rounds[st] for st in rounds if rounds[st] and st in proposed}
        if "target" in mean:
            out["gamma"] = out["l_q"] = mean["target"]
        if "qualifier" in mean:
            out["l_d"] = mean["qualifier"]
    return out


def predict_parts(method: str, lens: dict, acc: dict[str, float], speeds: dict[str, float]) -> float | None:
    """The paper's formulas for one method, from lengths (see `lengths`), acceptance per stage and
    single-model speeds (role → tok/s); AR's prediction is V_T itself."""
    m = method_spec(method)
    try:
        if m.proposer is None:
            return speeds["target"]
        if not m.pyramid:
            return v_sd(acc["target"], lens["gamma"], speeds["draft"], speeds["target"])
        inner = v_fsd(acc["qualifier"], lens["l_d"], speeds["draft"], speeds["qualifier"])
        return v_psd(acc["target"], lens["l_q"], inner, speeds["target"])
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def predict_plus_one(method: str, lens: dict, acc: dict[str, float], speeds: dict[str, float]) -> float | None:
    """The paper's model with β·ℓ + 1 tokens per round instead of β·(ℓ+1): with β = accepted ÷
    proposed, a round commits β·ℓ drafted tokens on average plus the verifier's own token, so
    this stays right when acceptance is low (the paper's form then predicts almost nothing)."""
    m = method_spec(method)
    try:
        if m.proposer is None:
            return speeds["target"]
        if not m.pyramid:
            g = lens["gamma"]
            return (acc["target"] * g + 1) / (g / speeds["draft"] + 1 / speeds["target"])
        ld, lq = lens["l_d"], lens["l_q"]
        inner = (acc["qualifier"] * ld + 1) / (ld / speeds["draft"] + 1 / speeds["qualifier"])
        return (acc["target"] * lq + 1) / (lq / inner + 1 / speeds["target"])
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def predict(result: RunResult, speeds: dict[str, float]) -> float | None:
    """Predicted tokens/s for a finished run (the paper's form, β·(ℓ+1) tokens per round)."""
    s = result.stats
    return predict_parts(result.method, lengths(result.config, s.proposed, s.rounds), s.acceptance, speeds)

