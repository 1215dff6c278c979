"""`python -m training draft-feature`: each subcommand lives in its own module with
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches."""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "draft-feature": ("training.feature_cli", "train the draft that reads the target (EAGLE-style) for the bundled "
                      "offline target, and grow the token-id corpus it trains on"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        modules[name] = importlib.import_module(module)
        modules[name].add_arguments(sub.add_parser(name, help=help_text, description=help_text,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
