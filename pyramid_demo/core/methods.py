"""Every decoding method in one table (a new method is a row, plus its pricing in `predict.costs`): its stages,
smallest proposer first, each with a rule "sd", "fuzzy" or "config" (`DecodeConfig.stage2`); and one run's settings
(`DecodeConfig`), validated once so that every method fails early with a clear message."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..forward.cache import LONGEST_PASS
from ..forward.lookup import NGRAM
from .settings import DIV_SUPPORTS, DIVERGENCES, FALLBACKS, QUALIFIER_PROMPTS, SHAPES, STAGE2_RULES, TUNABLE  # noqa: F401 - TUNABLE re-exported

TREE_BUDGET = ("tree_nodes", "tree_depth", "tree_k")  # a shaped stage's tree, when it proposes one
# method keys retired by `DecodeConfig.shape`: each is refused in one line naming the new setting
RETIRED = {"sd_tree": "sd", "fsd_tree": "fsd", "psd_a_tree": "psd_a", "psd_f_tree": "psd_f"}


@dataclass(frozen=True)
class Stage:
    """One verification: `proposer`'s tokens scored by `verifier` in one pass, decided by `rule`."""

    proposer: str
    verifier: str
    rule: str  # "sd" | "fuzzy" | "config" (DecodeConfig.stage2)
    length: str  # the DecodeConfig setting that sizes a proposal here (a tree's depth is capped by it too)
    tau: str | None = None  # the threshold a fuzzy (or config) rule reads
    shaped: bool = False  # proposes a chain or a tree, as DecodeConfig.shape says; else always a chain


@dataclass(frozen=True)
class Method:
    key: str
    label: str  # what the app and reports show
    short: str  # the label's short form (chart axes, tables): never parsed out of `label`
    stages: tuple[Stage, ...]  # draft → … → target; empty: the target decodes alone
    colour: str  # lane and chart colour (Okabe-Ito, colour-blind safe)

    @property
    def roles(self) -> tuple[str, ...]:
        """The models it runs, smallest first; the last is always the target."""
        return ("target",) if not self.stages else tuple(s.proposer for s in self.stages) + (self.stages[-1].verifier,)

    @property
    def pyramid(self) -> bool:
        """Two verification stages: draft → qualifier, then qualifier block → target."""
        return len(self.stages) > 1

    @property
    def stage1(self) -> str | None:
        """The draft → qualifier rule (None: no qualifier stage)."""
        return self.stages[0].rule if self.pyramid else None

    @property
    def target(self) -> str | None:
        """The proposer → target rule (None: the target decodes alone)."""
        return self.stages[-1].rule if self.stages else None

    @property
    def proposer(self) -> str | None:
        """The role whose tokens the target verifies (None for target-only decoding)."""
        return self.stages[-1].proposer if self.stages else None

    @property
    def lengths(self) -> tuple[str, ...]:
        """The proposal lengths it reads, innermost first; the last sizes a target pass."""
        return tuple(s.length for s in self.stages)

    @property
    def thresholds(self) -> tuple[str, ...]:
        """The thresholds it may read, outermost stage first."""
        return tuple(s.tau for s in reversed(self.stages) if s.tau)

    @property
    def shaped(self) -> bool:
        """Whether a stage proposes a chain or a tree (DecodeConfig.shape and the tree budget apply)."""
        return any(s.shaped for s in self.stages)


TABLE = (
    Method("ar", "AR (target only)", "AR", (), "#555555"),
    Method("sd", "SD (draft → target)", "SD", (Stage("draft", "target", "sd", "gamma", shaped=True),), "#0072B2"),
    Method(
        "fsd",
        "FSD (fuzzy draft → target)",
        "FSD",
        (Stage("draft", "target", "fuzzy", "gamma", "tau_t", True),),
        "#56B4E9",
    ),
    Method(
        "psd_a",
        "PSD_A (assisted pyramid)",
        "PSD_A",
        (Stage("draft", "qualifier", "sd", "l_d", shaped=True), Stage("qualifier", "target", "config", "l_q", "tau_t")),
        "#E69F00",
    ),
    Method(
        "psd_f",
        "PSD_F (fuzzy pyramid)",
        "PSD_F",
        (
            Stage("draft", "qualifier", "fuzzy", "l_d", "tau_q", True),
            Stage("qualifier", "target", "config", "l_q", "tau_t"),
        ),
        "#D55E00",
    ),
)
_BY_KEY = {m.key: m for m in TABLE}


