"""math-verify under a time limit, for :func:`exploration_trl.rewards.math.math_accuracy` and its worker processes.

math-verify's own timeouts use ``signal.alarm``, which only the main thread may set, so math-verify is always called
with them switched off and the limit is enforced here: a ``setitimer`` alarm whose handler raises :class:`_Deadline`,
a ``BaseException`` that math-verify's ``except Exception`` clauses do not swallow. Main thread only: other threads
send the work to :mod:`exploration_trl.rewards.math_pool`, whose workers run :func:`_evaluate_guarded` in *their*
main thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any


class _Deadline(BaseException):
    """Raised by the alarm handler. A BaseException so that ``except Exception`` won't catch it."""


class _QuietTimeoutWarning(logging.Filter):
    """Drops math-verify's warning that its own timeout is off: it is off on purpose (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_MV = None


def math_verify_module():
    """The `math_verify` module, imported and warmed up on first use (its timeout warning silenced)."""
    global _MV
    if _MV is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader", "math_verify"):
            logging.getLogger(name).addFilter(_QuietTimeoutWarning())
        # Warm up (lazy imports, grammar and regex compilation) outside any time limit: an alarm
        # that interrupts a first-time import would leave modules half-initialised.
        gold = math_verify.parse("$\\frac{1}{2}$", parsing_timeout=None)
        pred = math_verify.parse("The answer is \\boxed{0.5} or $x^2+1$", parsing_timeout=None)
        math_verify.verify(gold, pred, timeout_seconds=None)
        _MV = math_verify
    return _MV


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise :class:`_Deadline` in the body after ``seconds`` (main thread only)."""
    if not seconds or seconds <= 0:
        yield
        return
    state = {"active": True}

    def _handler(signum, frame):
        if state["active"]:
            raise _Deadline()

    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)  # someone else's alarm?
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _handler)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        while True:  # the handler may fire while we tear down; retry until disarmed
            try:
                state["active"] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                if outer_delay > 0:  # re-arm the caller's alarm with the time it had left
                    left = outer_delay - (time.monotonic() - started)
                    signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)
                break
            except _Deadline:
                continue


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str):
    mv = math_verify_module()
    return tuple(mv.parse(gold_text, parsing_timeout=None))


def _evaluate(gold_text: str, candidates: Sequence[str]) -> tuple[float | None, str | None]:
    """`(reward, the parsed answer)`: the reward (None for an unusable reference) and math-verify's parse of the
    first candidate it can read, as a string (`record_outcomes`; None when none parses)."""
    mv = math_verify_module()
    gold = list(_parse_gold(gold_text))
    if not gold:
        return None, None
    for candidate in candidates:
        pred = mv.parse(candidate, parsing_timeout=None)
        if pred:
            return (1.0 if mv.verify(gold, pred, timeout_seconds=None) else 0.0), str(pred[0])
    return 0.0, None


def _evaluate_guarded(gold_text: str, candidates: Sequence[str], timeout: float | None) -> tuple[str, Any]:
    """``("ok", value)``, ``("timeout", None)`` or ``("error", message)``; main thread only."""
    try:
        math_verify_module()
    except Exception as exc:  # noqa: BLE001
        return "error", f"math-verify unavailable: {type(exc).__name__}: {exc}"[:500]
    try:
        with _time_limit(timeout):
            return "ok", _evaluate(gold_text, candidates)
    except _Deadline:
        return "timeout", None
    except Exception as exc:  # noqa: BLE001 - any verifier crash is a scoring failure
        return "error", f"{type(exc).__name__}: {exc}"[:500]


def _in_main_thread() -> bool:
    """Can this thread set the alarm `_time_limit` needs (else: the worker processes)?"""
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
