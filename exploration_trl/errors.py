"""Exception types shared by the trainers and the command line (no heavy imports, so the CLI stays fast)."""


class HookDidNotRunError(RuntimeError):
    """A configured method (or the exploration metrics) did not act on a step: a bug, never a user mistake."""


class NoRewardError(ValueError):
    """No reward function scored any completion of a generation batch (every value None/NaN) before any batch was
    scored: a setup mistake (a missing or unreadable answer column), so nothing could be learnt."""


class NoOutcomeError(ValueError):
    """A method that explores over final answers (outcome_explore) found no reward that records them
    (`rewards.record_outcomes`): a setup mistake, said before the first update."""
