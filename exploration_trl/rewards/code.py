"""Code execution reward: run HumanEval-style unit tests on a completion in a sandboxed subprocess.

``code_execution(completions, test, entry_point, prompts=None, prompt=None)`` returns 1.0 when
``check(<entry_point>)`` from the row's ``test`` code passes, else 0.0.

Program assembled for each completion::

    <header>          # the HumanEval prompt (signature + docstring), see below
    <code>            # last ```python block (preferring one that defines entry_point), else raw text
    <test>            # defines check(candidate)
    check(<entry_point>)

The header (``prompt`` column, or TRL's ``prompts`` when they are strings) is prepended when the
code does not define ``def <entry_point>`` (the completion continues the function body). When the
code does define it and the header is valid Python, the header is still prepended, separated by a
blank line, so that its imports and helper functions exist; the completion's definition replaces
the stub. Conversational prompts contribute a header only through a ```python block in the last
user message that defines the entry point.

Every program runs in the sandbox of :mod:`exploration_trl.rewards.sandbox` (a fresh, resource-limited
``python -I -B`` subprocess per program; the code never runs in the trainer's process).

Completions that time out, are killed by a signal (memory/CPU limit, segfault) or cannot be run
score 0.0 and are counted by :func:`exploration_trl.rewards.pop_failure_counts` under
``code_execution``; ordinary failures (assertion errors, exceptions) are plain 0.0.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from exploration_trl.rewards.base import (
    broadcast_column,
    completion_to_text,
    record_failure,
)
from exploration_trl.rewards.sandbox import (
    SandboxResult,
    run_in_sandbox,
    sandbox_capabilities,
)

__all__ = [
    "SandboxResult",
    "build_program",
    "code_execution",
    "extract_code",
    "make_code_execution",
    "run_in_sandbox",
    "sandbox_capabilities",
]

REWARD_NAME = "code_execution"

# --------------------------------------------------------------------------------------------
# Program assembly
# --------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PY_LANGS = {"", "python", "python3", "py", "py3"}


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in ``text``: a fenced Python block if there is one, else ``text`` itself.

    Among the fenced blocks tagged python/py (or untagged), the last one defining
    ``entry_point`` wins, else the last one. An unterminated final fence (a truncated completion)
    counts as a block.
    """
    blocks = [body for lang, body in _FENCE_RE.findall(text) if lang.lower() in _PY_LANGS]
    if not blocks:
        return text
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return blocks[-1]


def _compiles(source: str) -> bool:
    try:
        compile(source, "<header>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def _header_from_prompt(prompt: Any, entry_point: str) -> str | None:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):  # conversation: look for a code block with the stub
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    blocks = [b for lang, b in _FENCE_RE.findall(content) if lang.lower() in _PY_LANGS]
                    defining = [b for b in blocks if _defines(b, entry_point)]
                    return defining[-1] if defining else None
                return None
    return None


def build_program(completion_text: str, test: str, entry_point: str, header: str | None = None) -> str:
    """The full program run in the sandbox for one completion (see the module docstring)."""
    code = extract_code(completion_text, entry_point)
    if header:
        if not _defines(code, entry_point):
            code = header + code
        elif _compiles(header):
            code = header.rstrip() + "\n\n\n" + code
    return f"{code}\n\n\n{test}\n\n\ncheck({entry_point})\n"


# --------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------


def _default_workers() -> int:
    return max(2, min(8, os.cpu_count() or 1))


def _score_batch(
    completions: Sequence[Any],
    test: Any,
    entry_point: Any,
    headers: Any,
    timeout: float,
    memory_mb: int,
    fsize_mb: int,
    nproc: int,
    max_workers: int | None,
) -> list[float]:
    if test is None or entry_point is None:
        raise ValueError("code_execution needs `test` and `entry_point` columns")
    n = len(completions)
    tests = broadcast_column(test, n)
    entries = broadcast_column(entry_point, n)
    header_col = broadcast_column(headers, n) if headers is not None else [None] * n

    rewards = [0.0] * n
    failures = 0
    programs: list[tuple[int, str]] = []
    for i in range(n):
        try:
            if not isinstance(tests[i], str) or not isinstance(entries[i], str) or not entries[i].isidentifier():
                raise ValueError("malformed test/entry_point")
            text = completion_to_text(completions[i])
            header = _header_from_prompt(header_col[i], entries[i])
            programs.append((i, build_program(text, tests[i], entries[i], header)))
        except Exception:  # noqa: BLE001 - never raise for a bad row
            failures += 1

    if programs:
        sandbox_capabilities()  # probe the machine once, before the worker threads start
        workers = max(1, min(max_workers or _default_workers(), len(programs)))
        run = functools.partial(run_in_sandbox, timeout=timeout, memory_mb=memory_mb, fsize_mb=fsize_mb, nproc=nproc)
        if workers == 1:
            results = [run(p) for _, p in programs]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-sandbox") as pool:
                results = list(pool.map(run, [p for _, p in programs]))
        for (i, _), result in zip(programs, results):
            rewards[i] = 1.0 if result.passed else 0.0
            failures += int(result.is_failure)
    record_failure(REWARD_NAME, failures)
    return rewards


def code_execution(
    completions: Sequence[Any],
    test: Any = None,
    entry_point: Any = None,
    prompts: Any = None,
    prompt: Any = None,
    *,
    timeout: float = 5.0,
    memory_mb: int = 512,
    fsize_mb: int = 16,
    nproc: int = 64,
    max_workers: int | None = None,
    **kwargs: Any,
) -> list[float]:
    """1.0 if the completion passes the row's HumanEval-style ``test``, else 0.0.

    Args:
        completions: plain strings or conversations (the last assistant message is used).
        test: test code defining ``check(candidate)``; ``entry_point``: the function's name.
        prompts / prompt: the function header (HumanEval ``prompt``); ``prompt`` (a dataset
            column passed directly) wins over TRL's ``prompts``.
        timeout: wall-clock seconds per program, interpreter start-up included.
        memory_mb / fsize_mb / nproc: address-space, file-size and process-count limits.
        max_workers: programs run in parallel (default: CPU count, between 2 and 8).
    """
    headers = prompt if prompt is not None else prompts
    return _score_batch(completions, test, entry_point, headers, timeout, memory_mb, fsize_mb, nproc, max_workers)


#: Read before training starts: the column it needs and the rewards it gives.
CODE_COLUMNS = [("test", "entry_point")]
code_execution.reward_columns = CODE_COLUMNS  # type: ignore[attr-defined]
code_execution.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]


def make_code_execution(
    timeout: float = 5.0,
    memory_mb: int = 512,
    max_workers: int | None = None,
    fsize_mb: int = 16,
    nproc: int = 64,
):
    """``code_execution`` with other sandbox limits (see :func:`code_execution`)."""
    if timeout <= 0:
        raise ValueError("timeout must be positive")

    def code_execution(completions, test=None, entry_point=None, prompts=None, prompt=None, **kwargs):
        headers = prompt if prompt is not None else prompts
        return _score_batch(completions, test, entry_point, headers, timeout, memory_mb, fsize_mb, nproc, max_workers)

    code_execution.reward_columns, code_execution.reward_range = CODE_COLUMNS, (0.0, 1.0)
    return code_execution
