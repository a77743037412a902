"""`WindowWarning`: a warning given once per run, decided at a log from one metric's values over the logging window
(no host read of its own). The rollout component and the strategies declare theirs; `ExplorationMetrics.warn` gives
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _some_positive(values: list[float]) -> bool:
    return any(v > 0 for v in values)


@dataclass(frozen=True)
class WindowWarning:
    """A warning given once per run, at a logging step, when one metric's values over the logging window call for
    it. It is read with the other metrics at the log (no host read of its own). Strategies and components declare
    theirs in `window_warnings`; `message(reader, values)` writes the text, where `reader` is a strategy's
    `MethodContext` (a component's: its trainer)."""

    metric: str
    message: Callable[[Any, list[float]], str]
    when: Callable[[list[float]], bool] = _some_positive
    #: Whether the warning can apply to this run at all (read at the log, with the same reader as `message`).
    applies: Callable[[Any], bool] = lambda reader: True
    #: The windows it reads: the training window, and evaluation's when evaluation logs the metric too.
    modes: tuple[str, ...] = ("train", "eval")
