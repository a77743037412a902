"""What every reward module shares: failure accounting and the helpers for reading completions.

A reward never raises because of a bad completion. When it cannot score one (malformed input, a crash inside
the verifier, a timeout) it returns 0.0 (or None when the reference answer itself is unusable) and calls
:func:`record_failure`; a trainer calls :func:`pop_failure_counts` once per step to log how many completions
each reward failed to score.

The reward modules import from here and the registry imports the reward modules, so nothing here may import
either of them.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_CORRECT_THRESHOLD",
    "RewardFunctionError",
    "broadcast_column",
    "completion_to_text",
    "is_correct",
    "is_reward_factory",
    "missing_columns",
    "naming_errors",
    "peek_failure_counts",
    "pop_failure_counts",
    "pop_outcomes",
    "record_failure",
    "record_outcomes",
    "reward_factory",
    "reward_range",
    "score_each",
]

# --------------------------------------------------------------------------------------------
# What "correct" means
# --------------------------------------------------------------------------------------------

#: Default of `correct_reward_threshold`: the verifiers give 1 for a right answer and 0 otherwise.
DEFAULT_CORRECT_THRESHOLD = 0.0


def is_correct(reward: Any, threshold: float = DEFAULT_CORRECT_THRESHOLD) -> Any:
    """The one definition of a correct completion: its total reward is strictly above `threshold`.

    Used by the training metrics, DS-GRPO and ProGRPO's group-skip rule and `keep_sign` option (with the config's
    `correct_reward_threshold`) and by `exploration-trl eval` (with the default, 0). A missing reward (None, NaN)
    is wrong. Works on a float or elementwise on a tensor / array (`NaN > x` is False).

    Why "> threshold" with a default of 0 rather than "reward >= 1": training rewards are weighted sums whose
    scale the user chooses (`reward_weights`), so "full credit" has no fixed value, while every verifier gives 0
    to a wrong answer; a partial credit (a format bonus, countdown's `format_score`) is kept out of "correct" by
    raising the threshold above it (e.g. 0.5). On the binary verifiers that grade eval, "> 0" and ">= 1" agree.
    """
    if reward is None:
        return False
    return reward > threshold

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
# Final answers ("outcomes"), as a reward extracted them
# --------------------------------------------------------------------------------------------

_OUTCOMES: dict[str, list[str | None]] = {}


def record_outcomes(reward_name: str, answers: Sequence[str | None]) -> None:
    """Record the final answer the reward read from each completion of its last call (None: none stated), in the
    order of its completions, as a canonical string: equal answers, equal strings. Only the last call is kept.

    Methods that explore over outcomes (`method: outcome_explore`) read them with :func:`pop_outcomes` right after
    the rewards of a batch, so the answers are the ones the reward graded. `math_accuracy` records math-verify's
    parsed answer, `countdown` its canonical equation; a custom reward may call this too.
    """
    with _FAILURES_LOCK:
        _OUTCOMES[reward_name] = list(answers)


def pop_outcomes() -> dict[str, list[str | None]]:
    """Return ``{reward name: answers of its last call}`` recorded since the last call, and reset."""
    with _FAILURES_LOCK:
        out = dict(_OUTCOMES)
        _OUTCOMES.clear()
    return out


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


# --------------------------------------------------------------------------------------------
# What a reward needs and gives, for checks before training starts
# --------------------------------------------------------------------------------------------

#: Keyword arguments TRL passes to every reward besides the dataset's columns (it never passes `prompt`).
TRL_REWARD_KWARGS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                               "environments"})


def _unwrap(func: Callable) -> tuple[Callable, dict]:
    """`(the underlying function, the keyword arguments bound to it by partials)`."""
    bound: dict = {}
    while True:
        if isinstance(func, functools.partial):
            bound = {**func.keywords, **bound}
            func = func.func
        elif hasattr(func, "__wrapped__"):
            func = func.__wrapped__
        else:
            return func, bound


def _declared(func: Callable, attr: str) -> Any:
    base, bound = _unwrap(func)
    value = getattr(base, attr, None)
    return value(**bound) if callable(value) else value


def missing_columns(func: Callable, columns: Sequence[str]) -> list[str]:
    """Dataset columns reward `func` needs that `columns` lacks (`[]`: none).

    A reward declares what it reads as `func.reward_columns`: alternatives, each a tuple of column names (e.g.
    countdown's `[("nums", "target"), ("input", "output")]`), or a function of its bound options giving them.
    Otherwise every parameter of its signature without a default, other than what TRL passes itself
    (`completions`, `prompts`, ...), must be a column.
    """
    have = set(columns) - {"prompt"}  # TRL passes the prompt as `prompts`, never as a column
    alternatives = _declared(func, "reward_columns")
    if alternatives is not None:
        alternatives = [tuple(a) for a in alternatives]
        if not alternatives or any(set(a) <= have for a in alternatives):
            return []
        return [c for c in alternatives[0] if c not in have]
    base, bound = _unwrap(func)
    try:
        params = inspect.signature(base).parameters.values()
    except (TypeError, ValueError):
        return []
    required = [p.name for p in params
                if p.default is inspect.Parameter.empty and p.name not in bound and p.name not in TRL_REWARD_KWARGS
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return [c for c in required if c not in have]


def reward_range(func: Callable) -> tuple[float, float] | None:
    """`(lowest, highest)` reward `func` can give, as it declares in `func.reward_range` (None: unknown)."""
    value = _declared(func, "reward_range")
    return None if value is None else (float(value[0]), float(value[1]))


# --------------------------------------------------------------------------------------------
# Errors raised inside a reward function
# --------------------------------------------------------------------------------------------


class RewardFunctionError(RuntimeError):
    """A reward function raised. The message names the reward; the original exception is chained (`from`), so its
    traceback is printed too. Not a `ValueError`: the command line shows it in full instead of as one line."""


def naming_errors(func: Callable, name: str | None = None) -> Callable:
    """`func`, but an exception it raises becomes a :class:`RewardFunctionError` naming the reward (`name`, default
    `func.__name__`), chained to the original. Keeps the name TRL logs the reward under and async-ness."""
    name = name or getattr(func, "__name__", type(func).__name__)

    def error(e: Exception) -> RewardFunctionError:
        text = str(e).strip().splitlines()
        return RewardFunctionError(f"reward '{name}' raised {type(e).__name__}" + (f": {text[0]}" if text else ""))

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):
        @functools.wraps(func)
        async def reward(*args, **kwargs):
            try:
                return await func(*args, **kwargs)
            except Exception as e:
                raise error(e) from e
    else:
        @functools.wraps(func)
        def reward(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except Exception as e:
                raise error(e) from e

    reward.__name__ = name if not hasattr(func, "__name__") else func.__name__
    return reward
