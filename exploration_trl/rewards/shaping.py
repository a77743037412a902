"""Shaping rewards (penalties in ``[-penalty, 0]``), meant to be added to a verifiable reward.

* ``make_length_penalty(max_length=1024, buffer_length=None, penalty=1.0, unit="auto")``: DAPO's
  soft overlong punishment. With ``L`` the completion length, ``L_max = max_length`` and
  ``L_buf = buffer_length`` (default ``max_length // 5``)::

      0                                   if L <= L_max - L_buf
      -penalty * (L - (L_max - L_buf)) / L_buf   if L_max - L_buf < L <= L_max
      -penalty                            if L > L_max

  ``unit="auto"`` measures tokens when TRL passes ``completion_ids`` and characters otherwise;
  ``"tokens"`` / ``"chars"`` force one (``"tokens"`` needs ``completion_ids``).

* ``make_repetition_penalty(ngram_size=3, max_penalty=-1.0, unit="words")``: the fraction of
  repeated n-grams, ``1 - distinct / total``, scaled into ``[max_penalty, 0]``. N-grams are over
  lower-cased whitespace-separated words, or over ``completion_ids`` with ``unit="tokens"``.
  Completions shorter than one n-gram get 0.

Both are registered (``length_penalty``, ``repetition_penalty``) as factories, so
``get_reward("length_penalty", max_length=4096)`` builds one with those options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exploration_trl.rewards.base import completion_to_text, reward_factory, score_each

__all__ = ["make_length_penalty", "make_repetition_penalty", "repeated_ngram_fraction", "soft_overlong_penalty"]


def soft_overlong_penalty(length: int, max_length: int, buffer_length: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment for one length (see the module docstring)."""
    threshold = max_length - buffer_length
    if length <= threshold:
        return 0.0
    if length <= max_length:
        return -penalty * (length - threshold) / buffer_length
    return -float(penalty)


def repeated_ngram_fraction(items: Sequence[Any], ngram_size: int) -> float:
    """``1 - distinct/total`` over the n-grams of ``items`` (0.0 when there is no n-gram)."""
    total = len(items) - ngram_size + 1
    if total <= 0:
        return 0.0
    grams = {tuple(items[i : i + ngram_size]) for i in range(total)}
    return 1.0 - len(grams) / total


def _check_unit(unit: str, allowed: tuple[str, ...]) -> None:
    if unit not in allowed:
        raise ValueError(f"unit must be one of {', '.join(allowed)}; got {unit!r}")


@reward_factory
def make_length_penalty(
    max_length: int = 1024,
    buffer_length: int | None = None,
    penalty: float = 1.0,
    unit: str = "auto",
    name: str = "length_penalty",
) -> Callable[..., list[float]]:
    """DAPO-style soft overlong penalty (see the module docstring)."""
    _check_unit(unit, ("auto", "tokens", "chars"))
    if max_length <= 0:
        raise ValueError("max_length must be positive")
    if buffer_length is None:
        buffer_length = max(1, max_length // 5)
    if not 0 < buffer_length <= max_length:
        raise ValueError("buffer_length must be in (0, max_length]")
    if penalty < 0:
        raise ValueError("penalty must be >= 0 (it is subtracted)")

    def length_penalty(completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any) -> list[float]:
        use_tokens = unit == "tokens" or (unit == "auto" and completion_ids is not None)
        if use_tokens and completion_ids is None:
            raise ValueError("length_penalty(unit='tokens') needs completion_ids")
        if use_tokens and len(completion_ids) != len(completions):
            raise ValueError("completion_ids and completions differ in length")

        def score(i: int, completion: Any) -> float:
            length = len(completion_ids[i]) if use_tokens else len(completion_to_text(completion))
            return soft_overlong_penalty(length, max_length, buffer_length, penalty)

        return score_each(name, completions, score)

    length_penalty.__name__ = length_penalty.__qualname__ = name
    length_penalty.reward_range = (-penalty, 0.0)
    return length_penalty


@reward_factory
def make_repetition_penalty(
    ngram_size: int = 3,
    max_penalty: float = -1.0,
    unit: str = "words",
    name: str = "repetition_penalty",
) -> Callable[..., list[float]]:
    """Penalty proportional to the fraction of repeated n-grams (see the module docstring)."""
    _check_unit(unit, ("words", "tokens"))
    if ngram_size < 1:
        raise ValueError("ngram_size must be >= 1")
    if max_penalty > 0:
        raise ValueError("max_penalty must be <= 0")

    def repetition_penalty(completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any) -> list[float]:
        if unit == "tokens" and (completion_ids is None or len(completion_ids) != len(completions)):
            raise ValueError("repetition_penalty(unit='tokens') needs one completion_ids entry per completion")

        def score(i: int, completion: Any) -> float:
            items = list(completion_ids[i]) if unit == "tokens" else completion_to_text(completion).lower().split()
            return repeated_ngram_fraction(items, ngram_size) * max_penalty

        return score_each(name, completions, score)

    repetition_penalty.__name__ = repetition_penalty.__qualname__ = name
    repetition_penalty.reward_range = (max_penalty, 0.0)
    return repetition_penalty
