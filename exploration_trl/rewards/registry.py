"""The reward registry: names to reward functions or factories, and the lookup TRL configs go through.

A reward function follows TRL's signature ``func(completions, **columns) -> list[float | None]``.
TRL calls it with ``prompts``, ``completions``, ``completion_ids``, every dataset column and the
``trainer_state`` / ``log_extra`` / ``log_metric`` keyword arguments, so every reward here accepts
and ignores unknown keyword arguments.

Registry entries are either plain reward functions or *factories* (functions decorated with
:func:`~exploration_trl.rewards.base.reward_factory` that build a reward function from keyword arguments):

* ``get_reward("countdown")`` returns the plain function itself;
* ``get_reward("countdown", format_score=0.1)`` binds the keyword arguments with
  :func:`functools.partial` (TRL names a partial after the function it wraps, so it is still logged
  as ``countdown``);
* ``get_reward("length_penalty", max_length=512)`` calls the factory with the keyword arguments;
* ``get_reward("my_pkg.rewards.my_reward")`` imports ``my_reward`` from ``my_pkg.rewards``.

Failure accounting and the helpers the reward modules share live in :mod:`exploration_trl.rewards.base`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# The shared helpers stay importable from here too, where they used to live.
from exploration_trl.rewards.base import (  # noqa: F401
    broadcast_column,
    completion_to_text,
    is_reward_factory,
    peek_failure_counts,
    pop_failure_counts,
    record_failure,
    reward_factory,
)
from exploration_trl.rewards.code import code_execution
from exploration_trl.rewards.countdown import countdown
from exploration_trl.rewards.format import make_format_reward
from exploration_trl.rewards.math import math_accuracy
from exploration_trl.rewards.shaping import make_length_penalty, make_repetition_penalty

__all__ = ["REWARDS", "get_reward", "list_rewards", "register_reward", "resolve_rewards"]

REWARDS: dict[str, Callable] = {}


def register_reward(name: str, obj: Callable | None = None, *, overwrite: bool = False):
    """Register a reward function or factory under ``name`` (usable as a decorator)."""

    def _register(target: Callable) -> Callable:
        if not callable(target):
            raise TypeError(f"reward {name!r} must be callable")
        if "." in name:
            raise ValueError(f"reward names may not contain '.', got {name!r} (dots mean import paths)")
        if name in REWARDS and REWARDS[name] is not target and not overwrite:
            raise ValueError(f"reward {name!r} is already registered")
        REWARDS[name] = target
        return target

    return _register(obj) if obj is not None else _register


def list_rewards() -> list[str]:
    """Sorted names of the registered rewards."""
    return sorted(REWARDS)


def _unknown(name: str) -> ValueError:
    known = ", ".join(list_rewards())
    return ValueError(
        f"unknown reward {name!r}; known rewards: {known} (or a dotted path like my_pkg.rewards.my_reward)"
    )


def _import_dotted(path: str) -> Callable:
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name or not attr:
        raise _unknown(path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import reward {path!r}: module {module_name!r} not found ({exc})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"cannot import reward {path!r}: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"reward {path!r} is not callable")
    return obj


def _check_kwargs(name: str, func: Callable, kwargs: Mapping[str, Any]) -> None:
    """Reject keyword arguments that ``func`` does not name explicitly (typos would be swallowed
    silently by ``**kwargs`` otherwise)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return
    named = {
        p.name
        for p in params.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    bad = sorted(k for k in kwargs if k not in named)
    if bad:
        allowed = ", ".join(sorted(named - {"completions", "prompts", "completion_ids"})) or "none"
        raise ValueError(f"reward {name!r} got unexpected option(s) {', '.join(bad)}; accepted: {allowed}")


def get_reward(name: str | Callable, **kwargs: Any) -> Callable:
    """Return a reward callable for ``name``.

    ``name`` is a registered name, a dotted import path (``pkg.module.func``, also
    ``pkg.module:func``), or already a callable. Registered factories are called with ``kwargs``
    (unknown options raise ``ValueError``); registered plain functions get ``kwargs`` bound with
    :func:`functools.partial` after checking that the function names them; imported or given
    callables are returned as they are, or with ``kwargs`` bound, unchecked.
    """
    registered = False
    if callable(name):
        func, label = name, getattr(name, "__name__", type(name).__name__)
    elif not isinstance(name, str) or not name.strip():
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    elif name in REWARDS:
        func, label, registered = REWARDS[name], name, True
    elif "." in name or ":" in name:
        func, label = _import_dotted(name.strip()), name.strip()
    else:
        raise _unknown(name)

    if registered and is_reward_factory(func):
        _check_kwargs(label, func, kwargs)
        reward = func(**kwargs)
        if not callable(reward):
            raise ValueError(f"reward factory {label!r} did not return a callable")
        return reward
    if not kwargs:
        return func
    if registered:
        _check_kwargs(label, func, kwargs)
    bound = functools.partial(func, **kwargs)
    # TRL names a partial after the function it wraps; other loggers may read ``__name__``.
    bound.__name__ = getattr(func, "__name__", label)  # type: ignore[attr-defined]
    bound.__qualname__ = getattr(func, "__qualname__", label)  # type: ignore[attr-defined]
    bound.__doc__ = getattr(func, "__doc__", None)
    return bound


def resolve_rewards(
    names: Iterable[str | Callable] | str,
    reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Callable]:
    """Callables for ``names``; ``reward_kwargs[name]`` are the options for reward ``name``.

    Every key of ``reward_kwargs`` must be one of ``names`` (a typo would otherwise silently drop
    the options).
    """
    if isinstance(names, str):
        names = [names]
    names = list(names)
    reward_kwargs = dict(reward_kwargs or {})
    string_names = [n for n in names if isinstance(n, str)]
    for key in reward_kwargs:
        if key not in string_names:
            listed = ", ".join(string_names) or "none"
            raise ValueError(f"reward_kwargs has options for {key!r}, which is not among the rewards used ({listed})")
    for key, value in reward_kwargs.items():
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"reward_kwargs[{key!r}] must be a mapping of options, got {type(value).__name__}")
    return [get_reward(n, **dict(reward_kwargs.get(n) or {})) if isinstance(n, str) else get_reward(n) for n in names]


# The built-in rewards.
register_reward("math_accuracy", math_accuracy)
register_reward("countdown", countdown)
register_reward("code_execution", code_execution)
register_reward("format", make_format_reward)
register_reward("length_penalty", make_length_penalty)
register_reward("repetition_penalty", make_repetition_penalty)
