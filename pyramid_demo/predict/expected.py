"""A cost profile ({"ms": {role: {k: ms}}}, where measured {"tree_ms": {role: {n: ms}}}, the engine's prices) and
the speed every method and shape is expected to reach on it from acceptance alone (a chain: a one-child tree):
the best tree budget, and shape "auto" settled before a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np

from ..core.methods import DecodeConfig, method_spec
from ..core.rules import RANK_PRIOR, depths, expected_tree
from ..core.run import shape_to_run


# ---------------------------------------------------------------- the profile
def engine_ms(profile: dict, unit: str, role: str | None = None) -> float:
    """One unit's price in ms (0.0 where the profile has none): `keep` is per role."""
    e = profile.get("engine_ms") or {}
    return float((e.get("keep") or {}).get(role or "", 0.0)) if unit == "keep" else float(e.get(unit, 0.0))


def priced(profile: dict) -> bool:
    """Whether the profile carries the engine's prices (else predictions price forwards only)."""
    return bool(profile.get("engine_ms"))


def _lookup(row_in: dict, k: int) -> float:
    """row[k]; between profiled k on the line through them (below the first: the first), beyond the last along the
    last two points."""
    row = {int(a): float(b) for a, b in row_in.items()}
    ks = sorted(row)
    if k <= ks[-1] or len(ks) < 2:
        return float(np.interp(k, ks, [row[a] for a in ks]))
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


# ---------------------------------------------------------------- what a round commits
def tree_reach(parents: list[int], ranks: list[int], a: list[float] | tuple[float, ...]) -> list[float]:
    """P(the accepted path reaches depth d), d = 1 … the tree's depth (its nodes at d are exclusive): the sum of its
    nodes' P(on the accepted path), each the product of a_rank along its path."""
    d, p = depths(parents), []
    out = [0.0] * (max(d) if d else 0)
    for depth, par, r in zip(d, parents, ranks):
        p.append((a[r] if r < len(a) else 0.0) * (p[par] if par >= 0 else 1.0))
        out[depth - 1] += p[-1]
    return out


def commits(reach: list[float]) -> list[float]:
    """P(exactly j drafted tokens accepted), j = 0 … len(reach), from the reach probabilities."""
    r = [1.0, *reach, 0.0]
    return [max(0.0, r[j] - r[j + 1]) for j in range(len(reach) + 1)]


# ---------------------------------------------------------------- what a round costs
def chain_round_ms(profile: dict, proposer: str, verifier: str, n: int, fuzzy: bool) -> float:
    """n one-token proposer steps, one (n+1)-row verifier pass, their feeds, the decision, the cut (n divergences)."""
    fwd = n * cost_ms(profile, proposer, 1) + cost_ms(profile, verifier, n + 1)
    eng = (n + 1) * engine_ms(profile, "feed") + engine_ms(profile, "round") + engine_ms(profile, "step")
    return fwd + eng + (n * engine_ms(profile, "div") if fuzzy else 0.0)


def tree_round_ms(
    profile: dict, proposer: str, verifier: str, nodes: int, levels: int, k: int, fuzzy: bool, contexts: float
) -> float:
    """The proposer's root step and one k-row forward per further level, the (nodes+1)-row pass, the rows it
    expands, both caches' compaction, the decision, and one divergence per context reached (`contexts`)."""
    fwd = (
        cost_ms(profile, proposer, 1)
        + (levels - 1) * cost_tree_ms(profile, proposer, k)
        + cost_tree_ms(profile, verifier, nodes + 1)
    )
    eng = (
        2 * engine_ms(profile, "feed")
        + engine_ms(profile, "round")
        + engine_ms(profile, "step")
        + (1 + (levels - 1) * k) * engine_ms(profile, "expand")
        + engine_ms(profile, "keep", proposer)
        + engine_ms(profile, "keep", verifier)
    )
    return fwd + eng + (contexts * engine_ms(profile, "div1") if fuzzy else 0.0)


