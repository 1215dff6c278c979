"""How each decoding setting is shown and asked for, keyed by `DecodeConfig` field: the app's widgets and the CLI's
options are built from `SETTINGS` (a new setting is a field plus a row here)."""

from __future__ import annotations

from dataclasses import dataclass

DIVERGENCES = ("js", "kl", "tv")
FALLBACKS = ("none", "sd")
STAGE2_RULES = ("fuzzy", "sd")
DIV_SUPPORTS = ("subset", "full")
SHAPES = ("auto", "chain", "tree")
QUALIFIER_PROMPTS = ("own", "target")


@dataclass(frozen=True)
class Setting:
    name: str  # the DecodeConfig field; the CLI flag is --name-with-dashes
    label: str  # the app widget's label
    widget: str  # "slider", "number", "radio", or "" (command line only)
    range: tuple[float, float, float] | None = None  # slider (min, max, step); DecodeConfig still validates
    choices: tuple[str, ...] = ()  # radio and CLI choices
    info: str | None = None  # the app's help under the widget
    cli: str | None = None  # the CLI's help (the app's info when None)
    tunable: bool = False  # a model family may tune it (presets.Preset.tuned); the CLI then defaults to None
    elem_id: str | None = None  # a stable DOM id for browser tests


SETTINGS = (
    Setting("max_new_tokens", "Max new tokens", "slider", (8, 256, 8), elem_id="max-new"),
    Setting(
        "temperature",
        "Temperature (0 = greedy)",
        "slider",
        (0.0, 1.5, 0.05),
        info="0 makes every model greedy: AR, SD and PSD_A then give the target's exact text.",
    ),
    Setting("top_k", "Top-k", ""),
    Setting("top_p", "Top-p", ""),
    Setting("seed", "Seed", "number", info="Seeds the sampler when temperature > 0."),
    Setting("gamma", "γ: SD/FSD draft length", "slider", (1, 16, 1), cli="SD/FSD draft length γ", tunable=True),
    Setting(
        "l_d",
        "ℓ_D: PSD tokens drafted per qualifier round",
        "slider",
        (1, 16, 1),
        cli="PSD tokens drafted per qualifier round ℓ_D",
        tunable=True,
    ),
    Setting(
        "l_q",
        "ℓ_Q: PSD block length per target pass",
        "slider",
        (1, 32, 1),
        info="CHOICE: the block is cut to exactly ℓ_Q tokens; the qualifier's own tokens count toward it.",
        cli="PSD block length per target round ℓ_Q",
        tunable=True,
    ),
    Setting(
        "tau_q",
        "τ_Q: PSD_F draft→qualifier threshold",
        "slider",
        (0.0, 1.0, 0.01),
        info="Accept a drafted token when Div(qualifier, draft) ≤ τ_Q. Unused by PSD_A (exact rule). "
        "0 accepts none: the qualifier makes every block token itself.",
        cli="PSD_F stage-1 threshold τ_Q",
        tunable=True,
    ),
    Setting(
        "tau_t",
        "τ_T: FSD / PSD qualifier→target threshold",
        "slider",
        (0.0, 1.0, 0.01),
        info="Accept a token when Div(target, proposer) ≤ τ_T. Larger: faster but further from the target. "
        "0 accepts none: the target makes every token itself (target-only output).",
        cli="FSD threshold / PSD stage-2 threshold τ_T",
        tunable=True,
    ),
    Setting(
        "conf_stop",
        "Stop proposing below confidence",
        "slider",
        (0.0, 0.95, 0.05),
        info="Beyond the papers (HF assisted generation uses 0.4): the draft stops after a token whose top "
        "probability is below this, and a PSD block ends after such a qualifier token. 0 = the papers' "
        "fixed γ, ℓ_D and ℓ_Q. Lossless methods stay exact.",
        cli="a proposer (the draft; in PSD also the qualifier's block) stops after a token whose top "
        "probability is below this; 0: off, the papers' fixed lengths (beyond the papers)",
        tunable=True,
    ),
    Setting(
        "lookup_first",
        "Prompt lookup before the draft: shortest match",
        "slider",
        (0, 3, 1),
        info="Beyond the papers (as SAM-Decoding): where the text's last tokens, at least this many (up to 3), "
        "occurred before in the prompt or the answer, the draft proposes what followed them there (prompt lookup, "
        "no model pass); its model runs only where nothing matches. 0 = off. A lookup's guess is certain "
        "(one-hot): lossless methods stay exact, fuzzy rules see a certainty.",
        cli="prompt lookup proposes for the draft model where the text's last tokens, at least this many (1 to 3), "
        "occurred before; the model runs where nothing matches (0: off; beyond the papers)",
        tunable=True,
    ),
    Setting(
        "shape",
        "Proposal shape",
        "radio",
        choices=SHAPES,
        info="What the draft proposes: a chain of tokens, or a tree of candidates (EAGLE-2, SpecInfer) that "
        "the verifier scores in one pass. 'auto' lets this machine's cost profile pick the shape and the "
        "tree's budget that pay, and says why; without a profile it takes the chain.",
        cli="the draft's proposal: 'chain', 'tree' (--tree-nodes, --tree-depth, --tree-k) or 'auto' (the cost "
        "profile picks the shape that pays here, and the run says why; the chain without a profile)",
    ),
    Setting(
        "tree_nodes",
        "Tree: candidate nodes per tree",
        "slider",
        (1, 64, 1),
        info="Shape tree: the draft grows a tree of candidates and the verifier scores all its nodes in one "
        "pass, which on a CPU costs about what one token does. More nodes: more chances, a longer pass.",
        cli="shape tree: candidate nodes per tree",
        tunable=True,
    ),
    Setting(
        "tree_depth",
        "Tree: depth (draft forwards per tree)",
        "slider",
        (1, 16, 1),
        info="Levels the draft grows, one batched draft forward per level (in a pyramid also at most ℓ_D).",
        cli="shape tree: levels grown, one draft forward each (in a pyramid at most l_d)",
        tunable=True,
    ),
    Setting(
        "tree_k",
        "Tree: children per node",
        "slider",
        (1, 10, 1),
        info="Each expanded node's k children are candidates: at temperature 0 its top-k draft tokens, the "
        "k best paths expanded next; above 0, k tokens sampled from the draft (the lossless rule needs "
        "sampled children).",
        cli="shape tree: children per expanded node, and nodes expanded per level",
        tunable=True,
    ),
    Setting(
        "divergence",
        "Divergence",
        "radio",
        choices=DIVERGENCES,
        info="CHOICE: js is the FSD code's ½KL(m‖p)+½KL(m‖q) (not the textbook JSD), computed on the "
        "raw softmax (temperature 1), whatever the sampling temperature.",
        cli="CHOICE",
        tunable=True,
    ),
    Setting(
        "div_support",
        "Divergence where the proposer has zeros",
        "radio",
        choices=DIV_SUPPORTS,
        info="CHOICE for a proposer with a reduced-vocabulary head (probability 0 outside its subset): "
        "'subset' compares it with the verifier renormalised on its subset and adds −log of the "
        "verifier's mass there (tv: 1 − that mass), so mass it cannot write is charged; 'full' uses the "
        "whole vocabulary, where js is infinite and fuzzy acceptance never fires. Same for a full head.",
        cli="CHOICE: divergences for a proposer with zeros (a reduced head): 'subset' = over its support, "
        "the verifier renormalised there, plus −log (tv: 1 −) the verifier's mass there; 'full' = whole "
        "vocabulary (js infinite)",
        tunable=True,
    ),
    Setting(
        "fallback",
        "Fuzzy fallback",
        "radio",
        choices=FALLBACKS,
        info="CHOICE beyond the paper: 'sd' also accepts a token that fails τ but passes the exact SD rule, "
        "so fuzzy acceptance never falls below SD's. Where τ fails, the SD rule alone decides: a rejection "
        "resamples from SD's residual, so those tokens follow the verifier's distribution exactly.",
        cli="'sd': where a token fails τ the exact SD rule decides it (ratio test, residual resample), so "
        "acceptance never falls below SD's (beyond the paper)",
        tunable=True,
    ),
    Setting(
        "stage2",
        "PSD stage-2 rule",
        "radio",
        choices=STAGE2_RULES,
        info="CHOICE beyond the paper: 'sd' checks the qualifier block with the exact SD rule, which makes "
        "PSD_A lossless (a three-model cascade).",
        cli="'sd': exact SD rule at the target stage (lossless PSD_A, beyond the paper)",
        tunable=True,
    ),
    Setting(
        "qualifier_prompt",
        "PSD qualifier's prompt keys/values",
        "radio",
        choices=QUALIFIER_PROMPTS,
        info="CHOICE beyond the paper: 'target' gives a qualifier of the target's own shapes (its quantized copy) "
        "the target's keys and values for the prompt in place of a prefill of its own, so a long prompt is read "
        "once, not twice. The target still checks every token: lossless methods stay exact; PSD_F's qualifier "
        "sees the prompt as the target does. Another qualifier prefills its own.",
        cli="'target': a qualifier of the target's shapes (its quantized copy) takes the target's prompt "
        "keys/values instead of its own prefill (beyond the paper); 'own': each model prefills",
        tunable=True,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
APP_SETTINGS = tuple(s.name for s in SETTINGS if s.widget)  # the app's widgets, in page order
TUNABLE = tuple(s.name for s in SETTINGS if s.tunable)  # settings a model family may tune
