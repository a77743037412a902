"""The math reward's worker processes: math-verify off the main thread, where no alarm can interrupt it.

:func:`exploration_trl.rewards.math.math_accuracy` sends its work here when it runs outside the main thread (or with
``mode="process"``). A small pool of persistent workers (``sys.executable``, JSON lines over pipes) each runs
:func:`~exploration_trl.rewards.math_verifier._evaluate_guarded` with the alarm in its own main thread; the caller
kills and replaces a worker that has not answered ``grace`` seconds after the limit (a computation stuck in C code
cannot be interrupted by a signal). Workers start lazily (about a second to import sympy) and exit with the process
(:func:`shutdown_math_workers`, registered with ``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from exploration_trl.rewards.math_verifier import _evaluate_guarded, math_verify_module

__all__ = ["shutdown_math_workers"]

_WORKER_SOURCE = "from exploration_trl.rewards.math_pool import _worker_main; _worker_main()"


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
    math_verify_module()
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
    """One worker process, started on first use and restarted after it dies or is killed for running late."""

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
    """Idle workers kept for the next call, so that sympy is imported once per worker, not once per batch."""

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
