"""Distilling the offline students: on-policy data, losses and metrics, and the `distill` subcommand."""
