"""Every user-facing string and default of the app (the decoding settings' own: `core.settings`, beside the CLI's)."""

from __future__ import annotations

import os

from ..core.methods import METHOD_SHORT, METHODS, DecodeConfig
from ..models.presets import DEFAULT_PRESET, PRESETS, family_config, tuned_settings
from ..spec_bench import TITLES, Question, question

CUSTOM = "custom"
PRESET_ENV = "PYRAMID_DEMO_PRESET"  # lets tests and hosts pick the preset shown first
DEFAULT = DecodeConfig()  # the single source of decoding defaults (temperature 0: greedy)
START_PRESET = os.environ.get(PRESET_ENV, DEFAULT_PRESET)
if START_PRESET not in PRESETS:
    START_PRESET = DEFAULT_PRESET
START = family_config(START_PRESET)  # the starting family's tuned settings: the page's first values
PRESET_CHOICES = [*PRESETS, CUSTOM]
RACE_METHODS = METHODS  # timed in this order, one after another, then replayed together
_SHORT = [METHOD_SHORT[m] for m in RACE_METHODS]  # "AR", "SD", ...
_NAMES = ", ".join(_SHORT[:-1]) + " and " + _SHORT[-1]

OWN_PROMPTS = (
    "Explain in two sentences why the sky is blue.",  # the prompt box's default: short, so a first race is quick
    "Write a short poem about a cat who learns to code.",
)
# one Spec-Bench question of each task, by id (`spec_bench.question`), so a learner sees where guesses pass by task;
# summarization and RAG are among the file's shortest of their task, the others near their task's usual length
SPEC_BENCH_EXAMPLES = {
    "mt_bench": 86,  # writing: a descriptive paragraph (MT-bench's first turn)
    "translation": 168,
    "summarization": 277,
    "qa": 322,
    "math_reasoning": 403,
    "rag": 482,
}
NOT_SPEC_BENCH = "—"


def task_label(q: Question) -> str:
    """A question's task as the page names it; MT-bench's with its category, since writing and coding differ."""
    return TITLES[q.task] if q.category == q.task else f"{TITLES[q.task]} · {q.category}"


# (prompt, its Spec-Bench task as shown beside it), in the Examples widget's order
EXAMPLES = [(p, NOT_SPEC_BENCH) for p in OWN_PROMPTS] + [
    (q.turns[0], task_label(q)) for q in map(question, SPEC_BENCH_EXAMPLES.values())
]
EXAMPLE_PROMPTS = [p for p, _ in EXAMPLES]

# the Statistics tab, when a race's prompt is a Spec-Bench question: what its task asks of a draft, from what it is
SPEC_BENCH_LINE = "**Prompt**: Spec-Bench question {id} ({task}{turn}). {note} Race another task's example to compare."
FIRST_TURN = ", its first turn"
TASK_NOTES = {
    "mt_bench": "An open request: the answer is new text that the prompt does not hold, so the draft guesses only "
    "from how such text usually goes.",
    "translation": "The answer rewrites the prompt's German sentence in English: it follows the prompt's meaning but "
    "copies few of its words.",
    "summarization": "The answer restates a long article in a few sentences, often with its names and phrases: a "
    "draft that reads the article (prompt lookup copies from it) finds copied spans easy guesses.",
    "qa": "A short factual question: the answer is a fact from the models' memory, not in the prompt, and short; a "
    "small draft may not know the fact the target does.",
    "math_reasoning": "A word problem worked step by step: the steps repeat the problem's numbers in set phrases, but "
    "each computed result is a token a small draft may get wrong.",
    "rag": "Retrieved passages, then a question answered from them: as in summarization, the answer can copy from "
    "the long prompt.",
}

LABELS = {
    "preset": "Model family (draft → qualifier → target)",
    "prompt": "Prompt",
    "examples": "Example prompts: two short ones, then one of each Spec-Bench task",
    "task": "Spec-Bench task",
    "draft": "Draft model id",
    "qualifier": "Qualifier model id",
    "target": "Target model id",
    "side_by_side": "Chain vs tree side by side",
    "qualifier_alone": "Add a reference lane: the qualifier alone",
    "trace": "Trace (JSON)",
    "table": "Race results (CSV)",
    "race_page": "Race as a web page (HTML)",
}
EXPORT_NOTE = (
    "Download every race of this session: the full step trace as JSON, the race table as CSV, and **the race as a "
    "web page**: one file that replays every lane at its measured speed and plays any target pass beat by beat in "
    "any browser, offline (no Python, no models, no network): for a classroom or a message."
)

WHATIF_LABELS = {"tau_q": "what-if τ_Q (stage 1 rounds)", "tau_t": "what-if τ_T (target round)"}

