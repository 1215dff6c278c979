"""Plain, JSON-serialisable records of a run: the app, charts, bench and statistics read only these."""

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
    # ÷ rounds that proposed at d (core.stats); a pass that proposed nothing (the budget's last token) reaches none
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
