"""`generate`: one method on one prompt; a coloured summary, or `--json` for machines."""

from __future__ import annotations

import argparse
import json
import sys

from . import hardware_cli
from .core.methods import METHODS, DecodeConfig, method_spec
from .core.run import generate, takes_trees
from .core.settings import SETTINGS, TUNABLE
from .models.presets import DEFAULT_PRESET, PRESETS, family_config
from .models.warm import cost_profile
from .predict.expected import resolve_shape

COLOURS = {"draft": "\033[32m", "qualifier": "\033[34m", "target": "\033[33m", "bonus": "\033[35m"}
RESET = "\033[0m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    # checked by DecodeConfig, so that a bad or retired key is refused in one `error:` line (not argparse's usage)
    p.add_argument("--method", default=DecodeConfig().method, metavar="{" + ",".join(METHODS) + "}")
    p.add_argument("--prompt", required=True)
    add_decoding_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids, stats, steps")


def add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    """Models and decoding settings, shared by `generate` and `bench`."""
    d = DecodeConfig()
    p.add_argument(
        "--models",
        default=DEFAULT_PRESET,
        help=f"preset name (default {DEFAULT_PRESET}; {', '.join(p for p in PRESETS if p != DEFAULT_PRESET)}) "
        "or three comma-separated model ids/paths: draft,qualifier,target ('pld' or 'pld:N' in the draft or "
        "qualifier slot: prompt lookup, no model, longest n-gram N, 3 by default)",
    )
    p.add_argument("--no-chat", action="store_true", help="do not apply the target's chat template")
    for s in SETTINGS:  # one option per row: --max-new-tokens, --tau-t, ...
        default = getattr(d, s.name)
        kw = {"choices": s.choices} if s.choices else {"type": type(default)}
        text = (s.cli or s.info or "").replace("%", "%%")
        if s.tunable:  # None: the family's tuned value applies (config_from_args)
            kw["help"], default = f"{text} (default: the family's tuned value, else {default})", None
        elif text:
            kw["help"] = text
        p.add_argument("--" + s.name.replace("_", "-"), default=default, **kw)
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: best available)")
    p.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16 or float16 (default: the reference precision "
        "fp32 on a CPU; bf16 on CUDA (fp16 without bf16), fp16 on MPS)",
    )
    hardware_cli.add_arguments(p)  # --device-map, --quantize, --estimate-only


def config_from_args(a: argparse.Namespace) -> DecodeConfig:
    """Options given on the command line, else the preset's tuned settings, else DecodeConfig's."""
    given = {k: getattr(a, k) for k in TUNABLE if getattr(a, k, None) is not None}
    per_run = {s.name: getattr(a, s.name) for s in SETTINGS if not s.tunable}
    return family_config(a.models, **given, **per_run, method=a.method)


def summary(result) -> str:
    """A readable, coloured account of one run for the terminal."""
    s = result.stats
    coloured = "".join(COLOURS[o] + t + RESET for t, o in zip(result.token_texts, result.origins))
    legend = "  ".join(COLOURS[o] + o + RESET for o in COLOURS)
    acc = ", ".join(f"{k} {v:.0%}" for k, v in s.acceptance.items()) or "n/a"
    return "\n".join(
        [
            f"{result.method} on {', '.join(result.models)}; {result.shape_why}",
            coloured,
            "",
            f"colours: {legend}",
            f"{s.n_new_tokens} tokens in {s.decode_s:.2f} s = {s.tokens_per_s:.1f} tok/s "
            f"(prefill {s.prefill_s:.2f} s, stopped: {s.stopped})",
            f"target passes {s.target_passes}; tokens per target pass {s.tokens_per_target_pass:.2f} "
            f"(drafted tokens accepted per pass {s.mean_accepted_per_target_pass:.2f}, bonus not counted)",
            f"acceptance: {acc}; accepted-length histogram {s.accepted_hist}",
            "forward passes: "
            + ", ".join(f"{k} {v} ({s.forward_time_s[k]:.2f} s)" for k, v in s.forward_passes.items()),
        ]
    )


def run(args: argparse.Namespace) -> int:
    from .models.loading import LoadError  # the loader only when a run needs it

    try:
        cfg = config_from_args(args)
        triplet = hardware_cli.load(args)
        if triplet is None:  # --estimate-only
            return 0
        cfg, why = resolve_shape(cfg, shape_profile(triplet, cfg), takes_trees(triplet, cfg.method))
        result = generate(triplet, args.prompt, cfg, chat=not args.no_chat, shape_why=why)
    except (ValueError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if triplet.note and not args.json:
        print(f"note: {triplet.note}", file=sys.stderr)
    print(f"note: {triplet.runs}", file=sys.stderr)
    if forwards := ", ".join(f"{r} {f}" for r, f in result.forwards.items()):
        print(f"note: this run's forwards: {forwards}", file=sys.stderr)
    if not args.json:
        print(summary(result))
        return 0
    record = {  # the run's record plus how it ran (`exact`: None if unmeasured)
        **result.to_dict(),
        "dtype": str(triplet.dtype).removeprefix("torch."),
        "runs": triplet.runs,
        "exact": triplet.exact,
        "exact_note": triplet.exact_note,
    }
    print(json.dumps(record))
    return 0


def shape_profile(triplet, cfg: DecodeConfig) -> dict | None:
    """The cost profile shape "auto" is resolved from (cached, else measured now); None when not needed or had."""
    if cfg.shape != "auto" or not method_spec(cfg.method).shaped:
        return None
    try:
        return cost_profile(triplet, measure_now=True)
    except Exception as e:  # noqa: BLE001 - without a profile "auto" takes the chain and says so
        print(f"note: no cost profile ({e!r}): shape auto takes the chain", file=sys.stderr)
        return None
