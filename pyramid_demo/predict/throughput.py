"""The paper's throughput model (PyramidSD §3): predicted tokens/s from single-model speeds.

V_X is model X's single-model speed in tokens/s (one cached one-token forward per token);
β_XY is the acceptance rate of Y's tokens by X. Shown beside the measured speed.

Over a tree of candidates (`shape.shape_of` says "tree") the formulas keep their form, with what a tree
round really is: the proposer pays one forward per level (ℓ = its levels, not γ nor the node count), and
β·(ℓ+1), the tokens a round commits, is the measured accepted path plus the verifier's own token. A
pyramid's stage 1 is then V_FSD(Q,D) = E_Q / (levels/V_D + 1/V_Q); its stage 2 stays a chain of ℓ_Q.
"""
from __future__ import annotations

from ..core.methods import method_spec
from ..core.trace import RunResult
from .shape import shape_of


def v_sd(beta_td: float, l_d: int, v_d: float, v_t: float) -> float:
    """V_SD = β_TD·(ℓ_D+1) / (ℓ_D/V_D + 1/V_T)."""
    return beta_td * (l_d + 1) / (l_d / v_d + 1 / v_t)


def v_fsd(beta_qd: float, l_d: int, v_d: float, v_q: float) -> float:
    """V_FSD(Q,D) = β_QD·(ℓ_D+1) / (ℓ_D/V_D + 1/V_Q): the draft→qualifier stage as one model."""
    return beta_qd * (l_d + 1) / (l_d / v_d + 1 / v_q)


def v_psd(beta_tq: float, l_q: int, v_fsd_qd: float, v_t: float) -> float:
    """V_PSD = β_TQ·(ℓ_Q+1) / (ℓ_Q/V_FSD(Q,D) + 1/V_T)."""
    return beta_tq * (l_q + 1) / (l_q / v_fsd_qd + 1 / v_t)


def lengths(cfg: dict, proposed: dict[str, int], rounds: dict[str, int], accepted: dict[str, int] | None = None,
            method: str | None = None) -> dict:
    """γ, ℓ_D and ℓ_Q for the formulas: the configured ones, or under conf_stop (where they are
    maxima) the measured mean proposal length per round of each stage. A tree run (`method` given) adds
    "levels" (proposer forwards per tree round) and "per_round" (tokens committed per round of each stage:
    accepted ÷ rounds + the verifier's own), which replace γ / ℓ_D and β·(ℓ+1) there."""
    out: dict = {k: cfg.get(k) for k in ("gamma", "l_d", "l_q")}
    if cfg.get("conf_stop"):
        mean = {st: proposed[st] / rounds[st] for st in rounds if rounds[st] and st in proposed}
        if "target" in mean:
            out["gamma"] = out["l_q"] = mean["target"]
        if "qualifier" in mean:
            out["l_d"] = mean["qualifier"]
    if method is not None and shape_of(method, cfg) == "tree":
        spec = method_spec(method)
        cap = cfg.get("l_d") if spec.pyramid else cfg.get("tree_nodes")
        out["levels"] = min(int(cfg.get("tree_depth") or 1), int(cap or cfg.get("tree_depth") or 1))
        out["per_round"] = {st: (accepted or {}).get(st, 0) / n + 1 for st, n in rounds.items() if n}
    return out


def _tree_parts(method: str, lens: dict, acc: dict[str, float], speeds: dict[str, float], paper: bool) -> float:
    """A tree run's formulas: stage 1 (the tree) commits its measured tokens per round over `levels` proposer
    forwards and one verifier pass; a pyramid's stage 2 is the paper's chain of ℓ_Q (β·(ℓ+1), or β·ℓ + 1)."""
    m, lv, per = method_spec(method), lens["levels"], lens["per_round"]
    if not m.pyramid:
        return per["target"] / (lv / speeds["draft"] + 1 / speeds["target"])
    inner = per["qualifier"] / (lv / speeds["draft"] + 1 / speeds["qualifier"])
    lq = lens["l_q"]
    if paper:
        return v_psd(acc["target"], lq, inner, speeds["target"])
    return (acc["target"] * lq + 1) / (lq / inner + 1 / speeds["target"])


def predict_parts(method: str, lens: dict, acc: dict[str, float], speeds: dict[str, float]) -> float | None:
    """The paper's formulas for one method, from lengths (see `lengths`), acceptance per stage and
    single-model speeds (role → tok/s); AR's prediction is V_T itself."""
    m = method_spec(method)
    try:
        if m.proposer is None:
            return speeds["target"]
        if "levels" in lens:
            return _tree_parts(method, lens, acc, speeds, paper=True)
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
        if "levels" in lens:
            return _tree_parts(method, lens, acc, speeds, paper=False)
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
    lens = lengths(result.config, s.proposed, s.rounds, s.accepted, result.method)
    return predict_parts(result.method, lens, s.acceptance, speeds)

