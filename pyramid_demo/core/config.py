"""Decoding settings, validated once so that every method fails early with a clear message."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..forward.cache import LONGEST_PASS
from .methods import LANES, TABLE, method_spec
from .settings import DIV_SUPPORTS, DIVERGENCES, FALLBACKS, QUALIFIER_PROMPTS, SHAPES, STAGE2_RULES, TUNABLE  # noqa: F401 - TUNABLE re-exported

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
