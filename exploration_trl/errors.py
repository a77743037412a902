"""Exception types shared by the trainers and the command line (no heavy imports, so the CLI stays fast)."""


class HookDidNotRunError(RuntimeError):
    """A configured method (or the exploration metrics) did not act on a step: a bug, never a user mistake."""
