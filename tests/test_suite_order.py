"""tests/conftest.py: the file order handed to pytest-xdist and the torch threads of its workers."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import conftest

TESTS = Path(__file__).parent


def test_every_listed_file_exists_and_the_costs_are_positive():
    assert conftest.FILE_COST and all(c > 0 for c in conftest.FILE_COST.values())
    assert [f for f in conftest.FILE_COST if not (TESTS / f).is_file()] == []


def _items(*names):
    return [SimpleNamespace(path=TESTS / name, name=f"{name}::{i}") for i, name in enumerate(names)]


def test_workers_sort_by_cost_and_keep_the_order_within_a_file(monkeypatch):
    ranked = sorted(conftest.FILE_COST, key=lambda f: -conftest.FILE_COST[f])
    long, mid, cheap = ranked[0], ranked[1], ranked[-1]
    items = _items("test_unlisted_a.py", cheap, mid, "test_unlisted_b.py", long, mid, cheap, "test_unlisted_a.py")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == [f"{long}::4", f"{mid}::2", f"{mid}::5", f"{cheap}::1", f"{cheap}::6",
                                       "test_unlisted_a.py::0", "test_unlisted_b.py::3", "test_unlisted_a.py::7"]
    # Not a worker (a plain run, or the xdist controller): the collection order stays.
    items = _items("test_unlisted_a.py", cheap, long)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["test_unlisted_a.py::0", f"{cheap}::1", f"{long}::2"]


def test_the_controller_keeps_the_workers_order():
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True))  # xdist's default
    conftest.pytest_configure(config)
    assert config.option.loadscopereorder is False
    plain = SimpleNamespace(option=SimpleNamespace())  # without xdist nothing is added
    conftest.pytest_configure(plain)
    assert not hasattr(plain.option, "loadscopereorder")


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


def test_this_process_runs_the_threads_it_was_given():
    import torch

    if conftest.THREADS is None:  # a plain run, or OMP_NUM_THREADS set by the caller: torch's own choice
        assert "OMP_NUM_THREADS" not in os.environ or torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
    else:
        assert os.environ["OMP_NUM_THREADS"] == str(conftest.THREADS) and torch.get_num_threads() == conftest.THREADS
