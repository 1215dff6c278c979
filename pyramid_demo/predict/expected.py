"""Expected speed of every method and shape on a cost profile, from acceptance alone.

One round's price is its forwards (the profile's ms per forward of k new tokens) plus the engine's work
around them (`engine_costs`): a chain round of n proposals is n proposer steps and one (n+1)-row pass; a tree
round is the proposer's root step, one tree forward of k rows per further level, and one (nodes+1)-row tree
pass (the profile's tree forwards where it has them), plus
the rows it expands and the compaction of the accepted path in both caches. A fuzzy rule adds its
divergences: a chain's decision scores every proposed row, a tree's one per context its walk stands on.

What a round commits follows from the probability that its accepted path reaches depth d (`reach`): a chain's
α^d; a tree's the sum over its nodes at depth d of the product of acceptance by rank along their path (the
expected EAGLE-2 tree, Sequoia's assumption that acceptance depends on rank, not depth). A pyramid fills a
block of ℓ_Q qualified tokens with stage-1 rounds, each proposing min(ℓ_D, what is left) and cut to size, so
the expected cost of a block is a small recursion over what is left (`block_ms`), then one stage-2 chain.
Every figure here is also stated against AR's (`ar_ms`: a target step, its feed and its cut). Pure math.
"""
from __future__ import annotations

from functools import cache

from ..core.round import expected_tree
from ..core.rules import depths
from .engine_costs import engine_ms
from .profile import cost_ms, cost_tree_ms


# ---------------------------------------------------------------- what a round commits
def chain_reach(alpha: float, n: int) -> list[float]:
    """P(the accepted run reaches position d), d = 1 … n: α^d."""
    return [alpha ** d for d in range(1, n + 1)]


def node_probs(parents: list[int], ranks: list[int], a: list[float] | tuple[float, ...]) -> list[float]:
    """Each node's probability of being on the accepted path: the product of a_rank along its path."""
    p: list[float] = []
    for par, r in zip(parents, ranks):
        p.append((a[r] if r < len(a) else 0.0) * (p[par] if par >= 0 else 1.0))
    return p


def tree_reach(parents: list[int], ranks: list[int], a: list[float] | tuple[float, ...]) -> list[float]:
    """P(the accepted path reaches depth d), d = 1 … the tree's depth (its nodes at d are exclusive)."""
    d = depths(parents)
    out = [0.0] * (max(d) if d else 0)
    for depth, p in zip(d, node_probs(parents, ranks, a)):
        out[depth - 1] += p
    return out


def commits(reach: list[float]) -> list[float]:
    """P(exactly j drafted tokens accepted), j = 0 … len(reach), from the reach probabilities."""
    r = [1.0, *reach, 0.0]
    return [max(0.0, r[j] - r[j + 1]) for j in range(len(reach) + 1)]


# ---------------------------------------------------------------- what a round costs
def ar_ms(profile: dict) -> float:
    """AR's time per token: one target step, the engine's check and pick of it, and its cut."""
    return cost_ms(profile, "target", 1) + engine_ms(profile, "feed") + engine_ms(profile, "step")


def chain_round_ms(profile: dict, proposer: str, verifier: str, n: int, fuzzy: bool) -> float:
    """n one-token proposer steps, one (n+1)-row verifier pass, their feeds, the decision and the cut (and n
    divergences)."""
    fwd = n * cost_ms(profile, proposer, 1) + cost_ms(profile, verifier, n + 1)
    eng = (n + 1) * engine_ms(profile, "feed") + engine_ms(profile, "round") + engine_ms(profile, "step")
    return fwd + eng + (n * engine_ms(profile, "div") if fuzzy else 0.0)