@dataclass(frozen=True)
class Lane:
    """One run of a race or a bench: a method and (side by side) its shape; `LANES` says what each key runs."""

    key: str
    method: str
    shape: str | None  # None: the run's shape setting
    label: str
    short: str
    solo: str | None = None  # a reference lane: this role decodes alone, as AR with it in the target's slot
    colour: str | None = None  # None: its method's colour


SHAPES_SIDE_BY_SIDE = ("chain", "tree")
ROLE_ORDER = ("draft", "qualifier", "target")  # a family's references, in the order `ModelTriplet.names` holds them
# reference lanes (the race's switch, the bench's --solo): a member decoding alone, the speed a pyramid approaches
SOLO_LANES = (
    Lane("qualifier_alone", "ar", None, "the qualifier alone", "Q alone", solo="qualifier", colour="#CC79A7"),
)
SOLO_ROLES = tuple(lane.solo for lane in SOLO_LANES if lane.solo)


def lanes(side_by_side: bool = False, solo: bool = False) -> tuple[Lane, ...]:
    """A race's lanes in table order: each method once, or (side by side) a shaped one as chain and as tree;
    `solo` adds the reference lanes right after AR (the last lane stays the fullest pyramid)."""
    out = []
    for m in TABLE:
        if side_by_side and m.shaped:
            out += [Lane(f"{m.key}+{s}", m.key, s, f"{m.label} · {s}", f"{m.short}·{s}") for s in SHAPES_SIDE_BY_SIDE]
        else:
            out.append(Lane(m.key, m.key, None, m.label, m.short))
        if solo and m.key == "ar":
            out += SOLO_LANES
    return tuple(out)


LANES = {lane.key: lane for lane in lanes(False, True) + lanes(True, True)}  # every lane key a race can have
_INT4 = re.compile(r"int4(?:g\d+)?")  # a quantized copy's suffix, as `models.quant` writes it


def lane_label(key: str, models: Sequence[str] = ()) -> str:
    """A lane's label; a reference lane's adds "(quantized copy of X)" where its role is an '@int4' copy in `models`."""
    lane = LANES[key]
    if lane.solo is None or len(models) != len(ROLE_ORDER):
        return lane.label
    base, at, suffix = models[ROLE_ORDER.index(lane.solo)].rpartition("@")
    if not at or not _INT4.fullmatch(suffix):
        return lane.label
    return f"{lane.label} (quantized copy of {'the target' if base == models[-1] else base})"


def retired(key: str) -> str | None:
    """The one-line refusal of a retired method key (None for any other key)."""
    if key not in RETIRED:
        return None
    return f"method {key!r} is now method {RETIRED[key]!r} with shape 'tree' (--method {RETIRED[key]} --shape tree)"


def method_spec(key: str) -> Method:
    """The row for `key`; a ValueError naming the choices for an unknown one (the new setting for a retired one)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(retired(key) or f"unknown method {key!r}; choose one of {', '.join(_BY_KEY)}") from None


def stage_rule(stage: Stage, stage2: str) -> str:
    """The rule a stage applies, given the run's `stage2` setting."""
    return stage2 if stage.rule == "config" else stage.rule


def lossless(key: str, stage2: str = "fuzzy") -> bool:
    """Every stage exact: the output follows the target's distribution (PSD_A only with stage2 = "sd")."""
    return all(stage_rule(s, stage2) == "sd" for s in method_spec(key).stages)


# ---------------------------------------------------------------- one run's settings
METHODS = tuple(m.key for m in TABLE)
METHOD_LABELS = {lane.key: lane.label for lane in LANES.values()}  # by method key, and by a race's lane key
METHOD_SHORT = {lane.key: lane.short for lane in LANES.values()}  # "AR", "SD", "SD·tree", …: for axes and tables


def short_name(key: str) -> str:
    """A method's or a lane's short name for charts and tables (an unknown key as it is, upper-cased)."""
    return METHOD_SHORT.get(key, key.upper())


