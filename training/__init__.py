"""Rebuilding the offline family's shipped files (pyramid_demo/models/weights/): the feature draft's training,
its token subset, the token-id corpus it trains on, and the `python -m training draft-feature` command.
Nothing under pyramid_demo imports this package (tests/test_architecture.py checks it)."""
