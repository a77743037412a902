"""The pre-registered confirmatory protocol (`protocol.py`): split, runs, verdict and the `confirm` command."""

from .command import register

__all__ = ["register"]
