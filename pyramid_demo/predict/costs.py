"""A recorded run read against the cost profile: its forwards and the engine's own work priced, why a method wins
or loses there (the break-even α), and whether a measured gap is beyond the timing noise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.methods import TREE_BUDGET, DecodeConfig, method_spec, stage_rule
from ..core.rules import RANK_PRIOR
from ..core.trace import StageRound, Step
from . import expected
from .expected import ar_speed, best_tree, cost_ms, cost_tree_ms, engine_ms, shape_of
from .walk_stats import alpha, cut_short, ranks, trials


# ---------------------------------------------------------------- the profile
def forward_counts(steps: list[Step]) -> dict[str, dict[int, int]]:
    """How many forwards of k new tokens each role made (`Step.fed`): {role: {k: n}} (adds up over runs)."""
    out: dict[str, dict[int, int]] = {}
    for s in steps:
        for role, ks in s.fed.items():
            for k in ks:
                out.setdefault(role, {})[k] = out.get(role, {}).get(k, 0) + 1
    return out


def tree_forward_counts(steps: list[Step], method: str | None, config: dict | None = None) -> dict[str, dict[int, int]]:
    """Of `forward_counts`, those that fed tree rows: the tree stage's verifier passes and the proposer's levels."""
    out: dict[str, dict[int, int]] = {}
    if not method or shape_of(config) != "tree":
        return out
    stage = tree_stage(method)
    for s in steps:
        rounds = [r for r in s.rounds if r.stage == stage]
        if not rounds:
            continue
        verifier, proposer = rounds[0].verifier, rounds[0].proposer
        for role, ks in ((verifier, s.fed.get(verifier, [])), (proposer, s.fed.get(proposer, [])[1:])):
            for k in ks:
                out.setdefault(role, {})[k] = out.get(role, {}).get(k, 0) + 1
    return out


def predict_counts(counts: dict[str, dict], profile: dict, trees: dict[str, dict] | None = None) -> dict[str, float]:
    """Predicted forward seconds per role: Σ n × profile[role][k] (roles the profile lacks are left out); the
    forwards in `trees` (a part of `counts`) at the profile's tree forward of k rows instead."""
    out = {}
    for role, by_k in counts.items():
        if role not in profile["ms"]:
            continue
        tree = {int(k): int(n) for k, n in ((trees or {}).get(role) or {}).items()}
        ms = sum((int(n) - tree.get(int(k), 0)) * cost_ms(profile, role, int(k)) for k, n in by_k.items())
        out[role] = (ms + sum(n * cost_tree_ms(profile, role, k) for k, n in tree.items())) / 1000
    return out


def predict_run(
    steps: list[Step], profile: dict, method: str | None = None, config: dict | None = None
) -> dict[str, Any]:
    """Predicted seconds (and tok/s) of a recorded run: its forwards on the profile, plus the engine's priced work."""
    per_role = predict_counts(forward_counts(steps), profile, tree_forward_counts(steps, method, config))
    n = sum(len(s.new_tokens) for s in steps)
    engine = price(census(steps, method, config), profile) / 1000 if method else 0.0
    total = sum(per_role.values()) + engine
    return {
        "time_s": round(total, 6),
        "per_role_s": {k: round(v, 6) for k, v in per_role.items()},
        "engine_s": round(engine, 6),
        "tokens_per_s": round(n / total, 3) if total > 0 else None,
    }


def measured_by_k(steps: list[Step]) -> dict[str, dict[int, list[float]]]:
    """Per-forward ms measured in a run by role and k, where a step pins them down (all its forwards of one k)."""
    out: dict[str, dict[int, list[float]]] = {}
    for s in steps:
        for role, ks in s.fed.items():
            t = s.time_s.get(role)
            if t is None or not ks or len(set(ks)) != 1:
                continue
            out.setdefault(role, {}).setdefault(ks[0], []).append(1000 * t / len(ks))
    return out


# ---------------------------------------------------------------- the engine's own work (`census`, priced by `price`)
UNITS = ("step", "feed", "round", "div", "div1", "expand")


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
        for rnd in s.rounds:
            _round_units(rnd, tree and rnd.stage == stage, out)
        if tree and s.rounds:
            out["expand"] += sum(s.fed.get(s.rounds[0].proposer, []))
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


# ---------------------------------------------------------------- expected speed and break-even
def solve_alpha(speed: Callable[[float], float], goal: float) -> float | None:
    """The α in [0, 1] where speed(α) = goal (rising with α); 0.0 if it beats goal at α = 0, None if not even at 1."""
    if speed(0.0) >= goal:
        return 0.0
    if speed(1.0) < goal:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speed(mid) < goal else (lo, mid)
    return round((lo + hi) / 2, 4)


def _length(c: dict | None, default: int) -> int:
    return max(1, round(c["proposed"] / c["rounds"])) if c and c["rounds"] else default


