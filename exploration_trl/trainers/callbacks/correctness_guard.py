"""No silent no-op where a method splits completions into correct and wrong: a warning, once, when no group ever
mixes correct and wrong completions although the rewards vary within groups.

Correct means total reward > `correct_reward_threshold` (`rewards.is_correct`; 0 by default, right for 0/1
verifiers). Under a graded reward whose values all lie on one side of the threshold (a length or similarity score,
accuracy plus a format bonus) every completion is judged alike, and a method built on the split quietly does
something else: Pass@k Training's advantages are all 0 (it learns nothing), ProGRPO's skip rule leaves every group
as GRPO's, DS-GRPO gives every completion the same side of its smoothing, the unlikeliness ranking among correct
completions ranks all of them or none. The fix is the threshold, so the warning names it.

When: every completion judged correct while the rewards vary is a threshold below a graded reward: that is said
at the first logging step. Every completion judged wrong while the rewards vary is also how a hard task starts
under a threshold that is right (partial credit, no right answer sampled yet), so that is said only at the end of
training, if no group ever mixed. A run that is all wrong on a 0/1 reward has no varying reward and stays quiet.

Cost: no host-device sync on a training step. `update` folds the batch's flags (some group mixed correct and wrong,
some group's rewards differed, some row correct, some row wrong) into running device booleans; they are read, in
one transfer, only when the trainer logs (`on_log`, where it already brings its metrics to the host) or ends, and
no more once they have decided.
"""

from __future__ import annotations

import logging
import warnings

import torch
from transformers import TrainerCallback

__all__ = ["CorrectnessGuard", "group_flags"]

logger = logging.getLogger(__name__)


def group_flags(rewards: torch.Tensor, correct: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Bool `(4,)` on the rewards' device (no sync): some group mixes correct and wrong rows, some group's rewards
    differ, some row is correct, some row is wrong. Rows are `(num_prompts * G,)`, groups contiguous; NaN rewards
    (unscored) are left out."""
    r = rewards.reshape(-1, num_generations)
    c = correct.reshape(-1, num_generations).bool()
    scored = ~torch.isnan(r)
    right, wrong = c & scored, ~c & scored
    mixed = (right.any(dim=1) & wrong.any(dim=1)).any()
    highest = torch.where(scored, r, torch.full_like(r, float("-inf"))).amax(dim=1)
    lowest = torch.where(scored, r, torch.full_like(r, float("inf"))).amin(dim=1)
    return torch.stack([mixed, (highest > lowest).any(), right.any(), wrong.any()])


class CorrectnessGuard(TrainerCallback):
    """The running flags of one trainer and the checks on its logging steps and at the end (module docstring)."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("is_world_process_zero",)

    def __init__(self, view):
        self.view = view
        self.effects: dict[str, str] = {}  # method -> what it does when every completion is judged alike
        self.flags: torch.Tensor | None = None  # see `group_flags`, OR-ed over the batches so far
        self.decided = False

    def update(self, rewards: torch.Tensor, correct: torch.Tensor, num_generations: int, method: str, effect: str):
        self.effects.setdefault(method, effect)
        if not self.decided:
            flags = group_flags(rewards, correct, num_generations)
            self.flags = flags if self.flags is None else self.flags | flags.to(self.flags.device)

    def _read(self) -> tuple[bool, bool, bool, bool] | None:
        if self.decided or self.flags is None:
            return None
        mixed, varied, any_right, any_wrong = self.flags.tolist()
        if mixed:
            self.decided = True  # the threshold splits this reward: nothing to say, and no more checks
            return None
        return mixed, varied, any_right, any_wrong

    def on_log(self, args, state, control, **kwargs):
        flags = self._read()
        if flags is not None and flags[1] and not flags[3]:
            self._warn(args, state, f"every completion was judged correct (total reward > "
                                    f"{args.correct_reward_threshold}) although the rewards varied within groups")

    def on_train_end(self, args, state, control, **kwargs):
        flags = self._read()
        if flags is not None and flags[1]:
            self._warn(args, state, f"no group mixed correct and wrong completions (correct: total reward > "
                                    f"{args.correct_reward_threshold}) although the rewards varied within groups; "
                                    "with partial credit this is also how a hard task starts, before any right answer")

    def _warn(self, args, state, what: str):
        self.decided = True
        if not self.view.is_world_process_zero():
            return
        message = (
            f"correct_reward_threshold={args.correct_reward_threshold} splits no group: up to step "
            f"{state.global_step} {what}, so {'; '.join(self.effects.values())}. With a graded reward (a length or "
            "similarity score, or accuracy plus a format bonus), set correct_reward_threshold to the value a correct "
            "completion's reward exceeds (e.g. 0.5 for accuracy 1 plus a 0.1 format bonus). Warned once."
        )
        logger.warning(message)
        warnings.warn(message, UserWarning, stacklevel=2)
