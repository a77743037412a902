"""Suite-wide settings for `python -m pytest -q -n 2 --dist loadfile` (the command in README, docs/install.md, .ci/run).

Two things, both for pytest-xdist workers only; a plain `pytest` run is unchanged.

1. One torch thread per worker where the cores are shared. Each worker is a Python process running tiny models; with
   torch's default (one thread per core) two workers on two cores run four OpenMP threads that spin-wait on each
   other. `tests/test_new_methods.py` alone, on a busy 2-core machine: 110 s of CPU and 349 s wall with the default
   threads, 30 s of CPU and 194 s wall with one (the same observation as `experiments._common.set_threads`). A worker
   gets cores // workers threads (at least 1), through OMP_NUM_THREADS so that the processes it starts (CLI runs,
   scripts) get the same; an OMP_NUM_THREADS set by the caller is left alone.

2. The longest files first. `--dist loadfile` hands whole files to the workers from a queue, the next file to a worker
   with at most 2 tests left; the run ends when the last file does, so a long file handed out late makes a long tail.
   xdist orders that queue by number of tests per file (`--loadscope-reorder`, its default), which says little about
   time here (test_configs.py, handed out first: 85 tests, 0.4% of the suite's time; test_interrupt.py: 2 tests,
   3.7%). So the workers sort their collection by FILE_COST, longest first (a stable sort: tests keep their order
   within a file, and files not listed keep collection order after the listed ones), and the controller keeps that
   order (loadscopereorder off). On the measured durations the order gains little (simulated: 1245 s against 1263 s
   for xdist's own order, the bound being 1244 s), but it keeps a long file from being handed out last.
   FILE_COST holds the files that take about 1% of the suite or more, from one `--durations=0` run;
   `scripts/suite_makespan.py` prints a new table from such a run and simulates the scheduler with it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Seconds per file (its tests on one worker): `scripts/suite_makespan.py --costs --min-cost 20` on a run of
#: 2026-11-28 with the threads above (2 workers on a 2-core machine shared with training jobs: longer than on idle
#: cores; only the order matters here). The files not listed took under 1% of the suite each.
FILE_COST = {
    "test_multiprocess.py": 471,
    "test_offline_device_checks.py": 305,
    "test_resume.py": 199,
    "test_confirmatory.py": 119,
    "test_sync_budget.py": 112,
    "test_experiments_tree.py": 98,
    "test_wheel.py": 97,
    "test_interrupt.py": 92,
    "test_experiments_countdown.py": 87,
    "test_dynamic_sampling_mp.py": 85,
    "test_heldout_eval.py": 77,
    "test_confirmatory_report.py": 77,
    "test_new_methods.py": 57,
    "test_deepspeed_import.py": 46,
    "test_everyday_errors.py": 39,
    "test_cli.py": 39,
    "test_demo.py": 38,
    "test_curves.py": 38,
    "test_equivalence.py": 33,
    "test_dynamic_sampling.py": 31,
    "test_fsdp2_head.py": 30,
    "test_collectives.py": 29,
    "test_docs_site.py": 23,
    "test_methods_reference.py": 20,
}


def file_rank(path: str | Path) -> int:
    """Sort key of a test file: longest first; files not in FILE_COST after all listed ones."""
    return -FILE_COST.get(Path(path).name, 0)


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
    if THREADS is not None:
        import sys

        if "torch" in sys.modules:  # imported before this conftest (by a plugin): the variable came too late
            sys.modules["torch"].set_num_threads(THREADS)
    if getattr(config.option, "loadscopereorder", None) is not None:  # the xdist controller: keep the workers' order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: file_rank(item.path))
