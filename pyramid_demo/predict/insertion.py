"""Does each level earn its place (Polybasic's rule)? The qualifier when the pyramid beats the best SD without it;
the draft when the pyramid beats the qualifier drafting alone. Both on measured acceptance and the cost profile."""

from __future__ import annotations

from typing import Any

from .expected import GAMMAS, ar_speed, cost_ms, pyramid_speed, round_speed

BLOCKS = [(ld, lq) for lq in range(1, 17) for ld in range(1, lq + 1)]


def insertion(profile: dict, alpha_td: float | None, alpha_qd: float | None, alpha_tq: float | None) -> dict[str, Any]:
    """From the acceptances of SD and the pyramid's two stages: costs (× a target step), the best predicted tok/s
    without the qualifier, with it, and with it alone as SD's proposer; `earns` and `draft_earns` (None: unknown)."""
    out: dict[str, Any] = {"alpha_draft": alpha_td, "alpha_qualifier": alpha_tq, "alpha_stage1": alpha_qd}
    try:
        step = cost_ms(profile, "target", 1)
        out["cost_draft"] = cost_ms(profile, "draft", 1) / step
        out["cost_qualifier"] = cost_ms(profile, "qualifier", 1) / step
        out["ar_tokens_per_s"] = ar_speed(profile)
        if alpha_td is not None:
            sd = {g: round_speed(profile, g, (alpha_td,))["tokens_per_s"] for g in GAMMAS}
            g = max(sd, key=lambda g: sd[g])
            out["without"] = {"tokens_per_s": sd[g], "gamma": g}
        if alpha_qd is not None and alpha_tq is not None:
            ld, lq = max(BLOCKS, key=lambda b: pyramid_speed(profile, b[0], b[1], alpha_qd, alpha_tq))
            out["with"] = {"tokens_per_s": pyramid_speed(profile, ld, lq, alpha_qd, alpha_tq), "l_d": ld, "l_q": lq}
            solo = {g: round_speed(profile, g, (alpha_tq,), proposer="qualifier")["tokens_per_s"] for g in GAMMAS}
            g = max(solo, key=lambda g: solo[g])
            out["qualifier_alone"] = {"tokens_per_s": solo[g], "gamma": g}
    except KeyError:  # a role the profile lacks (a family without a qualifier row)
        return out
    w, wo, q = out.get("with"), out.get("without"), out.get("qualifier_alone")
    out["earns"] = None if not (w and wo) else w["tokens_per_s"] > wo["tokens_per_s"]
    out["draft_earns"] = None if not (w and q) else w["tokens_per_s"] > q["tokens_per_s"]
    return out


def markdown(ins: dict[str, Any]) -> str:
    """One paragraph for the Statistics tab and the bench report."""
    if ins.get("earns") is None:
        return (
            "**Does the qualifier earn its place?** Race SD and a pyramid (PSD_A or PSD_F) together to "
            "measure it: it needs both acceptances."
        )
    w, wo = ins["with"], ins["without"]
    verdict = (
        "**yes**: with it the pyramid is predicted faster than the best SD"
        if ins["earns"]
        else "**no**: the best SD without it is predicted faster than any pyramid with it"
    )
    return (
        f"**Does the qualifier earn its place?** {verdict}. The target accepts the draft's tokens at "
        f"α {ins['alpha_draft']:.2f} and the qualified block at α {ins['alpha_qualifier']:.2f} (the qualifier "
        f"accepts the draft at α {ins['alpha_stage1']:.2f}); a step costs {ins['cost_draft']:.2f}× (draft) and "
        f"{ins['cost_qualifier']:.2f}× (qualifier) the target's. Predicted on an idle machine: SD "
        f"{wo['tokens_per_s']:.1f} tok/s at γ {wo['gamma']} without it, the pyramid {w['tokens_per_s']:.1f} tok/s "
        f"at ℓ_D {w['l_d']}, ℓ_Q {w['l_q']} with it (AR {ins['ar_tokens_per_s']:.1f}).{_draft_line(ins)}"
    )


def _draft_line(ins: dict[str, Any]) -> str:
    """The same test one level down: the pyramid against the qualifier drafting for the target alone."""
    if ins.get("draft_earns") is None:
        return ""
    q, w = ins["qualifier_alone"], ins["with"]
    verdict = (
        "**yes**: the pyramid is predicted faster than the qualifier drafting alone"
        if ins["draft_earns"]
        else "**no**: the qualifier drafting alone for the target is predicted faster"
    )
    return (
        f"\n\n**Does the draft earn its level?** {verdict}: SD with the qualifier as its draft "
        f"{q['tokens_per_s']:.1f} tok/s at γ {q['gamma']} (α {ins['alpha_qualifier']:.2f}), the pyramid "
        f"{w['tokens_per_s']:.1f} tok/s with the draft under it (its tokens pass the qualifier at α "
        f"{ins['alpha_stage1']:.2f})."
    )
