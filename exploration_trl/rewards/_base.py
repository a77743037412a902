"""What every reward module shares: failure accounting and the helpers for reading completions.

A reward never raises because of a bad completion. When it cannot score one (malformed input, a crash inside
the verifier, a timeout) it returns 0.0 (or None when the reference answer itself is unusable) and calls
:func:`record_failure`; a trainer calls :func:`pop_failure_counts` once per step to log how many completions
each reward failed to score.

The reward modules import from here and the registry imports the reward modules, so nothing here may import
either of them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "broadcast_column",
    "completion_to_text",
    "is_reward_factory",
    "peek_failure_counts",
    "pop_failure_counts",
    "record_failure",
    "reward_factory",
    "score_each",
]

# --------------------------------------------------------------------------------------------
# Failure accounting
# --------------------------------------------------------------------------------------------

_FAILURES: Counter = Counter()
_FAILURES_LOCK = threading.Lock()


def record_failure(reward_name: str, count: int = 1) -> None:
    """Count ``count`` completions that ``reward_name`` could not score (thread-safe)."""
    if count <= 0:
        return
    with _FAILURES_LOCK:
        _FAILURES[reward_name] += count


def pop_failure_counts() -> dict[str, int]:
    """Return ``{reward name: completions it failed to score}`` since the last call, and reset."""
    with _FAILURES_LOCK:
        counts = {name: n for name, n in _FAILURES.items() if n}
        _FAILURES.clear()
    return counts


def peek_failure_counts() -> dict[str, int]:
    """Like :func:`pop_failure_counts` but without resetting."""
    with _FAILURES_LOCK:
        return {name: n for name, n in _FAILURES.items() if n}


# --------------------------------------------------------------------------------------------
# Helpers for reward implementations
# --------------------------------------------------------------------------------------------


def _content_to_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style content: [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        if parts or not content:
            return "".join(parts)
    raise TypeError(f"unsupported message content of type {type(content).__name__}")


def completion_to_text(completion: Any) -> str:
    """Plain text of one completion.

    Accepts a string, a single message dict, or a conversation (list of message dicts), in which
    case the content of the last ``assistant`` message is used (or of the last message when no
    role is marked ``assistant``). Raises ``TypeError``/``ValueError`` for anything else; callers
    turn that into a recorded failure.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_to_text(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        if not completion:
            raise ValueError("empty conversation")
        messages = [m for m in completion if isinstance(m, Mapping)]
        if len(messages) != len(completion):
            raise TypeError("conversation items must be message dicts")
        for message in reversed(messages):
            if message.get("role") == "assistant":
                return _content_to_text(message.get("content", ""))
        return _content_to_text(messages[-1].get("content", ""))
    raise TypeError(f"unsupported completion of type {type(completion).__name__}")


def broadcast_column(values: Any, n: int) -> list:
    """A per-completion list from a dataset column (a list of length ``n``) or a single value."""
    if isinstance(values, (list, tuple)) and len(values) == n:
        return list(values)
    if isinstance(values, (list, tuple)) and n != 1 and len(values) != n:
        raise ValueError(f"column has {len(values)} values for {n} completions")
    return [values] * n


def reward_factory(func: Callable) -> Callable:
    """Mark ``func`` as a factory: the registry calls it with the keyword arguments."""
    func._is_reward_factory = True  # type: ignore[attr-defined]
    return func


def is_reward_factory(obj: Any) -> bool:
    """True for a function marked with :func:`reward_factory`."""
    return bool(getattr(obj, "_is_reward_factory", False))


def score_each(name: str, completions: Sequence[Any], score: Callable[[int, Any], float]) -> list[float]:
    """``score(i, completion)`` for every completion; one whose scoring raises gets 0.0 and is recorded as a
    failure of reward ``name``."""
    rewards, failures = [], 0
    for i, completion in enumerate(completions):
        try:
            rewards.append(score(i, completion))
        except Exception:  # noqa: BLE001 - never raise for a bad completion
            failures += 1
            rewards.append(0.0)
    record_failure(name, failures)
    return rewards