def model_from_counts(method: str, counts: dict, config: dict, profile: dict) -> dict[str, Any]:
    """Lengths, measured α per stage, the expected tok/s and speed-up over AR at that α on this profile, and
    the break-even α at which a method equals AR (None for AR). Trees are priced on acceptance by rank."""
    spec = method_spec(method)
    ar = ar_speed(profile)
    out: dict[str, Any] = {"ar_tokens_per_s": round(ar, 3)}
    if spec.proposer is None:
        return out
    tree = shape_of(config) == "tree"
    fuzzy_t = stage_rule(spec.stages[-1], str(config.get("stage2", "fuzzy"))) == "fuzzy"
    out["alpha"] = a_t = alpha(counts.get("target"))
    try:
        if tree and not spec.pyramid:
            return _tree_model(out, counts.get("target") or {}, config, profile, fuzzy_t)
        if not spec.pyramid:
            g = _length(counts.get("target"), config.get("gamma", 4))
            f = lambda a: expected.round_speed(profile, g, (a,), fuzzy_t)["tokens_per_s"]  # noqa: E731
            out["lengths"] = {"gamma": g}
        else:
            f = _pyramid_model(out, method, counts, config, profile, tree, fuzzy_t)
        out["break_even_alpha"] = solve_alpha(f, ar)
        out["expected_tokens_per_s"] = round(f(a_t), 3) if a_t is not None else None
        out["ceiling_tokens_per_s"] = round(f(1.0), 3)
        out["expected_speedup_vs_ar"] = round(f(a_t) / ar, 4) if a_t is not None else None
    except KeyError:  # a role the profile lacks
        pass
    return out


def _pyramid_model(
    out: dict[str, Any], method: str, counts: dict, config: dict, profile: dict, tree: bool, fuzzy_t: bool
) -> Callable[[float], float]:
    """The pyramid's expected tok/s of α_T: stage 1 a chain at α_Q, or the expected tree (ranks, ≤ ℓ_D deep)."""
    fuzzy_q = method_spec(method).stage1 == "fuzzy"
    lq = _length(counts.get("target"), config.get("l_q", 8))
    q = counts.get("qualifier")
    out["alpha_qualifier"] = a_q = alpha(q)
    if not tree:
        ld = _length(q, config.get("l_d", 4))
        out["lengths"] = {"l_d": ld, "l_q": lq}
        return lambda a: expected.pyramid_speed(profile, ld, lq, a_q if a_q is not None else 0.0, a, fuzzy_q, fuzzy_t)
    ld = int(config.get("l_d", 4))
    budget = _budget(config)
    by_rank = tuple(ranks(q) or ([a_q] if a_q is not None else list(RANK_PRIOR)))
    out["ranks_qualifier"] = list(by_rank)
    out["lengths"] = {"l_d": ld, "l_q": lq, **budget}
    shape = (*budget.values(), by_rank)
    return lambda a: expected.pyramid_speed(profile, ld, lq, 0.0, a, fuzzy_q, fuzzy_t, shape)


def _budget(config: dict) -> dict[str, int]:
    """The run's tree budget (nodes, depth, k), in that order; `DecodeConfig`'s defaults where it has none."""
    return {k: int(config.get(k, getattr(DecodeConfig, k))) for k in TREE_BUDGET}


def _tree_model(out: dict[str, Any], c: dict, config: dict, profile: dict, fuzzy: bool) -> dict[str, Any]:
    """A tree method's model: acceptance by rank, the expected speed at this budget, the best budget (`best_tree`)."""
    by_rank = out["ranks"] = ranks(c)
    budget = out["lengths"] = _budget(config)
    if by_rank:
        got = expected.round_speed(profile, budget["tree_depth"], by_rank, fuzzy, tree=tuple(budget.values()))
        out["expected_tokens_per_s"] = round(got["tokens_per_s"], 3)
        out["expected_tokens_per_pass"] = round(got["tokens_per_pass"], 3)
        out["expected_speedup_vs_ar"] = round(got["tokens_per_s"] / ar_speed(profile), 4)
    out["best_tree"] = best_tree(profile, by_rank, fuzzy)
    return out


def verdict(method: str, m: dict, measured: tuple[float, float] | None = None) -> str:
    """Why the method wins or loses on the profile; `measured` (its and AR's tok/s) adds what the run did."""
    seen = f"; measured {measured[0]:.1f} vs AR {measured[1]:.1f} tok/s" if measured and all(measured) else ""
    if "best_tree" in m:
        b, exp = m["best_tree"], m.get("expected_tokens_per_s")
        ranks = ", ".join(f"{r:.2f}" for r in (m.get("ranks") or [])[:4]) or "not measured yet"
        return (
            f"a tree spends the draft's top few (acceptance by rank {ranks})"
            + (f": expected {exp:.1f} vs AR {m['ar_tokens_per_s']:.1f} tok/s at this budget" if exp else "")
            + f"; predicted best here {b['tree_nodes']} nodes, depth {b['tree_depth']}, k {b['tree_k']} "
            f"({b['tokens_per_pass']:.2f} tokens per pass, {b['tokens_per_s']:.1f} tok/s){seen}"
        )
    if "break_even_alpha" not in m:
        return "the baseline: one target forward per token" if method == "ar" else "no profile for its models"
    be, a = m["break_even_alpha"], m.get("alpha")
    stage = "the target's acceptance α_T" if "alpha_qualifier" in m else "acceptance α"
    if be is None:
        return (
            f"cannot beat AR on this machine even if every token were accepted (at best "
            f"{m['ceiling_tokens_per_s']:.1f} vs {m['ar_tokens_per_s']:.1f} tok/s): its forwards cost too much"
        )
    if a is None:
        return f"pays once {stage} exceeds {be:.2f}"
    exp = m.get("expected_tokens_per_s")
    vs = f" (expected {exp:.1f} vs AR {m['ar_tokens_per_s']:.1f} tok/s on this profile)" if exp else ""
    wins = a >= be
    line = (
        f"{'wins' if wins else 'loses'}: {stage} {a:.2f} is {'above' if wins else 'below'} the break-even "
        f"{be:.2f}{vs}{seen}"
    )
    if seen and measured and (measured[0] >= measured[1]) != wins:
        line += (
            " — not what the profile expects: these forwards cost more in the run than in the "
            "profile, or its proposals were shorter/longer than the formula's γ"
        )
    return line