# ---------------------------------------------------------------- speeds
Tree = tuple[int, int, int]  # a tree budget: (nodes, depth, k)


def expected_round(
    n: int, a: list[float] | tuple[float, ...], tree: Tree | None = None
) -> tuple[list[int], list[float]]:
    """A round's expected proposal (parents) and P(its path reaches depth d): a chain of n, or `tree` (ranks `a`)."""
    nodes, depth, k = tree or (n, n, 1)
    parents, ranks = expected_tree(nodes, min(depth, n), k, a)
    return parents, tree_reach(parents, ranks, a)


def round_cost(
    profile: dict,
    n: int,
    a: list[float] | tuple[float, ...],
    proposer: str,
    verifier: str,
    fuzzy: bool,
    tree: Tree | None = None,
) -> tuple[list[float], float]:
    """(reach by depth, ms) of one expected round (`expected_round`), priced as the engine runs its shape."""
    parents, reach = expected_round(n, a, tree)
    if tree is None:
        return reach, chain_round_ms(profile, proposer, verifier, len(parents), fuzzy)
    levels = max(depths(parents), default=1)
    return reach, tree_round_ms(profile, proposer, verifier, len(parents), levels, tree[2], fuzzy, 1 + sum(reach))


def round_speed(
    profile: dict,
    n: int,
    a: list[float] | tuple[float, ...],
    fuzzy: bool = False,
    proposer: str = "draft",
    verifier: str = "target",
    tree: Tree | None = None,
) -> dict[str, float]:
    """Expected tokens per pass, tok/s and round ms of SD/FSD over one stage: a chain of n at α = a[0], or the
    expected EAGLE-2 tree `tree` on acceptance by rank `a` (the one speed model: `round_cost`)."""
    reach, ms = round_cost(profile, n, a, proposer, verifier, fuzzy, tree)
    per = 1 + sum(reach)
    return {"tokens_per_pass": per, "tokens_per_s": 1000 * per / ms, "pass_ms": ms}


def block_ms(
    profile: dict,
    l_d: int,
    l_q: int,
    alpha_q: float,
    fuzzy_q: bool,
    tree: tuple[int, int, int, tuple[float, ...]] | None = None,
) -> float:
    """Expected ms of the stage-1 rounds to qualify l_q tokens, rounds of min(l_d, left): a chain at α_Q, or `tree`."""

    @cache
    def rounds(n: int) -> tuple[list[float], float]:
        a, budget = ((alpha_q,), None) if tree is None else (tree[3], tree[:3])
        reach, ms = round_cost(profile, n, a, "draft", "qualifier", fuzzy_q, budget)
        return commits(reach), ms

    @cache
    def cost(left: int) -> float:
        if left <= 0:
            return 0.0
        p, ms = rounds(min(l_d, left))
        return sum((pj * cost(left - min(j + 1, left)) for j, pj in enumerate(p)), ms)

    return cost(l_q)


def pyramid_speed(
    profile: dict,
    l_d: int,
    l_q: int,
    alpha_q: float,
    alpha_t: float,
    fuzzy_q: bool = False,
    fuzzy_t: bool = True,
    tree: tuple[int, int, int, tuple[float, ...]] | None = None,
) -> float:
    """Expected tok/s of the pyramid: a block's stage-1 rounds (`block_ms`), then one (ℓ_Q+1)-row target
    pass that commits the chain of ℓ_Q's expected tokens at α_T (the block's qualifier rows are reused)."""
    stage1 = block_ms(profile, l_d, l_q, alpha_q, fuzzy_q, tree)
    stage2 = (
        cost_ms(profile, "target", l_q + 1)
        + engine_ms(profile, "feed")
        + engine_ms(profile, "round")
        + engine_ms(profile, "step")
        + (l_q * engine_ms(profile, "div") if fuzzy_t else 0.0)
    )
    return 1000 * (sum(expected_round(l_q, (alpha_t,))[1]) + 1) / (stage1 + stage2)


