"""Math answer accuracy with math-verify.

``math_accuracy(completions, answer)`` gives 1.0 when the completion's final answer is
mathematically equal to the reference answer, 0.0 when it is not (or when the completion states no
final answer), and None when the reference answer cannot be parsed.

Answer extraction from the completion (nothing else is tried, so a completion that never commits
to an answer scores 0.0):

1. the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces);
2. otherwise the rest of the line after the last "answer is" ("The final answer is $42$.").

The reference answer may be a number (``27.0``), a string (``"025"``, ``"\\frac{1}{2}"``), a
solution containing ``\\boxed{}``, or a GSM8K worked solution ending in ``#### 1,234`` (the text
after the last ``####`` is used, thousands separators dropped). Comparison is
``verify(parse(gold), parse(prediction))``, gold first, as math-verify requires.

Timeouts
--------
math-verify's own timeouts use ``signal.alarm``, which Python only allows in the main thread;
called from another thread they raise ``ValueError`` (and a plain ``alarm`` cannot be nested with
another one either). So math-verify is always called with its timeouts switched off
(``parsing_timeout=None``, ``timeout_seconds=None``) and the time limit is enforced here:

* in the main thread (``mode="auto"``): a ``setitimer(ITIMER_REAL)`` alarm per completion whose
  handler raises an exception that math-verify's ``except Exception`` clauses do not swallow;
  it re-fires every 50 ms until cleared, in case some library code swallows it once;
* in any other thread, or always with ``mode="process"``: the work goes to a small pool of
  persistent worker processes (``sys.executable``, JSON lines over pipes). A worker applies the
  same alarm in *its* main thread, and the caller kills and replaces a worker that has not
  answered ``grace`` seconds after the limit (a computation stuck in C code cannot be interrupted
  by a signal). Workers start lazily (about a second to import sympy) and exit when the trainer
  does.

The alarm lives in :mod:`exploration_trl.rewards.math_verifier`, the worker processes in
:mod:`exploration_trl.rewards.math_pool`; ``shutdown_math_workers`` is re-exported here.

A completion that times out or crashes the verifier scores 0.0 and is counted by
:func:`exploration_trl.rewards.pop_failure_counts` under ``math_accuracy``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from exploration_trl.rewards.base import (
    broadcast_column,
    completion_to_text,
    record_failure,
    record_outcomes,
)
from exploration_trl.rewards.math_pool import _POOL, shutdown_math_workers
from exploration_trl.rewards.math_verifier import _evaluate_guarded, _in_main_thread

__all__ = ["extract_final_answer", "math_accuracy", "normalize_gold_answer", "shutdown_math_workers", "stated_answer"]

REWARD_NAME = "math_accuracy"
_MAX_ANSWER_CHARS = 1000

# --------------------------------------------------------------------------------------------
# Answer extraction (pure string work; no math-verify needed)
# --------------------------------------------------------------------------------------------

#: The answer syntax, one for grading and for the format reward (`format.has_single_boxed`): `\boxed{...}` or
#: `\fbox{...}` (LaTeX's other box command, which models also write), whitespace allowed before the brace.
BOX_COMMANDS = ("boxed", "fbox")
BOX_RE = re.compile(r"\\(?:" + "|".join(BOX_COMMANDS) + r")\s*\{")
_ANSWER_IS_RE = re.compile(r"answer\s+is\s*[:：]?\s*([^\n]*)", re.IGNORECASE)
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _balanced_content(text: str, open_brace: int) -> str | None:
    """Content between ``text[open_brace] == '{'`` and its matching ``}`` (None if unbalanced)."""
    depth = 0
    for i in range(open_brace, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
    return None


def last_boxed_content(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``."""
    for match in reversed(list(BOX_RE.finditer(text))):
        content = _balanced_content(text, match.end() - 1)
        if content is not None:
            return content
    return None


def _strip_answer(ans: str) -> str:
    ans = ans.strip()
    ans = ans.replace("\\$", "").replace("\\!", "")
    ans = ans.rstrip(" .;,")
    return ans.strip()


def extract_final_answer(text: str) -> tuple[str, list[str]] | None:
    """``(kind, candidate strings for math-verify's parse)`` or None if no final answer is stated.

    ``kind`` is ``"boxed"`` or ``"answer_is"``. The candidates are tried in order; the first that
    math-verify can parse is compared with the reference.
    """
    boxed = last_boxed_content(text)
    if boxed is not None:
        content = _strip_answer(boxed)
        if not content or len(content) > _MAX_ANSWER_CHARS:
            return None
        if _THOUSANDS_RE.match(content):
            content = content.replace(",", "")
        return "boxed", ["\\boxed{" + content + "}"]
    matches = list(_ANSWER_IS_RE.finditer(text))
    if not matches:
        return None
    ans = _strip_answer(matches[-1].group(1))
    if not ans or len(ans) > _MAX_ANSWER_CHARS:
        return None
    if _THOUSANDS_RE.match(ans):
        ans = ans.replace(",", "")
    candidates = [ans]
    if "$" not in ans:
        candidates.append("$" + ans + "$")
    return "answer_is", candidates


