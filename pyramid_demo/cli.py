"""`python -m pyramid_demo {generate,bench,prepare}`: run one method, benchmark methods, or prepare this machine."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "generate": ("pyramid_demo.generate_cli", "run one decoding method and print the text and its trace"),
    "bench": ("pyramid_demo.bench.runner", "benchmark methods side by side and write results.csv/json and report.html"),
    "prepare": ("pyramid_demo.prepare_cli", "build compiled passes; record this machine's checks and costs"),
}


def dispatch(
    prog: str,
    doc: str | None,
    subcommands: dict[str, tuple[str, str]],
    argv: list[str] | None,
    formatter: type[argparse.HelpFormatter] = argparse.HelpFormatter,
) -> int:
    """Parse `argv` into one of `subcommands` (name -> (module, help)) and run that module's `run(args)`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in subcommands.items():
        modules[name] = importlib.import_module(module)
        modules[name].add_arguments(
            sub.add_parser(name, help=help_text, description=help_text, formatter_class=formatter)
        )
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m pyramid_demo", __doc__, SUBCOMMANDS, argv)
