"""Suite-wide setting for `python -m pytest -q -n 2 --dist loadfile` (the command in README, docs/install.md, .ci/run).

One torch thread per pytest-xdist worker where the cores are shared among workers: each worker is a Python process
running tiny models, and with torch's default (one thread per core) two workers on two cores run four OpenMP threads
that wait on each other. A worker gets cores // workers threads (at least 1), through OMP_NUM_THREADS, so that the
processes a test starts (CLI runs, scripts, launches) get the same; an OMP_NUM_THREADS set by the caller is left
alone, and a plain `pytest` run (no workers) keeps torch's default.

Measured on 2026-11-28, a fresh clone on 2 idle cores, 1192 tests: 508 s with one thread per worker, 538 s and 584 s
(two runs) with torch's default. On a machine busy with other jobs the gap is larger (`test_new_methods.py` alone:
194 s wall with one thread, 349 s with two). `scripts/suite_makespan.py` replays the schedule from a `--durations=0`
run.
"""

from __future__ import annotations

import os


def worker_threads() -> int | None:
    """Torch threads for this process: None (torch's default) unless it is one of several xdist workers and the
    caller did not set OMP_NUM_THREADS."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // workers)


THREADS = worker_threads()  # decided once, before this module sets OMP_NUM_THREADS itself
if THREADS is not None:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)  # read by torch at import, and by every process a test starts


def pytest_configure(config):
    import sys

    if THREADS is not None and "torch" in sys.modules:  # imported before this conftest (by a plugin): too late
        sys.modules["torch"].set_num_threads(THREADS)  # for the variable, so set this process's threads directly
