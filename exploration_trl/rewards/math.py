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

A completion that times out or crashes the verifier scores 0.0 and is counted by
:func:`exploration_trl.rewards.pop_failure_counts` under ``math_accuracy``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from exploration_trl.rewards._base import (
    broadcast_column,
    completion_to_text,
    record_failure,
    record_outcomes,
)

__all__ = ["extract_final_answer", "math_accuracy", "normalize_gold_answer", "shutdown_math_workers", "stated_answer"]

REWARD_NAME = "math_accuracy"
_MAX_ANSWER_CHARS = 1000

# --------------------------------------------------------------------------------------------
# Answer extraction (pure string work; no math-verify needed)
# --------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
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
    for match in reversed(list(_BOX_RE.finditer(text))):
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
# Evaluation with math-verify (in this process or a worker)
# --------------------------------------------------------------------------------------------


class _Deadline(BaseException):
    """Raised by the alarm handler. A BaseException so that ``except Exception`` won't catch it."""


class _QuietTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_MV = None


def _math_verify():
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
    mv = _math_verify()
    return tuple(mv.parse(gold_text, parsing_timeout=None))


def _evaluate(gold_text: str, candidates: Sequence[str]) -> tuple[float | None, str | None]:
    """`(reward, the parsed answer)`: the reward (None for an unusable reference) and math-verify's parse of the
    first candidate it can read, as a string (`record_outcomes`; None when none parses)."""
    mv = _math_verify()
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
        _math_verify()
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
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------

_WORKER_SOURCE = "from exploration_trl.rewards.math import _worker_main; _worker_main()"


def _worker_main() -> None:
    """Entry point of a worker process: JSON requests on stdin, JSON answers on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # keep stray prints off the protocol channel
    memory_mb = int(os.environ.get("EXPLORATION_TRL_MATH_WORKER_MB", "0") or 0)
    if memory_mb > 0:
        try:
            import resource

            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    _math_verify()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            status, value = _evaluate_guarded(request["gold"], request["candidates"], request.get("timeout"))
            reply = {"id": request.get("id"), "status": status, "value": value}
        except Exception as exc:  # noqa: BLE001
            reply = {"id": None, "status": "error", "value": f"bad request: {exc}"[:500]}
        try:
            out.write(json.dumps(reply) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):
            break


class _Worker:
    def __init__(self, memory_mb: int, startup_timeout: float):
        self.memory_mb = memory_mb
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.replies: queue.Queue | None = None
        self.next_id = 0

    def _start(self) -> None:
        env = dict(os.environ)
        paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["EXPLORATION_TRL_MATH_WORKER_MB"] = str(self.memory_mb)
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,  # no terminal signals (Ctrl-C) to the worker
            close_fds=True,
        )
        replies: queue.Queue = queue.Queue()

        def _reader(stream, sink):
            try:
                for line in stream:
                    sink.put(line)
            except (OSError, ValueError):
                pass
            sink.put(None)

        threading.Thread(target=_reader, args=(proc.stdout, replies), daemon=True).start()
        self.proc, self.replies = proc, replies
        try:
            line = replies.get(timeout=self.startup_timeout)
        except queue.Empty:
            line = None
        if not line or not json.loads(line).get("ready"):
            self.kill()
            raise RuntimeError("math-verify worker process failed to start")

    def kill(self) -> None:
        proc, self.proc, self.replies = self.proc, None, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(Exception):
                stream.close()

    def evaluate(self, gold_text: str, candidates: Sequence[str], timeout: float, grace: float) -> tuple[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            self._start()
        assert self.proc is not None and self.replies is not None
        self.next_id += 1
        request = {"id": self.next_id, "gold": gold_text, "candidates": list(candidates), "timeout": timeout}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.kill()
            return "error", "worker died"
        deadline = timeout + grace
        while True:
            try:
                line = self.replies.get(timeout=deadline)
            except queue.Empty:
                self.kill()  # stuck where the alarm cannot reach (C code): replace the worker
                return "timeout", None
            if line is None:
                self.kill()
                return "error", "worker died"
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue
            if reply.get("id") == self.next_id:
                return reply.get("status", "error"), reply.get("value")


class _WorkerPool:
    def __init__(self):
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._all: list[_Worker] = []

    def _acquire(self, memory_mb: int, startup_timeout: float) -> _Worker:
        with self._lock:
            for i, worker in enumerate(self._idle):
                if worker.memory_mb == memory_mb:
                    return self._idle.pop(i)
            worker = _Worker(memory_mb, startup_timeout)
            self._all.append(worker)
            return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def evaluate_many(
        self,
        jobs: Sequence[tuple[str, Sequence[str]]],
        timeout: float,
        grace: float,
        num_workers: int,
        memory_mb: int,
        startup_timeout: float,
    ) -> list[tuple[str, Any]]:
        results: list[tuple[str, Any]] = [("error", "not run")] * len(jobs)
        if not jobs:
            return results
        todo: queue.Queue = queue.Queue()
        for i in range(len(jobs)):
            todo.put(i)

        def _drain():
            worker = self._acquire(memory_mb, startup_timeout)
            try:
                while True:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        results[i] = worker.evaluate(jobs[i][0], jobs[i][1], timeout, grace)
                    except Exception as exc:  # noqa: BLE001 - e.g. a worker that cannot start
                        results[i] = ("error", f"{type(exc).__name__}: {exc}"[:500])
            finally:
                self._release(worker)

        n = max(1, min(num_workers, len(jobs)))
        threads = [threading.Thread(target=_drain, daemon=True) for _ in range(n - 1)]
        for t in threads:
            t.start()
        _drain()
        for t in threads:
            t.join()
        return results

    def shutdown(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            worker.kill()


_POOL = _WorkerPool()


def shutdown_math_workers() -> None:
    """Stop the math-verify worker processes (they are restarted on demand)."""
    _POOL.shutdown()


atexit.register(shutdown_math_workers)


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
