"""A diverging run is said so: one warning while training, and a note in the model card.

The rule (fixed before the budget experiment ran; `detect_divergence`), over the logged training history, with a
window of `divergence_window` optimizer steps (at least one logged entry: `ceil(window / logging_steps)` entries):

* **entropy climbs without bound**: the mean token entropy (TRL's `entropy`) of the last window is above
  `divergence_entropy_factor` times that of the first window, and above that of the window just before it
  (still rising). A collapsing run lowers its entropy; an entropy bonus that holds entropy up by a factor below
  `divergence_entropy_factor` (default 3) is not flagged.
* **reward falls to 0**: every logged mean reward of the last window is <= 0, and some earlier window's mean
  reward was > 0 (the run had learnt something and lost it).

Both need at least two windows of history. The check runs after each training log; the first time either holds
it warns once (`DivergenceWarning`) and records the sentence in `trainer.divergence`, which the card prints
(`hub/outcome.py`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from transformers import TrainerCallback

__all__ = ["DivergenceCallback", "DivergenceWarning", "check_divergence_config", "detect_divergence"]


class DivergenceWarning(UserWarning):
    """A training run whose token entropy climbs without bound or whose reward fell to 0."""


def check_divergence_config(args) -> None:
    if int(args.divergence_window) < 0:
        raise ValueError(f"divergence_window is {args.divergence_window} but must be >= 0 (0 switches the "
                         "divergence check off)")
    if not args.divergence_entropy_factor > 1:
        raise ValueError(f"divergence_entropy_factor is {args.divergence_entropy_factor} but must be > 1: the "
                         "entropy must have grown by this factor (default 3)")


def _values(history: Sequence[Mapping], key: str) -> list[float]:
    out = []
    for e in history:
        v = e.get(key) if isinstance(e, Mapping) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def detect_divergence(history: Sequence[Mapping], window_steps: int = 20, entropy_factor: float = 3.0,
                      logging_steps: int = 1) -> str | None:
    """The sentence saying how the run diverged, or None (see the module docstring for the rule). `history` is
    `trainer.state.log_history` (training entries with `entropy` / `reward`; others are skipped)."""
    if window_steps <= 0:
        return None
    w = max(1, math.ceil(window_steps / max(1, int(logging_steps))))
    train = [e for e in history if isinstance(e, Mapping) and not any(str(k).startswith("eval_") for k in e)]
    steps = [e.get("step") for e in train if "entropy" in e]
    ent = _values(train, "entropy")
    if len(ent) >= 2 * w:
        first, prev, last = _mean(ent[:w]), _mean(ent[-2 * w:-w]), _mean(ent[-w:])
        if first > 0 and last > entropy_factor * first and last > prev:
            at = f" by step {steps[-1]}" if steps and steps[-1] is not None else ""
            return (f"The run diverged: its token entropy climbed from {first:.3g} to {last:.3g} nats{at} "
                    f"(above {entropy_factor:g}x its first window and still rising); the policy is drifting "
                    "towards uniform sampling. Lower the entropy coefficient or the learning rate.")
    rew = _values(train, "reward")
    if len(rew) >= 2 * w:
        earlier = [_mean(rew[i:i + w]) for i in range(len(rew) - 2 * w + 1)]
        if max(rew[-w:]) <= 0 and max(earlier) > 0:
            return (f"The run diverged: its mean reward fell to {_mean(rew[-w:]):.3g} over the last {w} logged "
                    f"steps after reaching {max(earlier):.3g}; the model no longer solves the training problems. "
                    "Use an earlier checkpoint, lower the learning rate or the method's coefficient.")
    return None


class DivergenceCallback(TrainerCallback):
    """Checks the training history after each training log (module docstring). transformers' `Trainer.log` appends
    the averaged metrics to `state.log_history` before it calls `on_log`, so the check sees the entry just logged."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("is_world_process_zero", "model")

    def __init__(self, view):
        self.view = view
        self.note: str | None = None  # the sentence, once the run diverged (the card prints it)

    def on_log(self, args, state, control, logs=None, **kwargs):
        window = int(getattr(args, "divergence_window", 0) or 0)
        if self.note is not None or window <= 0 or not self.view.model.training:
            return
        logging_steps = args.logging_steps if isinstance(args.logging_steps, int) or args.logging_steps >= 1 else 1
        note = detect_divergence(state.log_history, window, float(args.divergence_entropy_factor), int(logging_steps))
        if note is not None:
            self.note = note
            if self.view.is_world_process_zero():
                warnings.warn(note, DivergenceWarning, stacklevel=2)
