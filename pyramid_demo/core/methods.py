"""What each decoding method is, in one table: the engine, bench, throughput model and app read it.

A method is a cascade of roles, smallest first. Each verification stage has a rule: "sd" (exact:
lossless), "fuzzy" (divergence ≤ τ: lossy) or "config" (the target stage of a pyramid follows
`DecodeConfig.stage2`). Adding a method: one row here, plus engine code only if its shape is new.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    key: str
    label: str  # what the app and reports show
    short: str  # the label's short form (chart axes, tables): never parsed out of `label`
    roles: tuple[str, ...]  # models it runs, smallest first; the last is always the target
    lengths: tuple[str, ...]  # DecodeConfig proposal lengths it reads; the last sizes a target pass
    thresholds: tuple[str, ...]  # DecodeConfig thresholds it may read (outermost stage first)
    stage1: str | None  # draft → qualifier rule (None: no qualifier stage)
    target: str | None  # proposer → target rule (None: the target decodes alone)
    colour: str  # lane and chart colour (Okabe-Ito, colour-blind safe)
    tree: bool = False  # the proposal is a tree of candidates (EAGLE-2), verified in one pass; else a chain
    # (in a pyramid: the draft's proposal to the qualifier; the qualified block goes to the target as a chain)

    @property
    def pyramid(self) -> bool:
        """Two verification stages: draft → qualifier, then qualifier block → target."""
        return self.stage1 is not None

    @property
    def proposer(self) -> str | None:
        """The role whose tokens the target verifies (None for target-only decoding)."""
        return self.roles[-2] if len(self.roles) > 1 else None


TABLE = (
    Method("ar", "AR (target only)", "AR", ("target",), (), (), None, None, "#555555"),
    Method("sd", "SD (draft → target)", "SD", ("draft", "target"), ("gamma",), (), None, "sd", "#0072B2"),
    Method("fsd", "FSD (fuzzy draft → target)", "FSD", ("draft", "target"), ("gamma",), ("tau_t",), None, "fuzzy",
           "#56B4E9"),
    Method("psd_a", "PSD_A (assisted pyramid)", "PSD_A", ("draft", "qualifier", "target"), ("l_d", "l_q"), ("tau_t",),
           "sd", "config", "#E69F00"),
    Method("psd_f", "PSD_F (fuzzy pyramid)", "PSD_F", ("draft", "qualifier", "target"), ("l_d", "l_q"),
           ("tau_t", "tau_q"), "fuzzy", "config", "#D55E00"),
    # trees of candidates (EAGLE-2): the same rules over a tree the proposer grows, verified in one pass
    Method("sd_tree", "SD tree (draft tree → target)", "SD·tree", ("draft", "target"), ("tree_nodes",), (), None,
           "sd", "#009E73", tree=True),
    Method("fsd_tree", "FSD tree (fuzzy draft tree → target)", "FSD·tree", ("draft", "target"), ("tree_nodes",),
           ("tau_t",), None, "fuzzy", "#CC79A7", tree=True),
    Method("psd_a_tree", "PSD_A tree (assisted pyramid, draft tree → qualifier)", "PSD_A·tree",
           ("draft", "qualifier", "target"), ("tree_nodes", "l_q"), ("tau_t",), "sd", "config", "#8C6D1F", tree=True),
    Method("psd_f_tree", "PSD_F tree (fuzzy pyramid, draft tree → qualifier)", "PSD_F·tree",
           ("draft", "qualifier", "target"), ("tree_nodes", "l_q"), ("tau_t", "tau_q"), "fuzzy", "config", "#7F2704",
           tree=True),
)
_BY_KEY = {m.key: m for m in TABLE}


def method_spec(key: str) -> Method:
    """The row for `key`; a ValueError naming the choices for an unknown one."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown method {key!r}; choose one of {', '.join(_BY_KEY)}") from None


def target_rule(key: str, stage2: str) -> str | None:
    """The rule the target applies, given the run's `stage2` setting."""
    rule = method_spec(key).target
    return stage2 if rule == "config" else rule


def lossless(key: str, stage2: str = "fuzzy") -> bool:
    """True when every stage is exact, so the output follows the target's distribution
    (at temperature 0: the target's own text). PSD_A is lossless only with stage2 = "sd"."""
    return method_spec(key).stage1 in (None, "sd") and target_rule(key, stage2) in (None, "sd")
