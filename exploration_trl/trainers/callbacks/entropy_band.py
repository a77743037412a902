"""A two-sided entropy controller (`entropy_band: [low, high]`): keeps the policy's token entropy inside a band by
moving one method's strength knob, named by `entropy_band_knob`.

TRL 1.16's own controller (`use_adaptive_entropy`) is one-sided: it only tunes the entropy-bonus coefficient, and
applies the bonus only below `entropy_target`. This one acts on both sides and on any knob in `KNOBS`, each with the
direction in which it raises entropy. After every optimizer step it reads the step's entropy (TRL's own `entropy`
metric: the token-weighted mean of each micro-batch, already reduced over processes, so every process takes the same
decision) and updates the knob (`entropy_band_update`):

    below the band:  move the knob by one step in the direction `d` that raises entropy
    above the band:  move it one step the other way
    inside:          unchanged

    one step up:    knob <- max(knob, clip(max(knob, min) * (1 + rate), min, max))
    one step down:  knob <- min(knob, clip(knob / (1 + rate), min, max))

with `d = +1` for a knob that raises entropy. The step is multiplicative, so a knob at 0 that must rise starts from
`entropy_band_min`; a step never moves the knob the other way, so a knob at 0 (or under `entropy_band_min`) that
must fall stays where it is, and one above `entropy_band_max` that must rise too. The knob's value is logged as `entropy_band/<knob>` each step; a warning is raised once when the
entropy stays outside the band for `entropy_band_patience` consecutive steps (the knob may be at its bound, or too
weak a lever for this run).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from transformers import TrainerCallback

from ...methods import METHODS, method_info


class _Knobs(Mapping):
    """knob -> +1 when raising it raises the policy's entropy: `entropy_coef` (TRL's entropy-bonus coefficient) and
    every registered method's coefficient whose direction is known (`MethodInfo.coefficients`); always current."""

    def _all(self) -> dict[str, int]:
        knobs = {"entropy_coef": 1}
        for name in METHODS:
            knobs.update({key: d for key, d in method_info(name).coefficients.items() if d})
        return knobs

    def __getitem__(self, knob: str) -> int:
        return self._all()[knob]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


KNOBS: Mapping[str, int] = _Knobs()


def entropy_band_update(value: float, entropy: float, low: float, high: float, direction: int, rate: float,
                        lo: float, hi: float) -> float:
    """One bounded multiplicative step of the knob toward the band (see the module docstring)."""
    if math.isnan(entropy) or low <= entropy <= high:
        return value
    if (entropy < low) == (direction > 0):  # the knob must rise
        return max(value, min(max(max(value, lo) * (1.0 + rate), lo), hi))
    return min(value, min(max(value / (1.0 + rate), lo), hi))


def check_entropy_band(config):
    """One-line errors for the `entropy_band*` keys (called from `ExplorationGRPOConfig.__post_init__`)."""
    band = config.entropy_band
    if band is None:
        return
    if len(band) != 2 or not band[0] < band[1] or band[0] < 0:
        raise ValueError(f"entropy_band is {band!r} but must be [low, high] with 0 <= low < high (nats per token)")
    knob = config.entropy_band_knob
    if knob not in KNOBS:
        raise ValueError(f"entropy_band_knob is {knob!r}; choose one of {', '.join(KNOBS)}")
    if not hasattr(config, knob):
        raise ValueError(f"entropy_band_knob is {knob!r} but this method's config has no such key; use a method "
                         f"that has it or entropy_band_knob: entropy_coef")
    if not 0 < config.entropy_band_rate <= 1:
        raise ValueError(f"entropy_band_rate is {config.entropy_band_rate} but must be in (0, 1] (a relative step)")
    if not 0 < config.entropy_band_min < config.entropy_band_max:
        raise ValueError(f"entropy_band_min ({config.entropy_band_min}) and entropy_band_max "
                         f"({config.entropy_band_max}) must satisfy 0 < min < max")
    if config.entropy_band_patience < 1:
        raise ValueError(f"entropy_band_patience is {config.entropy_band_patience} but must be >= 1")
    if knob == "entropy_coef" and getattr(config, "use_adaptive_entropy", False):
        raise ValueError("entropy_band with entropy_band_knob: entropy_coef replaces TRL's one-sided controller; set "
                         "use_adaptive_entropy: false")


class EntropyBandController(TrainerCallback):
    """A controller, not an observer: it writes the knob (TRL's `entropy_coef` and the config value) at the end of
    every optimizer step, before the step's log, so that the value is logged with it."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("args", "current_gradient_accumulation_steps", "enable_entropy_bonus", "metrics_window",
             "queue_metrics")
    WRITES = ("entropy_coef",)  # the knob it moves

    def __init__(self, view):
        self.view = view
        args = view.args
        self.knob = args.entropy_band_knob
        self.outside = 0
        self.warned = False
        if self.knob == "entropy_coef":
            # A controlled coefficient must keep TRL's entropy bonus on (the TRL adapter's `enable_entropy_bonus`).
            view.enable_entropy_bonus()
        self._set(getattr(args, self.knob))

    def _get(self) -> float:
        t = self.view
        return float(t.entropy_coef if self.knob == "entropy_coef" else getattr(t.args, self.knob))

    def _set(self, value: float):
        t = self.view
        if self.knob == "entropy_coef":
            t.entropy_coef = value
        setattr(t.args, self.knob, value)

    def on_step_end(self, args, state, control, **kwargs):
        t = self.view
        window = t.metrics_window("train").get("entropy", [])[-max(int(t.current_gradient_accumulation_steps), 1):]
        if not window:
            return
        entropy = sum(window) / len(window)
        low, high = args.entropy_band
        old = self._get()
        new = entropy_band_update(old, entropy, low, high, KNOBS[self.knob], args.entropy_band_rate,
                                  args.entropy_band_min, args.entropy_band_max)
        self._set(new)
        t.queue_metrics({f"entropy_band/{self.knob}": (new, 1.0)}, reduce=False)  # logged with this step's log
        self.outside = 0 if low <= entropy <= high else self.outside + 1
        if self.outside >= args.entropy_band_patience and not self.warned:
            self.warned = True
            side = "below" if entropy < low else "above"
            bound = (" (the knob is at its bound: widen entropy_band_min/max or choose another knob)"
                     if new in (args.entropy_band_min, args.entropy_band_max) or new == old else "")
            warnings.warn(
                f"entropy_band: the policy's entropy ({entropy:.3f}) has stayed {side} the band [{low}, {high}] for "
                f"{self.outside} steps; {self.knob} is now {new:.4g}{bound}. Warned once.", UserWarning, stacklevel=2,
            )
