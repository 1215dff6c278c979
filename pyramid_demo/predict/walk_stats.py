"""Acceptance as the cost models read it: one trial per context a round's walk reached (refused siblings on the way
down are no rejection)."""

from __future__ import annotations

from typing import Any

from ..core import rules
from ..core.trace import STAGES, StageRound, Step, accepted_path, n_proposed, parents_of, stage_rounds


def cut_short(rnd: StageRound) -> bool:
    """Whether the round's use was cut before its walk ended (its own token never used)."""
    return bool(rnd.tokens) and rnd.tokens[-1].status == "discarded"


def trials(rnd: StageRound) -> list[tuple[int, int | None]]:
    """The contexts whose outcome the round observed, in walk order: (context, rank of the accepted child or None
    for the failure that ended the walk); leaves are no trial and a cut round's last context is censored."""
    kids = rules.children(parents_of(rnd))
    out: list[tuple[int, int | None]] = []
    ctx = 0
    for node in accepted_path(rnd):  # each accepted node is the hit of the context it was proposed at
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


def counts(rounds: list[StageRound]) -> dict[str, Any]:
    """One stage's counts (accepted, rejections, proposed, rounds, by rank): they add up over runs."""
    hits, reach = rank_counts(rounds)
    return {
        "accepted": sum(r.n_accepted for r in rounds),
        "rejected": sum(1 for r in rounds if rejected(r)),
        "proposed": sum(n_proposed(r) for r in rounds),
        "rounds": len(rounds),
        "rank_hits": hits,
        "rank_reach": reach,
    }


def stage_counts(steps: list[Step]) -> dict[str, dict[str, Any]]:
    """`counts` per stage that ran a round."""
    return {st: counts(stage_rounds(steps, st)) for st in STAGES if stage_rounds(steps, st)}


def alpha(c: dict | None) -> float | None:
    """Measured α = accepted ÷ (accepted + rejections): P(a child is taken | a context reached with candidates)."""
    n = c["accepted"] + c["rejected"] if c else 0
    return round(c["accepted"] / n, 4) if c and n else None


def ranks(c: dict | None) -> list[float] | None:
    """Measured a_r = P(the verifier's token is the rank-r candidate | a context with > r candidates)."""
    hits, reach = (c or {}).get("rank_hits") or [], (c or {}).get("rank_reach") or []
    return [round(h / n, 4) for h, n in zip(hits, reach) if n] or None
