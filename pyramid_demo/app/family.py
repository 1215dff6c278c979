"""The family box beside the prompt (at most three plain lines for students: the models, SD's exactness here,
where it runs) and the closed fold under it with the probe's figures, ids, memory and tuned settings."""
from __future__ import annotations

import re
from typing import Any

from ..models.presets import BUNDLED_TARGET, FEATURE_DRAFT, PRESETS, Preset
from . import hosting

BOX_LINES, BOX_CHARS = 3, 300  # the box's budget: lines and visible characters
FOLD_TITLE = "How it works · exactness on this machine"
KNOWN = {  # the offline family's references, in words
    FEATURE_DRAFT: "a one-layer draft that reads the qualifier",
    BUNDLED_TARGET + "@int4": "the target's own int4 copy",
    BUNDLED_TARGET: "SmolLM2-135M-Instruct (bundled)",
}
CUSTOM_BOX = ("**Custom family**: three Hugging Face ids or local paths of causal LMs that share one tokenizer, "
              "smallest first.  \nThey download on the first run; the race's note says whether SD matches AR exactly.")
CUSTOM_FOLD = ("**Exactness** is checked when a custom family loads (on a CPU, by the same probe as the presets); "
               "a note above the race says when SD and lossless PSD_A may differ from AR.")
HOW = ("**How it works**: the draft guesses a few tokens; in a pyramid the qualifier checks them first and passes on "
       "a block; the target checks what reaches it in one pass, keeps what it agrees with and adds one token of its "
       "own. SD (and PSD_A with stage-2 rule sd) is lossless: at temperature 0 it writes exactly AR's text, provided "
       "the target's multi-token passes give bitwise the logits of one-token steps here. A probe checks that on a "
       "CPU; its figures are below.")


def model_name(ref: str, role: str, target: str) -> str:
    """A model in words: the offline family's models by what they are, a Hub id by its last part."""
    if role != "target" and ref == target:
        return "the target itself"
    if ref in KNOWN:
        return KNOWN[ref]
    base, _, quant = ref.partition("@")
    if quant and base == target:
        return f"the target's own {quant[:4]} copy"
    return ref.rstrip("/").rsplit("/", 1)[-1]


def exact_line(choice: Any) -> str:
    """Whether SD writes exactly AR's text on this machine, in one line (from the probe's cached choice)."""
    if choice is None:
        return "Whether SD writes exactly AR's text here is checked when the family first loads on a CPU."
    if choice.exact is None:
        return "Not checked on this machine: SD may differ from AR's text at near-ties."
    if not choice.exact:
        return ("⚠ On this machine SD may differ from AR's text at near-ties (checking many tokens at once rounds "
                "differently).")
    trees = " (tree lanes may differ at near-ties)" if choice.tree_exact is False else ""
    return f"✓ On this machine SD writes exactly AR's text at temperature 0{trees}."


def box(p: Preset, choice: Any) -> str:
    """The three lines beside the prompt: the models, SD's exactness here, where it runs."""
    names = [model_name(ref, role, p.target) for ref, role in zip(p.refs, ("draft", "qualifier", "target"))]
    models = f"**Draft** {names[0]} → **qualifier** {names[1]} → **target** {names[2]}"
    runs = ("Runs offline" if not p.hub else "Downloads from the Hub") + (" · gated: needs a token" if p.gated else "")
    fp32 = choice is not None and choice.dtype == "float32"  # a CPU runs the target at its reference precision
    mem = f"about {2 * p.memory_gb:g} GB as fp32" if fp32 else f"about {p.memory_gb:g} GB at 16-bit"
    return f"{models}  \n{exact_line(choice)}  \n{runs} · {mem}"


def fold(preset: str, p: Preset, choice: Any) -> str:
    """The fold: how it works, the full ids and description, memory, the probe's choice and figures, tuned settings."""
    need = f"about {p.memory_gb:g} GB at 16-bit ({2 * p.memory_gb:g} GB as fp32 on a CPU)"
    parts = [HOW,
             f"**This family**: `{p.draft}` → `{p.qualifier}` → `{p.target}`  \n{p.description}  \nMemory: {need}  \n"
             + hosting.memory_line(preset),
             "**Exactness on this machine** (CPU probe): " + (choice.summary if choice else
                                                              "dtype, backend and forward are probed, and their "
                                                              "exactness checked, on the first run (several seconds)")]
    from ..models.loading import loaded_kernels

    kernels = loaded_kernels(preset)
    if kernels:
        parts.append(f"**Kernels** (the fastest timed on this CPU): {kernels}")
    if p.tuned:
        parts.append("**Tuned settings** (measured with `bench`): " + " · ".join(f"{k} {v}" for k, v in p.tuned))
    return "\n\n".join(parts)


def visible(markdown: str) -> str:
    """The text a reader sees of a Markdown snippet (bold marks and line-break spaces removed)."""
    return re.sub(r"\*\*|`|  \n", lambda m: "\n" if m.group(0) == "  \n" else "", markdown)


def texts(preset: str) -> tuple[str, str]:
    """(the box, the fold) for a preset name as it runs on this install."""
    from ..models.offline import as_run
    from ..models.probe import cached_choice

    p = as_run(PRESETS[preset])  # what runs on this install (the offline draft may read the target)
    choice = cached_choice(preset)  # the choice and its exactness; the probe's timings are in its table
    return box(p, choice), fold(preset, p, choice)
