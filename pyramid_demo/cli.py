"""`python -m pyramid_demo {generate,bench,probe}`: each subcommand lives in its own module with
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches. (Rebuilding the offline family's
weights is `python -m training`, outside the product package.)"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "generate": ("pyramid_demo.generate_cli", "run one decoding method and print the text and its trace"),
    "bench": ("pyramid_demo.bench.runner", "benchmark methods side by side and write results.csv/json and report.html"),
    "probe": ("pyramid_demo.probe_cli", "check and time the dtype/backend/forward candidates on this machine now"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyramid_demo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        modules[name] = importlib.import_module(module)
        modules[name].add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