# ---------------------------------------------------------------- the best tree (by acceptance per rank a_r: Sequoia)
BUDGETS = [(n, d, k) for n in (4, 6, 8, 12, 16, 24, 32) for d in (2, 3, 4, 5, 6) for k in (2, 3, 4) if d <= n]
GAMMAS = range(1, 9)


def best_tree(
    profile: dict,
    a: list[float] | tuple[float, ...] | None = None,
    fuzzy: bool = False,
    proposer: str = "draft",
    verifier: str = "target",
) -> dict[str, Any]:
    """The best predicted tree budget (nodes, depth, k) beside the best chain, each also × AR, for one stage."""
    a = a or RANK_PRIOR
    scored = [(round_speed(profile, d, a, fuzzy, proposer, verifier, (n, d, k)), n, d, k) for n, d, k in BUDGETS]
    best, n, d, k = max(scored, key=lambda s: s[0]["tokens_per_s"])
    chains = [(round_speed(profile, g, a[:1], fuzzy, proposer, verifier), g) for g in GAMMAS]
    chain, gamma = max(chains, key=lambda s: s[0]["tokens_per_s"])
    best, chain = ({key: round(v, 3) for key, v in x.items()} for x in (best, chain))
    ar = ar_speed(profile)
    return {
        "tree_nodes": n,
        "tree_depth": d,
        "tree_k": k,
        **best,
        "ar_tokens_per_s": round(ar, 3),
        "speedup_vs_ar": round(best["tokens_per_s"] / ar, 4),
        "chain_tokens_per_s": chain["tokens_per_s"],
        "chain_tokens_per_pass": chain["tokens_per_pass"],
        "chain_gamma": gamma,
        "chain_speedup_vs_ar": round(chain["tokens_per_s"] / ar, 4),
        "ranks": [round(x, 3) for x in a],
    }


# ---------------------------------------------------------------- the shape: read in one place; "auto" set before a run
def shape_of(config: Mapping[str, Any] | None) -> str:
    """ "tree" where the run's (resolved) setting says so, else "chain" (a config without it, an old record)."""
    return "tree" if (config or {}).get("shape") == "tree" else "chain"


def resolve_shape(cfg: DecodeConfig, profile: dict | None, trees: bool = True) -> tuple[DecodeConfig, str]:
    """The config to run (shape "chain" or "tree") and why; without trees or a usable profile `shape_to_run` decides."""
    spec = method_spec(cfg.method)
    st = next((s for s in spec.stages if s.shaped), None)  # the stage whose proposal takes the shape
    usable = bool(profile) and "ms" in profile and st is not None and {st.proposer, st.verifier} <= set(profile["ms"])
    if cfg.shape != "auto" or st is None or not trees or not usable:
        return shape_to_run(cfg, trees)
    b = best_tree(profile, None, False, st.proposer, st.verifier)
    tree_s, chain_s = float(b["tokens_per_s"]), float(b["chain_tokens_per_s"])
    where = f" (the {st.proposer} → {st.verifier} stage)" if spec.pyramid else ""
    if tree_s > chain_s:
        budget = {k: int(b[k]) for k in ("tree_nodes", "tree_depth", "tree_k")}
        return replace(cfg, shape="tree", **budget), (
            f"auto: a tree of {budget['tree_nodes']} nodes (depth {budget['tree_depth']}, {budget['tree_k']} "
            f"children), predicted {tree_s:.1f} tok/s against the best chain's {chain_s:.1f} on this machine's "
            f"profile{where}"
        )
    return replace(cfg, shape="chain"), (
        f"auto: the chain, predicted {chain_s:.1f} tok/s against the best tree's "
        f"{tree_s:.1f} on this machine's profile{where}"
    )
