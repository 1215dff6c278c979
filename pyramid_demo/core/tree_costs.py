"""What a tree of candidates should buy on this machine: acceptance by rank, the expected tree, its speed.

Why by rank: a tree spends the proposer's top few, so what matters is how often the verifier's token is the
proposer's rank-r candidate (a_r), not only its top-1 (a chain's α). Sequoia's assumption, kept here: a_r
does not depend on depth. EAGLE-2's expansion is replayed on expected scores (log of a product of a_r along
a path), which gives the tree's shape; its expected accepted length is the sum over nodes of the product of
a_r along their path (greedy: a node is accepted when every edge to it is the verifier's token). Costs come
from the measured profile (`costs.cost_ms`): one proposer forward per level of k rows, one verifier pass of
nodes + 1 rows. Pure math over records and the profile.
"""
from __future__ import annotations

import math
from typing import Any

from .profile import ar_speed, cost_ms
from .trace import StageRound, Step
from .tree import best_nodes

# on-policy rank marginals of the shipped feature draft (../shared/notes/trees.md: greedy, 8 unseen prompts,
# 352 positions: top-1 0.406, top-2 0.509, top-3 0.554, top-4 0.599, top-5 0.645): what is assumed before a
# tree has run here
RANK_PRIOR = (0.406, 0.103, 0.045, 0.045, 0.046)
BUDGETS = [(n, d, k) for n in (4, 6, 8, 12, 16, 24, 32) for d in (2, 3, 4, 5, 6) for k in (2, 3, 4) if d <= n]


def rank_counts(rounds: list[StageRound]) -> tuple[list[int], list[int]]:
    """From tree rounds: per rank r, how often the accepted child was the r-th ranked one (`hits`), and how many
    reached contexts had at least r + 1 children (`reach`). A context is reached when the walk stood on it."""
    hits: list[int] = []
    reach: list[int] = []
    for rnd in rounds:
        if rnd.parents is None:
            continue
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(rnd.parents):
            kids.setdefault(p, []).append(i)
        accepted = {i for i, t in enumerate(rnd.tokens[:-1]) if t.status == "accepted"}
        c = -1
        while kids.get(c):
            ch = kids[c]
            while len(reach) < len(ch):
                reach.append(0)
                hits.append(0)
            for r in range(len(ch)):
                reach[r] += 1
            took = next((r for r, i in enumerate(ch) if i in accepted), None)
            if took is None:
                break
            hits[took] += 1
            c = ch[took]
    return hits, reach


def rank_acceptance(steps: list[Step], stage: str = "target") -> list[float] | None:
    """Measured a_r = P(the verifier's token is the rank-r candidate | a context with > r candidates)."""
    rounds = [s.target_round for s in steps if s.target_round is not None] if stage == "target" \
        else [r for s in steps for r in s.qualifier_rounds]
    hits, reach = rank_counts([r for r in rounds if r is not None])
    return [round(h / n, 4) for h, n in zip(hits, reach) if n] or None


def expected_tree(nodes: int, depth: int, k: int, a: list[float] | tuple[float, ...]) -> tuple[list[int], list[int]]:
    """EAGLE-2's expansion on expected scores: (parents, ranks) of the tree it keeps."""
    def lp(r: int) -> float:
        return math.log(max(a[r] if r < len(a) else a[-1] * 0.5, 1e-9))

    par, rank, score = [], [], []
    frontier = [-1]
    base = {-1: 0.0}
    for _ in range(depth):
        new = []
        for f in frontier:
            for r in range(k):
                par.append(f)
                rank.append(r)
                score.append(base[f] + lp(r))
                base[len(par) - 1] = score[-1]
                new.append(len(par) - 1)
        frontier = sorted(new, key=lambda i: -score[i])[:k]
    keep = best_nodes(par, score, nodes)
    idx = {old: i for i, old in enumerate(keep)}
    return [idx[par[i]] if par[i] >= 0 else -1 for i in keep], [rank[i] for i in keep]


def expected_accepted(parents: list[int], ranks: list[int], a: list[float] | tuple[float, ...]) -> float:
    """Σ over nodes of the product of a_rank along the path: the expected accepted drafted tokens per pass."""
    p: list[float] = []
    for par, r in zip(parents, ranks):
        ar = a[r] if r < len(a) else 0.0
        p.append(ar * (p[par] if par >= 0 else 1.0))
    return sum(p)


def tree_speed(profile: dict, nodes: int, depth: int, k: int, a: list[float] | tuple[float, ...],
               proposer: str = "draft", verifier: str = "target") -> dict[str, float]:
    """Expected tokens per pass and tok/s of SD over an EAGLE-2 tree on this profile."""
    parents, ranks = expected_tree(nodes, depth, k, a)
    per_pass = 1.0 + expected_accepted(parents, ranks, a)
    levels = max((1 + sum(1 for _ in _up(parents, i)) for i in range(len(parents))), default=1)
    ms = cost_ms(profile, proposer, 1) + (levels - 1) * cost_ms(profile, proposer, k) \
        + cost_ms(profile, verifier, len(parents) + 1)
    return {"tokens_per_pass": round(per_pass, 3), "tokens_per_s": round(1000 * per_pass / ms, 3),
            "pass_ms": round(ms, 3)}


def _up(parents: list[int], i: int):
    while parents[i] >= 0:
        i = parents[i]
        yield i


def best_tree(profile: dict, a: list[float] | tuple[float, ...] | None = None) -> dict[str, Any]:
    """The tree budget (nodes, depth, k) with the best predicted tok/s here, beside the best chain's."""
    a = a or RANK_PRIOR
    scored = [(tree_speed(profile, n, d, k, a), n, d, k) for n, d, k in BUDGETS]
    best, n, d, k = max(scored, key=lambda s: s[0]["tokens_per_s"])
    chains = [tree_speed(profile, g, g, 1, a) for g in range(1, 9)]
    chain = max(chains, key=lambda s: s["tokens_per_s"])
    return {"tree_nodes": n, "tree_depth": d, "tree_k": k, **best, "ar_tokens_per_s": round(ar_speed(profile), 3),
            "chain_tokens_per_s": chain["tokens_per_s"], "chain_tokens_per_pass": chain["tokens_per_pass"],
            "ranks": [round(x, 3) for x in a]}