MAX_TREE_K = 16  # the most children a tree node may have
MAX_LENGTH = LONGEST_PASS - 1  # the longest γ, ℓ_D or ℓ_Q


@dataclass(frozen=True)
class DecodeConfig:
    """One run's settings; every field but `method` has a row in `settings.SETTINGS` (the app's and CLI's)."""

    method: str = "psd_f"
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int = 0
    gamma: int = 4  # SD/FSD draft length γ
    l_d: int = 4  # PSD: tokens drafted per qualifier round ℓ_D
    l_q: int = 8  # PSD: qualified block length per target round ℓ_Q
    tau_q: float = 0.4  # PSD_F stage-1 threshold τ_Q
    tau_t: float = 0.5  # FSD threshold / PSD stage-2 threshold τ_T
    divergence: str = "js"
    div_support: str = "subset"  # CHOICE: divergences for a proposer with zeros (a reduced head)
    fallback: str = "none"  # CHOICE beyond the paper: "sd" also accepts tokens the SD rule accepts
    stage2: str = "fuzzy"  # CHOICE beyond the paper: "sd" makes PSD_A lossless (3-model cascade)
    conf_stop: float = 0.0  # beyond the papers: a proposer stops after a token it is less sure of (0: off)
    lookup_first: int = 0  # beyond the papers: prompt lookup proposes for the draft where a match this long exists
    shape: str = "auto"  # a proposal's shape: "chain", "tree", or "auto" (priced before the run: `predict.expected`)
    tree_nodes: int = 16  # shape "tree": candidate nodes per tree (the verifier's pass scores them all at once)
    tree_depth: int = 5  # shape "tree": levels grown (one proposer forward per level)
    tree_k: int = 4  # shape "tree": children per expanded node, and nodes expanded per level
    qualifier_prompt: str = "own"  # CHOICE beyond the paper: "target" = the target's prompt cache (`engine.prefill`)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        method_spec(self.method)  # a ValueError naming the choices (and the new setting for a retired key)
        for name, label, options, choose in (
            ("shape", "shape", SHAPES, f"one of {', '.join(SHAPES)}"),
            ("divergence", "divergence", DIVERGENCES, f"one of {', '.join(DIVERGENCES)}"),
            ("div_support", "div_support", DIV_SUPPORTS, f"one of {', '.join(DIV_SUPPORTS)}"),
            ("fallback", "fallback", FALLBACKS, "'none' or 'sd'"),
            ("qualifier_prompt", "qualifier_prompt", QUALIFIER_PROMPTS, "'own' or 'target'"),
            ("stage2", "stage-2 rule", STAGE2_RULES, "'fuzzy' or 'sd'"),
        ):
            v = getattr(self, name)
            need(v in options, f"unknown {label} {v!r}; choose {choose}")
        need(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}",
        )
        for name in ("gamma", "l_d", "l_q", "tree_nodes", "tree_depth", "tree_k"):
            v, top = getattr(self, name), MAX_TREE_K if name == "tree_k" else MAX_LENGTH
            need(isinstance(v, int) and 1 <= v <= top, f"{name} must be an integer from 1 to {top}, got {v!r}")
        need(self.l_d <= self.l_q, f"l_d ({self.l_d}) must not exceed l_q ({self.l_q})")
        for name in ("tau_q", "tau_t"):
            v = getattr(self, name)
            need(v == v and 0.0 <= v <= 100.0, f"{name} must be a number ≥ 0, got {v!r}")
        need(
            self.conf_stop == self.conf_stop and 0.0 <= self.conf_stop < 1.0,
            f"conf_stop must be in [0, 1), got {self.conf_stop!r}",
        )
        need(
            isinstance(self.lookup_first, int) and 0 <= self.lookup_first <= NGRAM,
            f"lookup_first must be an integer from 0 (off) to {NGRAM}, got {self.lookup_first!r}",
        )
        need(
            self.temperature == self.temperature and 0.0 <= self.temperature <= 10.0,
            f"temperature must be between 0 and 10, got {self.temperature!r}",
        )
        need(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer ≥ 0, got {self.top_k!r}")
        need(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p!r}")
        need(isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return asdict(self)
