"""Estimate the wall time of `pytest -n N --dist loadfile` from one run's `--durations=0` output.

    python -m pytest -q -n 2 --dist loadfile --durations=0 > durations.txt
    python scripts/suite_makespan.py durations.txt            # per-file costs, then the simulated makespans

The per-test times (setup + call + teardown; a module fixture is charged to the first test that uses it) are summed
per file, and xdist's LoadFileScheduling is replayed: the files form a queue; each worker starts with one file and
takes the next one whenever it has at most 2 tests left to run (xdist's low-water mark), so a worker can take a file
while another is about to be free. The queue is simulated in three orders:
- `xdist default`: files sorted by number of tests, largest first (xdist's `--loadscope-reorder`, on by default);
- `collection`: the files in collection order (`--no-loadscope-reorder`, the tests' own order);
- `longest first`: the files by their measured cost (what a conftest hook could impose; on 2026-11-28's idle-core
  run it gained 2 s of 526, so the suite keeps xdist's default).
The within-file test order and the file list come from `pytest --collect-only -q` (run here unless --collect names
a saved output). Worker start-up and collection are not in the durations; the estimate leaves them out.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")
ROOT = Path(__file__).resolve().parent.parent


def read_durations(path: Path) -> dict[str, float]:
    """{nodeid: setup + call + teardown seconds} from a `--durations=0` report."""
    out: dict[str, float] = defaultdict(float)
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        if m and "::" in m.group(3):
            out[m.group(3)] += float(m.group(1))
    return dict(out)


def collect(collect_file: Path | None) -> list[str]:
    if collect_file is None:
        text = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist"], check=False,
                              cwd=ROOT, capture_output=True, text=True).stdout
    else:
        text = collect_file.read_text()
    return [ln.strip() for ln in text.splitlines() if "::" in ln and not ln.startswith(" ")]


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def simulate(files: list[str], tests: dict[str, list[float]], workers: int) -> tuple[float, list[list[str]]]:
    """Replay LoadFileScheduling: returns (makespan, files per worker in the order they ran)."""
    queue = list(files)
    pending: list[list[float]] = [[] for _ in range(workers)]  # per worker: durations of tests not yet finished
    taken: list[list[str]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def assign(w: int) -> None:
        f = queue.pop(0)
        taken[w].append(f)
        pending[w].extend(tests[f])

    for w in range(min(workers, len(queue))):
        assign(w)
    for w in range(workers):
        if queue and len(pending[w]) <= 2:
            assign(w)
    # Event loop: the worker whose current test ends first reports it; the scheduler may hand it the next file.
    while True:
        busy = [w for w in range(workers) if pending[w]]
        if not busy:
            break
        w = min(busy, key=lambda i: clock[i] + pending[i][0])
        clock[w] += pending[w].pop(0)
        if queue and len(pending[w]) <= 2:
            assign(w)
    return max(clock), taken


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("durations", type=Path, help="output of a pytest run with --durations=0")
    p.add_argument("--collect", type=Path, help="saved `pytest --collect-only -q` output (default: run it)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--top", type=int, default=15, help="files to list (default 15)")
    a = p.parse_args(argv)

    durations = read_durations(a.durations)
    order = collect(a.collect)
    missing = [n for n in order if n not in durations]
    if missing:
        print(f"note: {len(missing)} collected tests have no duration (counted as 0 s), e.g. {missing[0]}",
              file=sys.stderr)
    tests: dict[str, list[float]] = {}
    for nodeid in order:
        tests.setdefault(file_of(nodeid), []).append(durations.get(nodeid, 0.0))
    cost = {f: sum(d) for f, d in tests.items()}
    total = sum(cost.values())

    print(f"{len(order)} tests in {len(tests)} files, {total:.0f} s of test time "
          f"(lower bound on {a.workers} workers: {max(total / a.workers, max(cost.values())):.0f} s)")
    for f, c in sorted(cost.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {c:7.1f} s  {100 * c / total:4.1f}%  {len(tests[f]):4d} tests  {f}")

    files = list(tests)  # collection order
    xdist_default = sorted(files, key=lambda f: -len(tests[f]))  # stable, as xdist's sorted()
    by_cost = sorted(files, key=lambda f: -cost[f])
    for name, queue in (("xdist default", xdist_default), ("collection", files), ("longest first", by_cost)):
        span, taken = simulate(queue, tests, a.workers)
        print(f"{name:>14}: makespan {span:6.0f} s  (" + ", ".join(
            f"worker {w}: {sum(cost[f] for f in t):.0f} s, last {Path(t[-1]).name if t else '-'}"
            for w, t in enumerate(taken)) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
