"""What a tree of candidates should buy on this machine: acceptance by rank, the expected tree, its speed.

Why by rank: a tree spends the proposer's top few, so what matters is how often the verifier's token is the
proposer's rank-r candidate (a_r), not only its top-1 (a chain's α). Sequoia's assumption, kept here: a_r
does not depend on depth. The counts come from every context a round's walk observed (`walk_stats`); the
expected tree, its expected accepted length and its round's price (forwards and the engine's work) from
`expected`. `best_tree` compares every budget with the best chain on the same profile and says what each is
against AR. Pure math over records and the profile.
"""
from __future__ import annotations

from typing import Any

from ..core.round import RANK_PRIOR, expected_tree
from ..core.trace import Step
from .expected import ar_ms, chain_reach, chain_round_ms, node_probs, tree_speed
from .walk_stats import rank_counts

__all__ = ["RANK_PRIOR", "BUDGETS", "rank_counts", "rank_acceptance", "expected_tree", "expected_accepted",
           "tree_speed", "best_tree", "chain_speed"]

BUDGETS = [(n, d, k) for n in (4, 6, 8, 12, 16, 24, 32) for d in (2, 3, 4, 5, 6) for k in (2, 3, 4) if d <= n]
GAMMAS = range(1, 9)


def rank_acceptance(steps: list[Step], stage: str = "target") -> list[float] | None:
    """Measured a_r = P(the verifier's token is the rank-r candidate | a context with > r candidates)."""
    rounds = [s.target_round for s in steps if s.target_round is not None] if stage == "target" \
        else [r for s in steps for r in s.qualifier_rounds]
    hits, reach = rank_counts(rounds)
    return [round(h / n, 4) for h, n in zip(hits, reach) if n] or None


def expected_accepted(parents: list[int], ranks: list[int], a: list[float] | tuple[float, ...]) -> float:
    """Σ over nodes of the product of a_rank along the path: the expected accepted drafted tokens per pass."""
    return sum(node_probs(parents, ranks, a))


def chain_speed(profile: dict, gamma: int, alpha: float, fuzzy: bool = False, proposer: str = "draft",
                verifier: str = "target") -> dict[str, float]:
    """The chain of γ at α on this profile, in `tree_speed`'s terms (priced as the engine runs a chain)."""
    per = 1 + sum(chain_reach(alpha, gamma))
    ms = chain_round_ms(profile, proposer, verifier, gamma, fuzzy)
    return {"tokens_per_pass": round(per, 3), "tokens_per_s": round(1000 * per / ms, 3), "pass_ms": round(ms, 3)}


def best_tree(profile: dict, a: list[float] | tuple[float, ...] | None = None, fuzzy: bool = False,
              proposer: str = "draft", verifier: str = "target") -> dict[str, Any]:
    """The tree budget (nodes, depth, k) with the best predicted tok/s here, beside the best chain's (γ at
    α = a_0), each also as a speed-up over AR on the same profile; for the stage `proposer` → `verifier` (a
    pyramid's stage 1: "draft" → "qualifier", every price read at those roles, its chain and tree forwards,
    its compactions)."""
    a = a or RANK_PRIOR
    scored = [(tree_speed(profile, n, d, k, a, proposer, verifier, fuzzy), n, d, k) for n, d, k in BUDGETS]
    best, n, d, k = max(scored, key=lambda s: s[0]["tokens_per_s"])
    chains = [(chain_speed(profile, g, a[0], fuzzy, proposer, verifier), g) for g in GAMMAS]
    chain, gamma = max(chains, key=lambda s: s[0]["tokens_per_s"])
    ar = 1000 / ar_ms(profile)
    return {"tree_nodes": n, "tree_depth": d, "tree_k": k, **best, "ar_tokens_per_s": round(ar, 3),
            "speedup_vs_ar": round(best["tokens_per_s"] / ar, 4),
            "chain_tokens_per_s": chain["tokens_per_s"], "chain_tokens_per_pass": chain["tokens_per_pass"],
            "chain_gamma": gamma, "chain_speedup_vs_ar": round(chain["tokens_per_s"] / ar, 4),
            "ranks": [round(x, 3) for x in a]}
