"""Statistics computed from step records alone (so charts and reports can recompute them)."""

from __future__ import annotations

from . import rules
from .trace import StageRound, Stats, Step, parents_of

STAGES = ("qualifier", "target")


def stage_rounds(steps: list[Step], stage: str) -> list[StageRound]:
    if stage == "qualifier":
        return [r for s in steps for r in s.qualifier_rounds]
    return [s.target_round for s in steps if s.target_round is not None]


def n_proposed(r: StageRound) -> int:
    return len(r.tokens) - 1  # the last record is the verifier's own token


def n_positions(r: StageRound) -> int:
    """The positions a round offers: its deepest node's depth (a tree of 12 nodes and depth 4 offers 4)."""
    return max(rules.depths(parents_of(r)), default=0)


def agreement(out: list[int], ref: list[int]) -> float | None:
    """The share of the target-only greedy tokens `ref` that `out` reproduces in place (None without a reference)."""
    return None if not ref else sum(1 for a, b in zip(out, ref) if a == b) / len(ref)


def prefix_agreement(out: list[int], ref: list[int]) -> float | None:
    """Share of the reference reproduced before the first differing token."""
    if not ref:
        return None
    n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    return n / len(ref)


def first_divergence(out: list[int], ref: list[int]) -> int | None:
    """The first position (0-based) where `out` leaves the reference `ref`: the first differing token, or where
    the shorter one ends when one is the other's beginning; None when they are the same tokens."""
    n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    return None if n == len(out) == len(ref) else n


class Tally:
    """The one implementation of the statistics, kept step by step: the last snapshot costs what the first did."""

    def __init__(self) -> None:
        self.n_new, self.passes, self.decode_s, self.target_accepted = 0, 0, 0.0, 0
        self.proposed: dict[str, int] = {}  # stage -> proposed tokens (nodes: the work)
        self.offered: dict[str, int] = {}  # stage -> positions offered (`n_positions`: the acceptance's denominator)
        self.rounds: dict[str, int] = {}
        self.accepted: dict[str, int] = {}
        self.reached: dict[str, list[int]] = {}  # stage -> rounds that proposed a node at depth i + 1
        self.kept: dict[str, list[int]] = {}  # stage -> rounds whose accepted path reached depth i + 1
        self.hist: list[int] = []  # target rounds that accepted k drafted tokens, k = 0..the deepest proposal
        self.fwd: dict[str, int] = {}
        self.ftime: dict[str, float] = {}

    def _round(self, stage: str, r: StageRound) -> None:
        n = n_positions(r)
        self.proposed[stage] = self.proposed.get(stage, 0) + n_proposed(r)
        self.offered[stage] = self.offered.get(stage, 0) + n
        self.rounds[stage] = self.rounds.get(stage, 0) + 1
        self.accepted[stage] = self.accepted.get(stage, 0) + r.n_accepted
        for counts, upto in ((self.reached.setdefault(stage, []), n), (self.kept.setdefault(stage, []), r.n_accepted)):
            counts.extend([0] * (upto - len(counts)))
            for i in range(upto):
                counts[i] += 1

    def add(self, step: Step) -> None:
        """Count one step (one target pass)."""
        self.n_new += len(step.new_tokens)
        self.passes += 1
        self.decode_s = step.t_end
        for r in step.qualifier_rounds:
            self._round("qualifier", r)
        if (t := step.target_round) is not None:
            self._round("target", t)
            self.hist.extend([0] * (n_positions(t) + 1 - len(self.hist)))
            self.hist[t.n_accepted] += 1
            self.target_accepted += t.n_accepted
        for role, n in step.n_forward.items():
            self.fwd[role] = self.fwd.get(role, 0) + n
            self.ftime[role] = self.ftime.get(role, 0.0) + step.time_s.get(role, 0.0)

    def stats(self, method: str, prefill_s: float, stopped: str) -> Stats:
        """The run's `Stats` so far. Acceptance: accepted ÷ positions offered (`n_positions`: a tree's depth, not its
        node count); at depth d: rounds whose path reached d ÷ rounds proposing at d."""
        stages = [s for s in STAGES if self.rounds.get(s)]
        n, passes, decode_s = self.n_new, self.passes, self.decode_s
        return Stats(
            method=method,
            n_new_tokens=n,
            prefill_s=round(prefill_s, 6),
            decode_s=round(decode_s, 6),
            tokens_per_s=round(n / decode_s, 3) if decode_s > 0 else 0.0,
            target_passes=passes,
            acceptance={s: round(self.accepted[s] / self.offered[s], 4) if self.offered[s] else 0.0 for s in stages},
            proposed={s: self.proposed[s] for s in stages},
            accepted={s: self.accepted[s] for s in stages},
            mean_accepted_per_target_pass=round(self.target_accepted / passes, 4) if passes else 0.0,
            tokens_per_target_pass=round(n / passes, 4) if passes else 0.0,
            accepted_hist=list(self.hist) if self.rounds.get("target") else [],
            per_position_acceptance={
                s: [
                    round(k / r, 4) if r else 0.0
                    for r, k in zip(self.reached[s], self.kept[s] + [0] * len(self.reached[s]))
                ]
                for s in stages
            },
            forward_passes=dict(self.fwd),
            forward_time_s={k: round(v, 6) for k, v in self.ftime.items()},
            engine_overhead_s=round(max(0.0, decode_s - sum(self.ftime.values())), 6),
            stopped=stopped,
            rounds={s: self.rounds[s] for s in stages},
        )
