"""tests/conftest.py: the torch threads of the suite's pytest-xdist workers."""

from __future__ import annotations

import os

import conftest


def test_threads_per_worker(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert conftest.worker_threads() is None  # a plain run: torch's default
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert conftest.worker_threads() is None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert conftest.worker_threads() == max(1, cores // 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(4 * cores))
    assert conftest.worker_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the caller's choice wins
    assert conftest.worker_threads() is None


def test_a_worker_passes_its_threads_to_the_processes_it_starts():
    if conftest.THREADS is not None:  # a worker of `-n 2`: the variable every subprocess inherits
        assert os.environ["OMP_NUM_THREADS"] == str(conftest.THREADS)
    else:  # a plain run, or OMP_NUM_THREADS set by the caller: nothing was changed
        assert "PYTEST_XDIST_WORKER_COUNT" not in os.environ or "OMP_NUM_THREADS" in os.environ
