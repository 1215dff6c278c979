"""The family box beside the prompt (three plain lines: models, where they run, memory) and the fold with details."""

from __future__ import annotations

from typing import Any

from ..models.checks import describe, describe_trees
from ..models.offline import as_run
from ..models.presets import BUNDLED_TARGET, FEATURE_DRAFT, PRESETS, Preset
from . import hosting

FOLD_TITLE = "How it works · exactness on this machine"
KNOWN = {
    FEATURE_DRAFT: "a one-layer draft that reads the qualifier",  # the offline family's references, in words
    BUNDLED_TARGET + "@int4": "the target's own int4 copy",
    BUNDLED_TARGET: "SmolLM2-135M-Instruct (bundled)",
}
CUSTOM_BOX = (
    "**Custom family**: three Hugging Face ids or local paths of causal LMs that share one tokenizer, "
    "smallest first.  \nThey download on the first run."
)
CUSTOM_FOLD = (
    "**What runs**: each role on the core forward where it covers the architecture (Llama, Qwen2, Mistral), "
    "else Hugging Face's; `python -m pyramid_demo prepare --models …` records its checks on this machine."
)
HOW = (
    "**How it works**: the draft guesses a few tokens; in a pyramid the qualifier checks them first and passes on "
    "a block; the target checks what reaches it in one pass, keeps what it agrees with and adds one token of its "
    "own. SD (and PSD_A with stage-2 rule sd) is lossless: at temperature 0 it writes exactly AR's text, provided "
    "the target's multi-token passes give bitwise the logits of one-token steps here. Setup measures that on a "
    "CPU; its figures are below."
)


def model_name(ref: str, role: str, target: str) -> str:
    """A model in words: the offline family's models by what they are, a Hub id by its last part."""
    if role != "target" and ref == target:
        return "the target itself"
    if ref in KNOWN:
        return KNOWN[ref]
    base, _, quant = ref.partition("@")
    return f"the target's own {quant[:4]} copy" if quant and base == target else ref.rstrip("/").rsplit("/", 1)[-1]


def box(p: Preset) -> str:
    """The three lines beside the prompt: the models, where they run, memory."""
    names = [model_name(ref, role, p.target) for ref, role in zip(p.refs, ("draft", "qualifier", "target"))]
    models = f"**Draft** {names[0]} → **qualifier** {names[1]} → **target** {names[2]}"
    runs = ("Runs offline" if not p.hub else "Downloads from the Hub") + (" · gated: needs a token" if p.gated else "")
    return f"{models}  \n{runs}  \nAbout {2 * p.memory_gb:g} GB as fp32 on a CPU, {p.memory_gb:g} GB at 16-bit"


def record_text(rec: dict[str, Any] | None) -> str:
    """This machine's measured record in words: whether each role's many-row passes equal its one-row steps."""
    if not rec:
        return (
            "not measured on this machine yet (`python -m pyramid_demo prepare` measures it; setup runs it): "
            "whether SD writes exactly AR's text here is not assumed"
        )
    target = rec["checks"]["target"]
    rest = "; ".join(
        f"{r}: {c['bitwise_passes']}/{c['passes']} passes bitwise equal, max |Δlogit| {c['max_abs_diff']:.2g}"
        for r, c in rec["checks"].items()
        if r != "target"
    )
    trees = describe_trees(target)
    return f"target: {describe(target)}" + (f"; {trees}" if trees else "") + (f"  \n{rest}" if rest else "")


def fold(preset: str, p: Preset, triplet: Any | None) -> str:
    """The fold: how it works, the full ids and description, memory, what runs and this machine's record."""
    need = f"about {p.memory_gb:g} GB at 16-bit ({2 * p.memory_gb:g} GB as fp32 on a CPU)"
    parts = [
        HOW,
        f"**This family**: `{p.draft}` → `{p.qualifier}` → `{p.target}`  \n{p.description}  \nMemory: {need}  \n"
        + hosting.memory_line(preset),
    ]
    if triplet is not None:
        from ..models.runtime import cpu_class, family_record

        parts.append(f"**What runs here** ({triplet.machine or cpu_class()}): {triplet.runs}")
        parts.append("**Measured on this machine**: " + record_text(family_record(triplet)))
    else:
        parts.append(
            "**What runs here** is decided when the family loads: each role's compiled pass where setup built "
            "one for these weights and it agrees with the eager pass, else the eager core pass."
        )
    if p.tuned:
        parts.append(f"**Tuned settings** ({p.tuned_how}): " + " · ".join(f"{k} {v}" for k, v in p.tuned))
    return "\n\n".join(parts)


def texts(preset: str) -> tuple[str, str]:
    """(the box, the fold) for a preset name as it runs on this install (the fold's record once it has loaded)."""
    from ..models.loading import loaded

    p = as_run(PRESETS[preset])  # what runs on this install (the offline draft may read the target)
    return box(p), fold(preset, p, loaded(preset))
