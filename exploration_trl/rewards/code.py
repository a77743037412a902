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

Sandbox (Linux/POSIX; the code never runs in the trainer's process):

* a fresh ``sys.executable -I -B`` process per program, in its own session/process group, with a
  fresh temporary working directory that is deleted afterwards and a minimal environment
  (no proxies, ``HOME``/``TMPDIR`` inside the sandbox);
* when ``unshare --net --pid --fork --kill-child`` works (root with CAP_SYS_ADMIN, e.g. dev and
  CI), the process runs in new network and PID namespaces: no network interfaces at all, and every
  process it starts dies with it;
* resource limits set by the child itself before any user code runs (``preexec_fn`` is not safe
  with the worker threads that drive the subprocesses): ``RLIMIT_AS`` = ``memory_mb``,
  ``RLIMIT_CPU`` = ceil(timeout) + 1 s, ``RLIMIT_NPROC`` = ``nproc``, ``RLIMIT_FSIZE`` =
  ``fsize_mb``, ``RLIMIT_CORE`` = 0;
* when running as root, the child drops to ``nobody`` (root ignores ``RLIMIT_NPROC``, so this is
  what makes the process limit contain fork bombs); if the interpreter is not readable by
  ``nobody`` (e.g. installed under ``/root``), the child keeps only ``CAP_DAC_READ_SEARCH`` (read
  access) so imports still work; ``PR_SET_NO_NEW_PRIVS`` is set. Which of these works is probed
  once per process;
* in the child, before user code: ``socket`` creation/resolution, process creation
  (``os.system``, ``fork``, ``exec*``, ``spawn*``, ``subprocess.Popen``, ...), ``kill`` and
  ``setsid`` raise ``PermissionError``; without a privilege drop, file deletion/renaming/chmod
  raise too; proxy variables are removed; stdin is empty and user output is discarded;
* the parent enforces the wall-clock ``timeout`` (covering interpreter start-up too) and then
  ``SIGKILL``s the whole process group;
* success is reported on a private descriptor with a per-run random token, so ``exit(0)`` or
  ``os._exit(0)`` before the tests run does not count as a pass. (This is a guard against reward
  hacking by accident, not against a determined adversary inside the process.)

Completions that time out, are killed by a signal (memory/CPU limit, segfault) or cannot be run
score 0.0 and are counted by :func:`exploration_trl.rewards.pop_failure_counts` under
``code_execution``; ordinary failures (assertion errors, exceptions) are plain 0.0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from exploration_trl.rewards._base import (
    broadcast_column,
    completion_to_text,
    record_failure,
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
# The child side (source run with ``python -I -B -c``)
# --------------------------------------------------------------------------------------------

_RUNNER = r"""
import json, os, sys

def _sandbox_main():
    cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    token = ("PASS " + cfg.pop("nonce") + "\n").encode()
    null_fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(null_fd, 0)
    result_fd = os.dup(1)          # the parent's result file
    os.dup2(null_fd, 1)            # user output is discarded
    import signal, resource
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # oversize writes fail instead of killing us

    def limit(name, soft, hard=None):
        which = getattr(resource, name, None)
        if which is None or soft is None:
            return
        hard = soft if hard is None else hard
        try:
            current = resource.getrlimit(which)[1]
            if current != resource.RLIM_INFINITY:  # cannot raise a hard limit: clamp to it
                soft, hard = min(soft, current), min(hard, current)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

    mb = 1024 * 1024
    limit("RLIMIT_CORE", 0)
    limit("RLIMIT_CPU", cfg["cpu_seconds"], cfg["cpu_seconds"] + 1)
    limit("RLIMIT_FSIZE", cfg["fsize_mb"] * mb if cfg["fsize_mb"] else None)
    limit("RLIMIT_NPROC", cfg["nproc"] or None)
    limit("RLIMIT_AS", cfg["memory_mb"] * mb if cfg["memory_mb"] else None)

    drop = cfg.get("drop")
    if drop:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        keep_read = drop["mode"] == "read_cap"
        if keep_read:
            libc.prctl(8, 1, 0, 0, 0)                     # PR_SET_KEEPCAPS
        os.setgroups([])
        os.setgid(drop["gid"])
        os.setuid(drop["uid"])
        if keep_read:
            class _Hdr(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class _Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]
            hdr = _Hdr(0x20080522, 0)                     # _LINUX_CAPABILITY_VERSION_3
            data = (_Data * 2)()
            data[0].effective = data[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH only
            if libc.capset(ctypes.byref(hdr), data) != 0:
                os._exit(97)
            libc.prctl(8, 0, 0, 0, 0)
        if libc.prctl(38, 1, 0, 0, 0) != 0:               # PR_SET_NO_NEW_PRIVS
            os._exit(97)
        if os.getuid() == 0 or os.geteuid() == 0:
            os._exit(97)

    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            del os.environ[key]

    def blocked(name):
        def _blocked(*args, **kwargs):
            raise PermissionError(name + " is disabled in the sandbox")
        _blocked.__name__ = name
        return _blocked

    def disable(module, names):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, blocked(module.__name__ + "." + name))

    import socket, _socket, subprocess, posix, shutil
    net = ["socket", "socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo",
           "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"]
    disable(socket, net)
    disable(_socket, net)
    procs = ["system", "popen", "fork", "forkpty", "vfork", "execv", "execve", "execl", "execle",
             "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
             "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "kill",
             "killpg", "setsid", "setpgid", "setpgrp", "setuid", "setgid", "setreuid", "setresuid"]
    disable(os, procs)
    disable(posix, procs)
    disable(subprocess, ["Popen", "call", "check_call", "check_output", "run", "getoutput",
                         "getstatusoutput"])
    try:
        import _posixsubprocess
        disable(_posixsubprocess, ["fork_exec"])
    except ImportError:
        pass
    if not drop:
        files = ["remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
                 "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "chroot",
                 "link", "symlink"]
        disable(os, files)
        disable(posix, files)
        disable(shutil, ["rmtree", "move", "chown", "copytree"])

    program = cfg.pop("program")
    namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    try:
        code = compile(program, "solution.py", "exec")
        del program, cfg
        exec(code, namespace)
    except BaseException:
        try:
            import traceback
            traceback.print_exc(limit=5)
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(1)
    os.write(result_fd, token)
    os._exit(0)

_sandbox_main()
"""


# --------------------------------------------------------------------------------------------
# The parent side
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    ``status``: ``"passed"``, ``"failed"`` (the tests failed or the code raised), ``"timeout"``,
    ``"crashed"`` (killed by a signal, e.g. a resource limit) or ``"error"`` (could not run).
    """

    status: str
    returncode: int | None
    elapsed: float
    stderr: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def is_failure(self) -> bool:
        """True when no verdict was reached (counted as a scoring failure)."""
        return self.status in ("timeout", "crashed", "error")


@dataclasses.dataclass(frozen=True)
class _Caps:
    unshare: str | None  # path of unshare when namespaces work
    drop: dict | None  # {"mode": "plain"|"read_cap", "uid":, "gid":} when dropping privileges


_CAPS_LOCK = threading.Lock()
_CAPS: _Caps | None = None


def _nobody() -> tuple[int, int] | None:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return None


_PROBE_PROGRAM = (
    "import fractions, statistics, heapq, decimal\n"
    "with open('probe.txt', 'w') as fh:\n"
    "    fh.write('ok')\n"
    "assert open('probe.txt').read() == 'ok'\n"
)


def sandbox_capabilities() -> dict:
    """What the sandbox uses on this machine (probed once): ``{"namespaces": bool, "drop": mode}``."""
    caps = _capabilities()
    return {"namespaces": caps.unshare is not None, "drop": caps.drop["mode"] if caps.drop else None}


def _capabilities() -> _Caps:
    global _CAPS
    with _CAPS_LOCK:
        if _CAPS is not None:
            return _CAPS
        unshare = None
        exe = shutil.which("unshare")
        if exe and sys.platform.startswith("linux"):
            cmd = [exe, "--net", "--pid", "--fork", "--kill-child", "--", sys.executable, "-I", "-c", "pass"]
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
                if done.returncode == 0:
                    unshare = exe
        drop = None
        ids = _nobody()
        if ids is not None and hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux"):
            for mode in ("plain", "read_cap"):
                candidate = {"mode": mode, "uid": ids[0], "gid": ids[1]}
                probe = _run(_PROBE_PROGRAM, 30.0, 512, 16, 64, _Caps(unshare, candidate))
                if probe.passed:
                    drop = candidate
                    break
            if drop is None:
                warnings.warn(
                    "code_execution: running as root but could not drop privileges for the sandbox; "
                    "RLIMIT_NPROC is not enforced for root, so only the Python-level guards, the process "
                    "group kill and (if available) the PID namespace contain process creation.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _CAPS = _Caps(unshare, drop)
        return _CAPS


def _rmtree(path: str) -> None:
    def _retry(func, target, _exc):
        with contextlib.suppress(OSError):
            parent = os.path.dirname(target)
            os.chmod(parent, stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            func(target)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_retry)
    else:
        shutil.rmtree(path, onerror=_retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pgid, signal.SIGKILL)


def _wait_no_reap(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until ``proc`` exits or ``deadline``; True if it exited. The zombie is not reaped, so
    its process-group id cannot be reused before :func:`_kill_group`."""
    if not hasattr(os, "waitid"):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    delay = 0.002
    while True:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 1.5, 0.02)


def _run(program: str, timeout: float, memory_mb: int, fsize_mb: int, nproc: int, caps: _Caps) -> SandboxResult:
    start = time.monotonic()
    base = tempfile.mkdtemp(prefix="exploration-trl-sandbox-")
    proc = None
    try:
        os.chmod(base, 0o711)
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        if caps.drop:
            os.chown(work, caps.drop["uid"], caps.drop["gid"])
        nonce = secrets.token_hex(16)
        payload = json.dumps(
            {
                "nonce": nonce,
                "program": program,
                "cpu_seconds": math.ceil(timeout) + 1,
                "memory_mb": int(memory_mb or 0),
                "fsize_mb": int(fsize_mb or 0),
                "nproc": int(nproc or 0),
                "drop": caps.drop,
            }
        ).encode("utf-8")
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": work,
            "TMPDIR": work,
            "PYTHONIOENCODING": "utf-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "no_proxy": "*",
            "NO_PROXY": "*",
        }
        cmd = [sys.executable, "-I", "-B", "-c", _RUNNER]
        if caps.unshare:
            cmd = [caps.unshare, "--net", "--pid", "--fork", "--kill-child", "--"] + cmd
        result_path = os.path.join(base, "result")
        stderr_path = os.path.join(base, "stderr")
        with open(result_path, "wb+") as out, open(stderr_path, "wb+") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=work,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
            deadline = start + timeout
            try:
                try:
                    proc.stdin.write(payload)
                    proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
                exited = _wait_no_reap(proc, deadline)
            finally:
                _kill_group(proc.pid)
                proc.wait()
            elapsed = time.monotonic() - start
            out.seek(0)
            head = out.read(4096).decode("utf-8", "replace")
            err.seek(0, os.SEEK_END)
            size = err.tell()
            err.seek(max(0, size - 2000))
            stderr_tail = err.read().decode("utf-8", "replace")
        rc = proc.returncode
        if not exited:
            return SandboxResult("timeout", rc, elapsed, stderr_tail)
        if f"PASS {nonce}" in head and rc == 0:
            return SandboxResult("passed", rc, elapsed, stderr_tail)
        if rc is not None and (rc < 0 or rc > 128 or rc == 97):
            return SandboxResult("crashed", rc, elapsed, stderr_tail)
        return SandboxResult("failed", rc, elapsed, stderr_tail)
    except Exception as exc:  # noqa: BLE001 - infrastructure problems are failures, not crashes
        if proc is not None:
            _kill_group(proc.pid)
        return SandboxResult("error", None, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
    finally:
        _rmtree(base)


def run_in_sandbox(
    program: str,
    *,
    timeout: float = 5.0,
    memory_mb: int = 512,
    fsize_mb: int = 16,
    nproc: int = 64,
) -> SandboxResult:
    """Run ``program`` in the sandbox described in the module docstring."""
    return _run(program, timeout, memory_mb, fsize_mb, nproc, _capabilities())


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
        caps = _capabilities()
        workers = max(1, min(max_workers or _default_workers(), len(programs)))
        run = functools.partial(_run, timeout=timeout, memory_mb=memory_mb, fsize_mb=fsize_mb, nproc=nproc, caps=caps)
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
