"""Pure functions over recorded rounds (no model runs): what-if acceptance, top-5s, shapes and the export."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import rules
from ..core.rules import fuzzy_passes
from ..core.trace import STAGES, RunResult, StageRound, Step, TokenRec, accepted_path, parents_of, stage_rounds
from ..predict.walk_stats import cut_short


def sd_took(rec: TokenRec) -> bool:
    """Whether the SD fallback's test accepted this token: `sd_passed` where recorded, else accepted with Div > τ."""
    if rec.sd_passed is not None:
        return rec.sd_passed
    return rec.status == "accepted" and rec.tau is not None and (rec.div or 0.0) > rec.tau


def walk(rnd: StageRound, tau: float) -> list[str]:
    """Each proposed token's status under the fuzzy rule at `tau`, walked as the engine walks it (the SD fallback takes
    the child the SD rule took; a cut does not depend on τ). The rule: docs/how-it-works.md."""
    recs = rnd.tokens[:-1]
    kids = rules.children(parents_of(rnd))
    status = ["discarded"] * len(recs)
    path: list[int] = []
    c = 0
    while kids[c]:
        ch = kids[c]
        d = recs[ch[0]].div
        took = ch[0] if fuzzy_passes([float("inf") if d is None else d], tau)[0] else None
        if took is None and rnd.sd_fallback:
            took = next((i for i in ch if sd_took(recs[i])), None)
        for i in ch[: ch.index(took) if took is not None else len(ch)]:
            status[i] = "rejected"
        if took is None:
            break
        status[took] = "accepted"
        path.append(took)
        c = took + 1
    if cut_short(rnd):  # a PSD block's size or confidence cut, an EOS
        for i in path[rnd.n_accepted :]:
            status[i] = "discarded"
    return status


def whatif_statuses(rnd: StageRound, tau: float | None) -> list[str]:
    """accepted / rejected / discarded per proposed token under `tau` (an exact-rule round, or no τ: as recorded)."""
    return [t.status for t in rnd.tokens[:-1]] if rnd.exact or tau is None else walk(rnd, tau)


def reevaluate(rnd: StageRound, tau: float | None) -> int:
    """Drafted tokens the round would have accepted at `tau` (`walk`); an exact-rule round's recorded count stands."""
    return rnd.n_accepted if rnd.exact or tau is None else walk(rnd, tau).count("accepted")


def round_tau(rnd: StageRound, tau_q: float, tau_t: float) -> float | None:
    """The what-if threshold that applies to a round (None under an exact rule)."""
    return None if rnd.exact else tau_q if rnd.stage == "qualifier" else tau_t


def line(rnd: StageRound) -> list[int]:
    """The nodes along positions 1, 2, …: the accepted path, then each context's top-ranked child (a chain: all)."""
    kids = rules.children(parents_of(rnd))
    out = accepted_path(rnd)
    c = out[-1] + 1 if out else 0
    while kids[c]:
        out.append(kids[c][0])
        c = kids[c][0] + 1
    return out


@dataclass
class Position:
    """A position (depth, 1-based): its node (None: the own token only), its siblings, whether the own token is here."""

    depth: int
    node: int | None
    siblings: list[int]
    own: bool


def positions(rnd: StageRound) -> list[Position]:
    """Every position along a round's `line`: a chain of n has n, or n + 1 when fully accepted (the bonus after it)."""
    ps = parents_of(rnd)
    kids = rules.children(ps)
    nodes, k = line(rnd), len(accepted_path(rnd))
    out = [
        Position(d, i, [j for j in kids[rules.context_of(ps, i)] if j != i], d == k + 1)
        for d, i in enumerate(nodes, start=1)
    ]
    if k + 1 > len(nodes):
        out.append(Position(k + 1, None, [], True))
    return out


def position_at(rnd: StageRound, depth: int) -> Position:
    """The round's position at `depth` (1-based), clamped to the positions it has."""
    pos = positions(rnd)
    return pos[max(0, min(depth, len(pos)) - 1)]


def block_sources(step: Step) -> list[TokenRec | None]:
    """Per position of the target round's block, the stage-1 record that saw the draft's proposal there (or None)."""
    out: list[TokenRec | None] = []
    for rnd in step.qualifier_rounds:
        path = accepted_path(rnd)
        out += [rnd.tokens[i] for i in path]
        end = rules.children(parents_of(rnd))[path[-1] + 1 if path else 0]
        out.append(rnd.tokens[end[0]] if end else None)
    return out


def position_top5(step: Step, depth: int) -> dict[str, list[list[float]]]:
    """Each model's top-5 next tokens at position `depth` (1-based, clamped) of the target round: role → [[id, p]]."""
    rnd = step.target_round
    if rnd is None or not rnd.tokens:
        return {}
    at = position_at(rnd, depth)
    merged: dict[str, list[list[float]]] = {}
    srcs = block_sources(step)
    if at.depth - 1 < len(srcs) and (src := srcs[at.depth - 1]) is not None:
        merged.update(src.top5)
    merged.update(rnd.tokens[-1 if at.node is None else at.node].top5)  # the distributions at its parent's context
    return {r: merged[r] for r in ("draft", "qualifier", "target") if r in merged}


def rounds_of(r: RunResult) -> list[StageRound]:
    """Every verification round of a run, in order (stage-1 rounds before their target round)."""
    return [x for s in r.steps for x in s.rounds]


def proposes_trees(r: RunResult) -> bool:
    """Whether a run proposed trees: some round's parent list is not a chain (read from the records, not a setting)."""
    return any(not rules.is_chain(parents_of(x)) for x in rounds_of(r))


def shape_summary(r: RunResult) -> str:
    """ "chain", or "tree (≤ 7 nodes, depth ≤ 3)": what a run's rounds proposed, from their parent lists."""
    if not proposes_trees(r):
        return "chain"
    ps = [parents_of(x) for x in rounds_of(r)]
    return f"tree (≤ {max(len(p) for p in ps)} nodes, depth ≤ {max(max(rules.depths(p), default=0) for p in ps)})"


def result_export(r: RunResult) -> dict:
    """A run as the export writes it: each round with its parent list and accepted path (no rule needed to read it)."""
    d = r.to_dict()
    for step, out in zip(r.steps, d["steps"]):
        outs = out["qualifier_rounds"] + ([out["target_round"]] if out["target_round"] is not None else [])
        for rnd, o in zip(step.rounds, outs):
            o.update(parents=parents_of(rnd), accepted_path=accepted_path(rnd))
    return d


def stage_names(r: RunResult) -> list[str]:
    return [s for s in STAGES if stage_rounds(r.steps, s)]
