"""Rebuilding the offline family's shipped files (pyramid_demo/models/weights/): the students' and the feature
draft's training, the token-id corpus they train on, and the `python -m training {distill,draft-feature}`
commands. Nothing under pyramid_demo imports this package (tests/test_architecture.py checks it)."""
