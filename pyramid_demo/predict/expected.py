"""Expected speed of every method and shape on a cost profile from acceptance alone (a chain: a one-child tree)."""

from __future__ import annotations

from functools import cache

from ..core.rules import depths, expected_tree
from .engine_costs import engine_ms
from .profile import cost_ms, cost_tree_ms


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
) -> tuple[float, float]:
    """Expected (ms, stage-1 rounds) to qualify l_q tokens, rounds of min(l_d, left): a chain at α_Q, or `tree`."""

    @cache
    def rounds(n: int) -> tuple[list[float], float]:
        a, budget = ((alpha_q,), None) if tree is None else (tree[3], tree[:3])
        reach, ms = round_cost(profile, n, a, "draft", "qualifier", fuzzy_q, budget)
        return commits(reach), ms

    @cache
    def cost(left: int) -> tuple[float, float]:
        if left <= 0:
            return 0.0, 0.0
        p, ms = rounds(min(l_d, left))
        total, n_rounds = ms, 1.0
        for j, pj in enumerate(p):
            c, r = cost(left - min(j + 1, left))
            total, n_rounds = total + pj * c, n_rounds + pj * r
        return total, n_rounds

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
    stage1, _ = block_ms(profile, l_d, l_q, alpha_q, fuzzy_q, tree)
    stage2 = (
        cost_ms(profile, "target", l_q + 1)
        + engine_ms(profile, "feed")
        + engine_ms(profile, "round")
        + engine_ms(profile, "step")
        + (l_q * engine_ms(profile, "div") if fuzzy_t else 0.0)
    )
    return 1000 * (sum(expected_round(l_q, (alpha_t,))[1]) + 1) / (stage1 + stage2)
