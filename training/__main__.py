"""`python -m training draft-feature`: each subcommand lives in its own module with
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches."""

from __future__ import annotations

import argparse

from pyramid_demo.cli import dispatch

SUBCOMMANDS = {
    "draft-feature": (
        "training.feature_cli",
        "train the draft that reads the target (EAGLE-style) for the bundled "
        "offline target, and grow the token-id corpus it trains on",
    ),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m training", __doc__, SUBCOMMANDS, argv, argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__":
    raise SystemExit(main())
