"""What every `exploration-trl` command module shares: the one-line user error and which process prints."""

from __future__ import annotations

import os


class CLIError(ValueError):
    """Bad user input: printed as one `error: ...` line, exit status 2."""


def is_main_process() -> bool:
    """Whether this is the process that prints notes (rank 0, or no launcher at all)."""
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0"