def tree_round_ms(profile: dict, proposer: str, verifier: str, nodes: int, levels: int, k: int, fuzzy: bool,
                  contexts: float) -> float:
    """The proposer's root step and one k-row forward per further level, the (nodes+1)-row pass, the rows it
    expands, both caches' compaction, the decision, and one divergence per context reached (`contexts`)."""
    fwd = cost_ms(profile, proposer, 1) + (levels - 1) * cost_tree_ms(profile, proposer, k) \
        + cost_tree_ms(profile, verifier, nodes + 1)
    eng = (2 * engine_ms(profile, "feed") + engine_ms(profile, "round") + engine_ms(profile, "step")
           + (1 + (levels - 1) * k) * engine_ms(profile, "expand")
           + engine_ms(profile, "keep", proposer) + engine_ms(profile, "keep", verifier))
    return fwd + eng + (contexts * engine_ms(profile, "div1") if fuzzy else 0.0)


def tree_levels(parents: list[int]) -> int:
    return max(depths(parents), default=1)


# ---------------------------------------------------------------- speeds
def chain_speed(profile: dict, n: int, alpha: float, fuzzy: bool = False) -> float:
    """Expected tok/s of SD/FSD over a chain of n: E(α, n) tokens per round."""
    e = sum(chain_reach(alpha, n)) + 1
    return 1000 * e / chain_round_ms(profile, "draft", "target", n, fuzzy)


def tree_speed(profile: dict, nodes: int, depth: int, k: int, a: list[float] | tuple[float, ...],
               proposer: str = "draft", verifier: str = "target", fuzzy: bool = False) -> dict[str, float]:
    """Expected tokens per pass, tok/s and round ms of SD/FSD over the expected EAGLE-2 tree."""
    parents, ranks = expected_tree(nodes, depth, k, a)
    acc = sum(node_probs(parents, ranks, a))
    ms = tree_round_ms(profile, proposer, verifier, len(parents), tree_levels(parents), k, fuzzy, 1 + acc)
    return {"tokens_per_pass": round(1 + acc, 3), "tokens_per_s": round(1000 * (1 + acc) / ms, 3),
            "pass_ms": round(ms, 3)}


def block_ms(profile: dict, l_d: int, l_q: int, alpha_q: float, fuzzy_q: bool,
             tree: tuple[int, int, int, tuple[float, ...]] | None = None) -> tuple[float, float]:
    """Expected (ms, stage-1 rounds) to qualify a block of l_q tokens: each round proposes min(l_d, what is
    left) (a chain at α_Q, or `tree` = (nodes, depth, k, acceptance by rank) grown min(depth, that) deep),
    commits its accepted run and the qualifier's own token, cut to what is left."""
    @cache
    def rounds(n: int) -> tuple[list[float], float]:
        if tree is None:
            return commits(chain_reach(alpha_q, n)), chain_round_ms(profile, "draft", "qualifier", n, fuzzy_q)
        nodes, depth, k, a = tree
        par, rk = expected_tree(nodes, min(depth, n), k, a)
        reach = tree_reach(par, rk, a)
        ms = tree_round_ms(profile, "draft", "qualifier", len(par), tree_levels(par), k, fuzzy_q, 1 + sum(reach))
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


def pyramid_speed(profile: dict, l_d: int, l_q: int, alpha_q: float, alpha_t: float, fuzzy_q: bool = False,
                  fuzzy_t: bool = True, tree: tuple[int, int, int, tuple[float, ...]] | None = None) -> float:
    """Expected tok/s of the pyramid: a block's stage-1 rounds (`block_ms`), then one (ℓ_Q+1)-row target
    pass that commits E(α_T, ℓ_Q)."""
    stage1, _ = block_ms(profile, l_d, l_q, alpha_q, fuzzy_q, tree)
    stage2 = (cost_ms(profile, "target", l_q + 1) + engine_ms(profile, "feed") + engine_ms(profile, "round")
              + engine_ms(profile, "step")
              + (l_q * engine_ms(profile, "div") if fuzzy_t else 0.0))  # the block's qualifier rows are reused
    return 1000 * (sum(chain_reach(alpha_t, l_q)) + 1) / (stage1 + stage2)