INFO = {
    "tuned": "Changing the family resets these settings to the ones it is tuned for (see the README).",
    "side_by_side": "Race SD, FSD, PSD_A and PSD_F twice: once proposing a chain, once a tree of candidates "
    "(the tree settings below), so you see which shape pays on this machine. Off: one lane "
    "per method, its shape as the Proposal shape setting says.",
    "qualifier_alone": "Also race the qualifier decoding alone, as AR does with the target (in the offline "
    "family it is the target's own int4 copy): the speed a pyramid comes near, and the token "
    "where its text leaves the target's. A reference, not a contender: it never wins the race.",
}

ORIGIN_NAMES = {
    "draft": "draft token, accepted at every stage",
    "qualifier": "qualifier's token (in a pyramid: accepted by the target)",
    "target": "target's own token",
    "bonus": "target's bonus token (whole proposal accepted)",
}
STATUS_NAMES = {
    "accepted": "accepted",
    "rejected": "rejected (tried and refused)",
    "discarded": "discarded (never reached, or cut)",
    "resampled": "verifier's replacement",
    "bonus": "verifier's bonus",
}

BUTTONS = {
    "run": "▶ Run race",
    "stop": "■ Stop",
    "clear": "Clear all",
    "export": "Prepare downloads",
    "play": "▶ Play",
    "pause": "❚❚ Pause",
    "back": "◀ Step back",
    "forward": "Step forward ▶",
}
SETTINGS_TITLE = "Decoding settings: γ, ℓ_D, ℓ_Q, τ_Q, τ_T, temperature, divergence and the CHOICE options"
TABS = {
    "race": "Race",
    "inspect": "Step inspector",
    "stats": "Statistics",
    "explain": "How it works",
    "export": "Export",
}
INTRO = (
    "# ▲ PyramidSD Explorer\nA small **draft** guesses, a mid-sized **qualifier** filters, a large "
    f"**target** verifies. Press **{BUTTONS['run']}** to watch five decoding methods write the same answer."
)

MSG = {
    "loading": "⏳ Loading the {preset} models (first run only; later runs reuse them)…",
    "warming": "🏁 Race {n}: warming up each of its {k} lanes (short untimed runs, as the bench does)…",
    "running": "🏁 Race {n}: running quietly, nothing drawn while a lane is timed: decoding {label}, {i} of {total} "
    "(repeat {r})…",
    "setup": "One-time costs, in no lane's time: load {load:.1f} s · warm-up of every model {warm:.2f} s.",
    "done": "✅ Race {n} finished: every lane timed {k}× with nothing drawn, now replayed at its measured speed. "
    "▶ Play any target pass below the lanes or in the " + TABS["inspect"] + " tab to see why tokens were kept.",
    "stopped": "⏹ Race {n} stopped. Partial results are kept; press " + BUTTONS["run"] + " to start again.",
    "not_exact": "⚠ SD and lossless PSD_A may differ from AR at near-ties here ({why}): the agreement column "
    "says where they did.",
    "why_unchecked": "exactness was not checked",
    "why_inexact": "the target's passes are not bitwise exact on this machine",
    "chains_only": "These models propose chains only (prompt lookup proposes one chain; HF's forward over sliding "
    "windows verifies chains), so only the chain lanes race.",
    "trees_not_exact": "⚠ The tree lanes may differ from AR at near-ties here (tree passes are not bitwise exact on "
    "this machine); the chain lanes are exact.",
    "winner": "  \n🏆 **{label}** won: {figures}, beyond the noise band ({noise:.0%}).",
    "tie": "  \n🤝 Tie within this race's noise band ({noise:.0%}): **{labels}**; {label} measured fastest at "
    "{figures}.",
    "winner_unsure": "  \n🏆 **{label}** was fastest: {figures} (too few forwards and repeats to measure the noise "
    "band, so a small gap may be chance).",
    "queued": "⏳ Another race is running on this machine (yours or another visitor's). Races run one at a time, so "
    "each lane is timed alone; yours starts when it ends…",
    "stopping": "⏹ Stopping after the current target pass…",
    "stopped_early": "⏹ Stopped before the race began.",
    "custom_missing": "Custom models need all three ids (draft, qualifier, target) from one family.",
    "bad_settings": "Settings problem: {err}",
    "bad_prompt": "Prompt problem: {err}",
    "load_failed": "Could not load the models: {err}",
    "run_failed": "The run failed: {err}. The app is still running; try other settings.",
    "no_race": "Run a race first: the inspector shows its recorded rounds.",
    "ar_round": "AR has no drafts: each target pass makes exactly one token, so there is nothing to accept.",
    "cleared": "Results cleared.",
    "idle": f"Press **{BUTTONS['run']}** to time {_NAMES} on the same prompt, one after another with nothing drawn, "
    "then watch them replay side by side at their measured speeds.",
    "play_none": "Run a race first: then ▶ Play replays any target pass of it, step by step.",
    "play_lane": "Race {race} has no such lane: pick one of {lanes}.",
    "same_text": "writes {ref} for all {n} tokens",
    "leaves_text": "leaves {ref} at token {k}",
    "ends_early": "writes {ref} for its {n} tokens, then ends while {ref} goes on",
    "goes_on": "writes {ref} for all {n} tokens, then goes on past its end",
    "ref_greedy": "the target's text",
    "ref_sampled": "AR's sampled text",
    "play_range": "Target pass {n} is out of range: this run made {total} target pass(es), numbered 1 to {total}.",
}

