"""What a training run did, in words: printed at the end of `exploration-trl train` and written into the card.

Two ways a run can look like training and be none:

* no weight changed (every gradient was zero, or the learning rate was), so the saved model is the starting one;
* the reward never varied within a group (TRL's `frac_reward_zero_std` was 1 on every step), so every GRPO
  advantage was 0 and the reward taught nothing, whatever the method.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["outcome_notes", "reward_never_varied"]


def reward_never_varied(frac_reward_zero_std: Iterable[float]) -> bool | None:
    """True when every value of `frac_reward_zero_std` (per step, or means over logging windows) is 1; None when
    none was recorded."""
    values = [float(v) for v in frac_reward_zero_std
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not values:
        return None
    return all(v >= 1.0 - 1e-9 for v in values)


def outcome_notes(outcome: Mapping | None) -> list[str]:
    """Sentences for what went wrong in a run (`[]` when nothing did). `outcome` holds `weights_changed` (bool or
    None: not measured), `reward_never_varied` (bool or None) and `diverged` (the divergence check's sentence or
    None)."""
    outcome = outcome or {}
    notes = []
    if outcome.get("weights_changed") is False:
        notes.append("Training changed no weight: the saved weights are exactly the starting model's, so this model "
                     "is the base model unchanged.")
    if outcome.get("reward_never_varied"):
        notes.append("The reward never varied within a group: on every step all completions of each prompt got the "
                     "same reward (frac_reward_zero_std = 1), so every GRPO advantage was 0 and the reward taught "
                     "nothing. A starting model that sometimes succeeds, more generations per prompt "
                     "(num_generations) or a graded reward gives a learning signal.")
    if outcome.get("diverged"):  # the sentence of `trainers/divergence.detect_divergence`
        notes.append(str(outcome["diverged"]))
    return notes
