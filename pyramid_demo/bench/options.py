"""`bench`'s command line and the columns of its rows (results.csv), apart from the loop that runs them (`runner`)."""

from __future__ import annotations

import argparse
import sys

from .. import generate_cli
from ..core.methods import METHODS, SOLO_ROLES
from ..core.settings import SHAPES
from ..spec_bench import TASKS
from . import peers, spec_suite
from .variants import GRID_TAUS

ROW_COLUMNS = """
repeat prompt_index category variant method kind solo lossless
temperature gamma l_d l_q tau_q tau_t divergence div_support fallback stage2 qualifier_prompt conf_stop lookup_first
shape shape_why tree_nodes tree_depth tree_k prompt_tokens n_new_tokens stopped prefill_s decode_s wall_s
tokens_per_s tokens_per_s_incl_prefill tokens_per_s_wall
speedup_vs_ar speedup_vs_sd speedup_vs_ar_wall speedup_vs_sd_wall
acceptance_qualifier acceptance_target proposed_qualifier accepted_qualifier proposed_target accepted_target
rounds_qualifier rounds_target target_passes mean_accepted_per_target_pass tokens_per_target_pass
fwd_draft fwd_qualifier fwd_target fwd_time_draft_s fwd_time_qualifier_s fwd_time_target_s
engine_overhead_s engine_overhead_share agreement prefix_agreement target_logprob
predicted_tokens_per_s predicted_plus_one_tokens_per_s predicted_profile_tokens_per_s
csqa_answer csqa_pred csqa_correct prompt text
""".split()  # results.csv's columns, in order


# ---------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    generate_cli.add_decoding_arguments(p)  # generate's decoding options, not a copy of them
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument(
        "--shapes",
        help=f"comma-separated proposal shapes, from {', '.join(SHAPES)}: each method that proposes runs "
        "once per shape, side by side (default: --shape's one)",
    )
    p.add_argument(
        "--solo",
        metavar="ROLE",
        help=f"add a reference row: that member decoding alone, as AR does with the target, its agreement "
        f"with AR's text reported like the others' (choose from {', '.join(SOLO_ROLES)}; the offline "
        "family's qualifier is the target's int4 copy)",
    )
    p.add_argument(
        "--peers",
        help="baselines on the same models ('none' to skip), from " + ", ".join(peers.PEERS) + " (default: "
        f"{peers.DEFAULT_PEERS}; with --suite also hf_prompt_lookup, as Spec-Bench's table has PLD)",
    )
    p.add_argument(
        "--prompts", default="builtin", help="'builtin' (20 varied prompts) or a JSONL file of {\"prompt\": ...} lines"
    )
    p.add_argument("--limit", type=int, help="use only the first N prompts (default: all; 3 with --grid)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs of every method on every prompt")
    p.add_argument(
        "--grid",
        action="store_true",
        help="sweep τ_T, τ_Q ≤ τ_T, ℓ_D and ℓ_Q and report the speed–quality Pareto frontier",
    )
    p.add_argument("--grid-taus", default=",".join(map(str, GRID_TAUS)), help="τ values for --grid")
    p.add_argument("--grid-l-d", default="2,4", help="ℓ_D values for --grid")
    p.add_argument("--grid-l-q", default="8,12", help="ℓ_Q values for --grid (pairs with ℓ_D ≤ ℓ_Q)")
    p.add_argument(
        "--dataset",
        choices=("csqa",),
        help="CommonsenseQA with the FSD 5-shot chain-of-thought prompt; reports accuracy",
    )
    p.add_argument("--dataset-file", help="local CSQA JSONL (the Hub is tried only without it)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="new tokens in each method's warm-up run")
    p.add_argument("--out", default="bench_out", help="directory for results.csv, results.json, report.html")
    p.add_argument(
        "--max-minutes",
        type=float,
        help="time budget: start no new prompt after this many minutes; completed prompts are kept",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: torch's choice); 1 is often faster on a busy CPU",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # prompt lookup's settings, named neutrally so that an engine proposer may share them
    p.add_argument(
        "--pld-tokens",
        type=int,
        default=peers.PLD_TOKENS,
        help=f"hf_prompt_lookup: tokens proposed per round, copied from the context (default {peers.PLD_TOKENS})",
    )
    p.add_argument(
        "--pld-ngram",
        type=int,
        default=peers.PLD_NGRAM,
        help=f"hf_prompt_lookup: longest n-gram of the context's end matched to find them (default {peers.PLD_NGRAM})",
    )
    p.add_argument(
        "--suite",
        choices=("spec-bench",),
        help="spec-bench: Spec-Bench's six tasks (Xia et al. 2024; its 480 questions ship in assets/spec_bench) in "
        "place of --prompts. Greedy, as Spec-Bench is: a --temperature above 0 is refused. MT-bench's second turn "
        "runs after each method's own first answer, through the chat template. Adds Spec-Bench's table (speed-up "
        "over AR per task, #Mean Accepted Tokens, Overall) and per-position acceptance to the report; needs ar in "
        "--methods",
    )
    p.add_argument(
        "--per-task",
        type=int,
        help=f"with --suite: N questions per task, a seeded selection (seed {spec_suite.SEED}; MT-bench's spread over "
        "its eight categories) named in the report (default: all 80)",
    )
    p.add_argument(
        "--tasks",
        help=f"with --suite: comma-separated Spec-Bench tasks, from {', '.join(TASKS)} (default: all)",
    )


def command_line(args: argparse.Namespace) -> str:
    """The command as typed when run from the shell, else rebuilt from the parsed options."""
    if sys.argv[1:2] == ["bench"]:
        return "python -m pyramid_demo " + " ".join(sys.argv[1:])
    opts = [
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items()
        if k != "command" and v not in (None, False)
    ]
    return "python -m pyramid_demo bench " + " ".join(opts)
