"""Hardware options shared by `generate` and `bench`: placement, quantisation, the memory estimate before loading."""

from __future__ import annotations

import argparse
import sys
from typing import Any

PROMPT_ALLOWANCE = 512  # tokens a bench prompt plus chat template may take (a given prompt is measured)
LOOKAHEAD = 32  # drafted tokens a cache may hold beyond the committed text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device-map",
        choices=("auto",),
        default=None,
        help="'auto': accelerate spreads each model over every visible GPU and offloads the rest "
        "to CPU RAM (default: everything on --device)",
    )
    p.add_argument(
        "--quantize",
        choices=("8bit", "4bit"),
        default=None,
        help="load Hub/custom models with 8- or 4-bit weights (needs bitsandbytes and CUDA)",
    )
    p.add_argument(
        "--estimate-only",
        action="store_true",
        help="print the family's memory estimate (from configs, nothing loaded) and exit",
    )


def max_len(args: argparse.Namespace) -> int:
    """The longest sequence a run holds: the prompt (≤ a token a character, plus template), new tokens, look-ahead."""
    prompt = getattr(args, "prompt", None)  # generate's --prompt (bench has none)
    head = len(prompt) + 64 if prompt else PROMPT_ALLOWANCE
    return head + args.max_new_tokens + LOOKAHEAD


def load(args: argparse.Namespace) -> Any | None:
    """Print the memory estimate (LoadError for a bad device or dtype), then load the family (--estimate-only: None)."""
    from .models.loading import estimate, load_triplet, pick_device, pick_dtype

    dev = pick_device(args.device)
    text = f"{estimate(args.models, pick_dtype(dev, args.dtype), max_len(args), args.quantize).summary()}; device {dev}"
    print(text if args.estimate_only else f"note: {text}", file=sys.stdout if args.estimate_only else sys.stderr)
    if args.estimate_only:
        return None
    return load_triplet(
        args.models,
        device=args.device,
        dtype=args.dtype,
        device_map=args.device_map,
        quantize=args.quantize,
        max_len=max_len(args),
    )
