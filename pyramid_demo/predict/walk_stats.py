"""What one verification round says about acceptance, read the same way for a chain and a tree.

Why per context: a round's walk stands on a context (the root, then each accepted node), tries that
context's children, and either accepts one and moves down, or stops. Each context it stood on that had
children is one trial of "does the verifier take one of the proposer's candidates here": a success when a
child was accepted, a failure (the round's one rejection event) when none was. A chain is the tree whose
contexts each have one child, so this is exactly SD's per-token α there. A tree's refused siblings on the
way down are not rejections: the walk went on. A round cut short (a PSD block's size, a confidence floor,
an EOS: its own token is then "discarded") is censored: its last context's outcome is not counted.
Pure functions over `StageRound` records, walking them through `rules`' parent-list helpers and `trace` only.
"""
from __future__ import annotations

from ..core import rules
from ..core.trace import StageRound, accepted_path, parents_of


def cut_short(rnd: StageRound) -> bool:
    """Whether the round's use was cut before its walk ended (its own token never used)."""
    return bool(rnd.tokens) and rnd.tokens[-1].status == "discarded"


def trials(rnd: StageRound) -> list[tuple[int, int | None]]:
    """The contexts whose outcome the round observed, in walk order: (context, rank of the accepted child or
    None for the failure that ended the walk). Contexts without children (a leaf, an empty proposal) are no
    trial; a cut round's last context is censored. Bounded by the accepted path: one entry per accepted node,
    at most one more."""
    kids = rules.children(parents_of(rnd))
    path = accepted_path(rnd)
    out: list[tuple[int, int | None]] = []
    ctx = 0
    for node in path:  # each accepted node is the hit of the context it was proposed at
        ctx = rules.context_of(parents_of(rnd), node)
        out.append((ctx, kids[ctx].index(node)))
        ctx = node + 1
    if not cut_short(rnd) and kids[ctx]:
        out.append((ctx, None))
    return out


def rejected(rnd: StageRound) -> bool:
    """The round's one rejection event: its walk stopped at a context that had candidates and took none."""
    t = trials(rnd)
    return bool(t) and t[-1][1] is None


def rank_counts(rounds: list[StageRound]) -> tuple[list[int], list[int]]:
    """Per rank r: how often a trial's accepted child was the r-th ranked one (`hits`), and how many trials
    offered at least r + 1 children (`reach`), over every context a walk observed (a chain's too)."""
    hits: list[int] = []
    reach: list[int] = []
    for rnd in rounds:
        kids = rules.children(parents_of(rnd))
        for ctx, took in trials(rnd):
            n = len(kids[ctx])
            hits.extend([0] * (n - len(hits)))
            reach.extend([0] * (n - len(reach)))
            for r in range(n):
                reach[r] += 1
            if took is not None:
                hits[took] += 1
    return hits, reach