RACE_COLUMNS = [
    "race",
    "method",
    "repeats",
    "tokens",
    "time (s)",
    "tok/s",
    "× AR",
    "× SD",
    "acceptance",
    "tokens / target pass",
    "agreement (T=0)",
    "stopped",
]

EXPLANATION = f"""
### How three models share the work
* **AR** — the **target** model alone writes one token per forward pass. This is the baseline.
* **SD** (speculative decoding) — a small **draft** guesses γ tokens; the target checks all of them in
  **one** pass and keeps the longest prefix it agrees with (greedy: same token; sampling: ratio test), then
  adds one token of its own. Lossless: the text is exactly what the target alone would write.
* **FSD** (fuzzy SD) — keeps a drafted token while the **divergence** between the target's and the draft's
  next-token distributions is ≤ τ, even if the token differs. Faster, slightly lossy; τ sets the trade-off.
* **PSD** (pyramid SD) — a mid-sized **qualifier** sits in between. Stage 1: the draft writes ℓ_D tokens
  and the qualifier checks them (PSD_F: divergence ≤ τ_Q; PSD_A: the exact SD rule) until a block of ℓ_Q
  tokens is ready. Stage 2: the target checks the block in one pass with divergence ≤ τ_T against the
  **qualifier's** distributions, keeps the leading run, and adds one token of its own.
* **Which proposer reads what** — an independent draft or qualifier reads only the tokens, like the
  target. A draft that **reads its verifier** (EAGLE-style; the offline family's) also reads the final
  hidden state of the model it proposes to — the qualifier in a pyramid, the target in SD — at every position
  that model has already scored, which each verification pass computes anyway; where it drafts ahead it reads
  the state it predicted itself. The acceptance rules are the same, so SD with it is still lossless.
* **Prompt lookup as the draft** (the `smollm2-offline-pld` family, or `pld` in a custom family's draft or
  qualifier box) — no model at all: it looks for the latest earlier place where the text's last 3 tokens (else 2,
  else 1) occurred, in the prompt or the answer so far, and proposes what followed there. It costs nothing and
  passes where the answer copies (a summary's names, a repeated phrase), rarely where it writes anew. Its guess
  is a certainty (probability 1 on one token), so the exact rule stays lossless, while a fuzzy rule compares
  the verifier with a certainty: under `js` the divergence is +∞ unless the verifier is certain too, so τ passes
  nothing and the fuzzy fallback decides; under `kl` it is −log p(token), so τ accepts a token the verifier
  gives at least e^−τ; under `tv` it is 1 − p(token).
* **Prompt lookup before the draft** (the slider "Prompt lookup before the draft") — a draft model that proposes
  only where the text does not repeat: where the text's last tokens (at least as many as the slider says)
  occurred before, the lookup's copy is proposed with no model pass, and the model drafts elsewhere. In the
  inspector, a draft token with probability exactly 1 came from the lookup.
* **A quantized copy as the qualifier** — the offline qualifier is the target itself with quantized weights
  (int4, or fp16 where that runs faster on this CPU), built at load. It agrees with the target almost always,
  at about half a target step's cost, so long blocks reach the target and pass whole: the pyramid runs near the
  copy's speed yet, with the exact stage-2 rule, writes the target's text. Tick "the qualifier alone" to race
  the copy by itself and see where its own text leaves the target's.

* **Trees of candidates** — instead of one guess per position the proposer offers a few (a tree: each
  candidate's parent is the token before it). The verifier checks the whole tree in **one** pass and keeps
  one path through it: at each position it takes a candidate (the rule's test) or, when none passes, writes
  its own token there. A chain is the tree with one candidate per position. The inspector lays every round
  along its positions: the kept path on top, the other candidates at each position below it; the position
  slider walks that path. *Acceptance* counts positions: a tree of 7 candidates over 3 positions whose path
  is 2 long accepted 2 of 3 (not 2 of 7).

* **The qualifier alone** (the switch beside the Run button) — a reference lane: the qualifier decodes by
  itself, as AR does with the target (in the offline family it is the target's own int4 copy). It shows the
  speed a pyramid comes near, and the token where its text leaves the target's: the pyramid's target pass is
  what keeps the pyramid on the target's text. It never wins the race.

* **▶ Play a pass** — below the race's lanes and in the inspector, one recorded target pass is replayed step by
  step: the guesses appear, each check marks them ✓ or ✗ and says why (the divergence against τ, or the exact
  rule), the verifier's own token lands and the committed text grows. It replays the record: no model runs.

### Reading the colours
<span style="background:#cdeedd;padding:2px 6px;border-radius:4px">green</span> {ORIGIN_NAMES["draft"]} ·
<span style="background:#d3e6f8;padding:2px 6px;border-radius:4px">blue</span> {ORIGIN_NAMES["qualifier"]} ·
<span style="background:#fde3c0;padding:2px 6px;border-radius:4px">orange</span> {ORIGIN_NAMES["target"]} ·
<span style="background:#f2d6ec;padding:2px 6px;border-radius:4px">pink</span> {ORIGIN_NAMES["bonus"]}.
The more green and blue, the less work the big target had to do.

### Choices this demo makes (where the papers are vague)
* Divergences use the **raw** distributions (softmax at temperature 1), whatever the sampling temperature.
* `js` is the FSD reference code's form ½KL(m‖p)+½KL(m‖q), m=(p+q)/2 — not the textbook JSD — so the
  papers' τ grid (0.2–0.5) means the same here. `kl` is KL(q‖p), `tv` is total variation.
* The PSD block is cut to exactly ℓ_Q tokens, and the qualifier's own tokens count toward ℓ_Q.
* τ = 0 accepts **no** drafted token by divergence (not "Div ≤ 0", which a near-tie rounding to 0 would
  pass with a token the target would not pick): the verifier then makes every token itself.
* "Agreement (T=0)" is the share of the target's greedy tokens (the AR lane at temperature 0) that a method
  reproduces at the same positions, the same figure the benchmark reports; blank when sampling.
* Options beyond the papers: **fuzzy fallback = sd** also accepts tokens the exact SD rule accepts;
  **stage-2 rule = sd** makes PSD_A lossless (a three-model cascade); **stop proposing below
  confidence** lets the draft stop early when it is unsure (and ends a PSD block after an unsure
  qualifier token), so γ, ℓ_D and ℓ_Q become maxima.
* Each family starts from the settings it was measured best with (the offline family:
  {", ".join(f"{k} {v}" for k, v in tuned_settings("smollm2-offline").items())}); a custom family starts from
  the papers' settings.
* "Tokens / target pass" counts the target's own token; "accepted" counts drafted tokens only.
* Lossless is checked, not assumed: whether the target's verification passes give bitwise the logits of
  one-token steps on this machine is measured, not taken for granted. Where they do, SD and lossless PSD_A write
  AR's exact text; where they do not (or it was not measured), a note under the finished race, beside the
  "agreement" column, says they may differ from AR at near-ties.
* What speculation can win here is in the **Statistics** tab: the cost of one forward of k tokens for each
  model, and the acceptance each method needs to break even against AR. On the offline family, checking 5
  tokens costs the target about what one step does, so acceptance — how well the draft and the int4 copy match
  the target — decides who wins.
* Times exclude the prompt's prefill; speed-ups compare methods on the same prompt in the same race.
* **How the race is timed** — as `bench` times it: each lane warmed up, then decoded with nothing drawn while its
  clock runs (the page shares the machine's cores), the lanes taking turns over a few repeats; then they replay
  side by side, each token when its method produced it. Speeds are medians over repeats; a method is called faster
  only beyond the noise band (the spread of its ratio to AR over the repeats ÷ √repeats). Race again to add repeats.
"""

TREE_NOTE = (
    "**The pass as a tree of candidates** (a chain is a tree with one branch): the accepted path runs "
    "along the top, branches the verifier refused (×) or never reached (hollow) hang below, and the grey "
    "strip shows the verifier's own top-1 at each position. Hover a node for p, q and Div."
)

PLAY_NOTE = (
    "**▶ Play a pass**: one recorded target pass, step by step — the guesses, each check (✓ kept, ✗ refused) "
    "and why, the verifier's own token, the text committed. No model runs: it replays the record."
)

STATS_NOTE = (
    "Each method's measured speed against AR (the median over the race's repeats; a gap within its noise band is a "
    "tie), and what the **cost profile** — this machine's measured cost of one forward of k tokens per model — "
    "predicts for the same forwards on an idle machine. When the race's forwards ran slower than the profile, the "
    "factor says by how much."
)
