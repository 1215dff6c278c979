"""Plain, JSON-serialisable records of a run, and the statistics computed from them alone (the app, charts and
bench read only these)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import rules

# A token's status. Every round is a tree (`StageRound.parents`; a chain's is [−1, 0, 1, …]):
#   accepted   a proposed token on the accepted path
#   rejected   a candidate the verifier tried and refused
#   discarded  a candidate never reached, or left unused by a round's cut (a PSD block's size, an EOS)
#   resampled  the verifier's own token after a refusal
#   bonus      the verifier's own token where nothing more was proposed; its origin is "bonus" too


@dataclass
class TokenRec:
    token_id: int
    proposer: str  # draft | qualifier | target
    status: str  # one of the statuses above
    div: float | None = None  # Div(P_verifier, P_proposer) on raw distributions; None for own tokens
    tau: float | None = None  # threshold it was tested against; None under the exact SD rule
    p: float | None = None  # verifier's warped probability of the token
    q: float | None = None  # proposer's warped probability of the token
    top5: dict[str, list[list[float]]] = field(default_factory=dict)  # role -> [[id, prob], ...] raw
    # the exact SD rule's verdict had τ failed here (None: not tried, or no SD-reading rule): the what-if τ reads it
    sd_passed: bool | None = None


@dataclass
class StageRound:
    """One verification pass: `proposer` tokens scored by `verifier` in one forward."""

    stage: str  # "qualifier" (draft → qualifier) or "target" (draft/qualifier → target)
    proposer: str
    verifier: str
    rule: str  # greedy | sd | fuzzy | fuzzy+sd: what the app shows (logic reads the two fields below)
    tokens: list[TokenRec]  # proposed tokens, then the verifier's own token (resampled/bonus)
    n_accepted: int
    exact: bool = False  # decided by the exact SD rule: τ is unused, a what-if τ changes nothing
    sd_fallback: bool = False  # a fuzzy round under fallback "sd": a token also passed when the SD rule did
    # each proposed token's parent (−1: the root), breadth-first; None only in old records
    parents: list[int] | None = None


def parents_of(rnd: StageRound) -> list[int]:
    """Every round is a tree: its proposed tokens' parent list (a chain's for an old record without one)."""
    return list(rnd.parents) if rnd.parents is not None else rules.chain_parents(len(rnd.tokens) - 1)


def accepted_path(rnd: StageRound) -> list[int]:
    """The accepted proposed nodes, root first (one path)."""
    return [i for i, t in enumerate(rnd.tokens[:-1]) if t.status == "accepted"]


@dataclass
class Step:
    """One target forward pass and everything that led to it."""

    index: int
    qualifier_rounds: list[StageRound]  # PSD only
    target_round: StageRound | None  # None for AR
    new_tokens: list[int]  # committed this step, in order
    origins: list[str]  # per new token: draft | qualifier | target | bonus (what the app colours)
    t_start: float  # seconds since decoding (after prefill) began
    t_end: float
    time_s: dict[str, float] = field(default_factory=dict)  # forward seconds per model this step
    n_forward: dict[str, int] = field(default_factory=dict)
    fed: dict[str, list[int]] = field(default_factory=dict)  # new tokens of each forward per model (cost profile)

    @property
    def rounds(self) -> list[StageRound]:
        """Its rounds in the order they ran: the stage-1 rounds, then the target's."""
        return self.qualifier_rounds + ([self.target_round] if self.target_round is not None else [])


@dataclass
class Stats:
    method: str
    n_new_tokens: int
    prefill_s: float
    decode_s: float  # wall time after prefill
    tokens_per_s: float  # n_new_tokens / decode_s (prefill excluded)
    target_passes: int
    acceptance: dict[str, float]  # stage -> accepted / positions proposed (a chain's length, a tree's depth)
    proposed: dict[str, int]
    accepted: dict[str, int]
    mean_accepted_per_target_pass: float  # drafted tokens the target accepted (bonus NOT counted)
    tokens_per_target_pass: float  # committed tokens per target pass (target's own token counted)
    accepted_hist: list[int]  # count of target passes that accepted k drafted tokens, k = 0..max (every pass)
    per_position_acceptance: dict[str, list[float]]  # stage -> per depth d: rounds whose accepted path reached d
    # ÷ rounds that proposed at d (`Tally`); a pass that proposed nothing (the budget's last token) reaches none
    forward_passes: dict[str, int]
    forward_time_s: dict[str, float]  # decode forwards per model (prefill excluded)
    engine_overhead_s: float  # decode wall time outside model forwards
    stopped: str  # eos | max_new_tokens | cancelled
    rounds: dict[str, int] = field(default_factory=dict)  # stage -> rounds (proposed ÷ rounds: mean length)


@dataclass
class RunResult:
    method: str
    config: dict
    models: list[str]
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    token_texts: list[str]
    origins: list[str]
    text: str
    stats: Stats
    steps: list[Step]
    shape_why: str = ""  # why the proposal had the shape it had (config["shape"]): as asked, or what "auto" chose
    solo: str | None = None  # a reference run: the role that decoded alone (method "ar", `run.solo_lms`)
    forwards: dict[str, str] = field(default_factory=dict)  # role -> "compiled", "eager", "hf" or "feature"

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- statistics, from the records alone
STAGES = ("qualifier", "target")


def stage_rounds(steps: list[Step], stage: str) -> list[StageRound]:
    return [r for s in steps for r in s.rounds if r.stage == stage]


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
    n = first_divergence(out, ref)
    return None if not ref else (len(ref) if n is None else n) / len(ref)


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

    def _round(self, r: StageRound) -> None:
        n, stage = n_positions(r), r.stage
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
        for r in step.rounds:
            self._round(r)
        if (t := step.target_round) is not None:
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
