"""The sandbox the code reward runs programs in: a fresh, resource-limited subprocess per program.

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
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

from exploration_trl.rewards._sandbox_child import CHILD_SOURCE

__all__ = ["SandboxResult", "run_in_sandbox", "sandbox_capabilities"]


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
        cmd = [sys.executable, "-I", "-B", "-c", CHILD_SOURCE]
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
