"""The best tree budget against the best chain, priced by acceptance per rank a_r (independent of depth: Sequoia)."""

from __future__ import annotations

from typing import Any

from ..core.rules import RANK_PRIOR
from .expected import round_speed
from .profile import ar_speed

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
