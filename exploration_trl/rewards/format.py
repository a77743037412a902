"""Format rewards: 1.0 when the completion has the required shape, else 0.0.

``make_format_reward(pattern=..., flags=re.DOTALL)`` matches the whole completion (leading and
trailing whitespace stripped) against ``pattern`` with ``re.fullmatch``. Presets by name
(``preset=...``):

* ``"think_answer"`` (default): ``<think>...</think>`` then ``<answer>...</answer>``, nothing else;
* ``"boxed"``: exactly one ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces anywhere in the completion:
  the answer syntax ``math_accuracy`` grades (``rewards.math.BOX_COMMANDS``), so a completion whose boxed answer is
  graded also passes the format check.

The registered reward ``format`` is this factory: ``get_reward("format")`` gives the
``think_answer`` check, ``get_reward("format", preset="boxed")`` the boxed one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from exploration_trl.rewards.base import completion_to_text, reward_factory, score_each
from exploration_trl.rewards.math import BOX_COMMANDS, BOX_RE

__all__ = ["FORMAT_PRESETS", "format_reward", "has_single_boxed", "make_format_reward"]

THINK_ANSWER_PATTERN = r"^<think>.*?</think>\s*<answer>.*?</answer>$"

FORMAT_PRESETS = {
    "think_answer": THINK_ANSWER_PATTERN,
    "boxed": None,  # checked by has_single_boxed (balanced braces are not a regular language)
}


def has_single_boxed(text: str) -> bool:
    """True when ``text`` contains exactly one box command, ``\\boxed{...}`` or ``\\fbox{...}`` (the ones
    ``math_accuracy`` reads an answer from), and its braces balance."""
    starts = list(BOX_RE.finditer(text))
    if len(starts) != 1 or sum(text.count("\\" + command) for command in BOX_COMMANDS) != 1:
        return False
    depth = 0
    for ch in text[starts[0].end() - 1 :]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return True
    return False


@reward_factory
def make_format_reward(
    pattern: str | None = None,
    flags: int = re.DOTALL,
    preset: str | None = None,
    name: str = "format",
) -> Callable[..., list[float]]:
    """Build a format reward from a regex ``pattern`` or a named ``preset`` (not both)."""
    if pattern is not None and preset is not None:
        raise ValueError("make_format_reward: give either `pattern` or `preset`, not both")
    if pattern is None:
        preset = preset or "think_answer"
        if preset not in FORMAT_PRESETS:
            raise ValueError(f"unknown format preset {preset!r}; known presets: {', '.join(sorted(FORMAT_PRESETS))}")
        pattern = FORMAT_PRESETS[preset]
    check: Callable[[str], bool]
    if pattern is None:
        check = has_single_boxed
    else:
        regex = re.compile(pattern, flags)

        def check(text: str) -> bool:
            return regex.fullmatch(text.strip()) is not None

    def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return score_each(name, completions, lambda _, completion: float(check(completion_to_text(completion))))

    format_reward.__name__ = name
    format_reward.__qualname__ = name
    format_reward.__doc__ = f"1.0 if the completion matches the {preset or 'custom'} format, else 0.0."
    format_reward.reward_range = (0.0, 1.0)
    return format_reward


format_reward = make_format_reward()