def stated_answer(text: str) -> str | None:
    """The final answer a completion states, as the text `math_accuracy` hands math-verify (`extract_final_answer`'s
    first candidate, unwrapped): the last ``\\boxed{}``'s content, else the rest of the line after the last "answer
    is"; None when the completion states none. `exploration-trl eval` counts these answers for maj@n and solution
    multiplicity, so what is counted is what was graded."""
    found = extract_final_answer(text)
    if found is None:
        return None
    kind, candidates = found
    return candidates[0][len("\\boxed{"):-1] if kind == "boxed" else candidates[0]


def normalize_gold_answer(gold: Any) -> str | None:
    """Text handed to math-verify's ``parse`` for a reference answer (None if unusable)."""
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, (int, float)):
        if isinstance(gold, float) and not math.isfinite(gold):
            return None
        return "$" + str(gold) + "$"
    if not isinstance(gold, str):
        return None
    text = gold.strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
        text = text.replace(",", "") if _THOUSANDS_RE.match(text) else text
        text = text.rstrip(".").strip()
        return "$" + text + "$" if text else None
    if not text:
        return None
    if "\\boxed" in text or "\\fbox" in text or "$" in text or "\\(" in text or "\\[" in text:
        return text
    text = text.rstrip(".").strip()
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    return "$" + text + "$"


# --------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------


def math_accuracy(
    completions: Sequence[Any],
    answer: Any = None,
    *,
    answer_column: str = "answer",
    timeout: float = 5.0,
    mode: str = "auto",
    num_workers: int = 2,
    grace: float = 2.0,
    worker_memory_mb: int = 4096,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 if the completion's final answer equals the reference, else 0.0; None for unusable gold.

    Args:
        completions: plain strings or conversations (the last assistant message is scored).
        answer: reference answers, one per completion (TRL passes the ``answer`` dataset column).
        answer_column: read the reference from this keyword argument instead of ``answer``
            (e.g. ``"solution"`` for MATH's worked solutions with ``\\boxed{}``).
        timeout: seconds allowed per completion (parsing and comparison together).
        mode: ``"auto"``: in-process with a signal alarm in the main thread, worker processes in
            other threads; ``"process"``: always worker processes.
        num_workers: worker processes used at most (off the main thread / ``mode="process"``).
        grace: extra seconds before a worker that ignores its alarm is killed.
        worker_memory_mb: address-space limit of each worker (0: none).
    """
    if mode not in ("auto", "process"):
        raise ValueError(f"math_accuracy: mode must be 'auto' or 'process', got {mode!r}")
    if answer_column != "answer":
        if answer_column not in kwargs:
            raise ValueError(f"math_accuracy: no column {answer_column!r} among the reward's inputs")
        answer = kwargs[answer_column]
    if answer is None:
        raise ValueError("math_accuracy needs the reference answers (an `answer` column)")
    n = len(completions)
    golds = broadcast_column(answer, n)

    rewards: list[float | None] = [0.0] * n
    answers: list[str | None] = [None] * n  # math-verify's parse of each stated answer
    jobs: list[tuple[str, list[str]]] = []
    job_index: list[int] = []
    failures = 0
    for i, (completion, gold) in enumerate(zip(completions, golds)):
        gold_text = normalize_gold_answer(gold)
        if gold_text is None:
            rewards[i] = None
            continue
        try:
            text = completion_to_text(completion)
        except (TypeError, ValueError):
            failures += 1
            continue
        found = extract_final_answer(text)
        if found is None:
            # Still report None when the reference is unusable, even without a prediction.
            jobs.append((gold_text, []))
        else:
            jobs.append((gold_text, found[1]))
        job_index.append(i)

    if jobs:
        if mode == "auto" and _in_main_thread():
            outcomes = [_evaluate_guarded(g, c, timeout) for g, c in jobs]
        else:
            outcomes = _POOL.evaluate_many(
                jobs,
                timeout=timeout,
                grace=grace,
                num_workers=num_workers,
                memory_mb=worker_memory_mb,
                startup_timeout=max(120.0, timeout),
            )
        for i, (status, value) in zip(job_index, outcomes):
            if status == "ok":
                score, answers[i] = value
                rewards[i] = None if score is None else float(score)
            else:
                failures += 1
                rewards[i] = 0.0
    record_failure(REWARD_NAME, failures)
    record_outcomes(REWARD_NAME, answers)
    return rewards


# Read before training starts: the column it needs and the rewards it gives.
math_accuracy.reward_columns = lambda answer_column="answer", **_: [(answer_column,)]  # type: ignore[attr-defined]
math_accuracy.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
