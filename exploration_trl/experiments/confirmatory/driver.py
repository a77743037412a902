"""`confirm --parallel N`: the second protocol's runs, N at a time, each in its own process (one torch thread), in
the protocol's order (`protocol.py`: the selection, then the confirmation by priority), resumable.

The driver starts `exploration-trl confirm --job PHASE:LABEL:SEED` processes (through the command's own module) from the same Python and working
directory (so from the same code: a `git archive` of the protocol commit runs as itself), as long as fewer than N run
and a job is runnable: not finished, not running, and, for a tuned setting, its selection decided. When the
selection's last run finishes it writes `selection.json` (the rule of `protocol.choose`); when every run has
finished, the verdict. A killed driver is restarted with the same command: finished runs are skipped and each
unfinished one resumes from its last checkpoint. A job that fails is retried once, then left (the driver says so and
goes on); its log is `logs/<phase>/<label>__seed<s>.log`. Only one driver may work on an output folder at a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import _common
from . import protocol, runner

SELECTION_FILE = "selection.json"
#: Seconds between looks at the running jobs.
POLL_S = 5.0


def job_key(job: dict[str, Any]) -> str:
    return f"{job['phase']}:{job['label']}:{job['seed']}"


def parse_job(text: str, cfg: dict[str, Any], output: Path) -> dict[str, Any]:
    """The job named `PHASE:LABEL:SEED` (`--job`), with its overrides (a tuned one's from `selection.json`)."""
    try:
        phase, rest = text.split(":", 1)
        label, seed = rest.rsplit(":", 1)
        wanted = (phase, label, int(seed))
    except ValueError:
        raise ValueError(f"--job {text!r}: expected PHASE:LABEL:SEED, e.g. confirm:grpo:100") from None
    for job in plan(cfg, output):
        if (job["phase"], job["label"], job["seed"]) == wanted:
            if job["overrides"] is None:
                raise ValueError(f"--job {text}: the selection of {label} is not decided yet ({SELECTION_FILE})")
            return job
    raise ValueError(f"--job {text}: not a run of this protocol")


def chosen(output: Path) -> dict[str, dict] | None:
    path = Path(output) / SELECTION_FILE
    if not path.is_file():
        return None
    return {label: s["chosen"] for label, s in json.loads(path.read_text())["settings"].items()}


def plan(cfg: dict[str, Any], output: Path) -> list[dict[str, Any]]:
    jobs = protocol.selection_jobs(cfg) if cfg.get("selection") else []
    return jobs + protocol.confirm_jobs(cfg, chosen(output))


def finished(output: Path, job: dict[str, Any]) -> bool:
    _, path = runner.job_paths(output, job)
    if not path.is_file():
        return False
    return bool(json.loads(path.read_text()).get("finished"))


def decide_selection(cfg: dict[str, Any], output: Path, log) -> bool:
    """Write `selection.json` once every selection run has finished (and not before); True when it exists."""
    path = Path(output) / SELECTION_FILE
    if path.is_file():
        return True
    jobs = protocol.selection_jobs(cfg)
    if not all(finished(output, j) for j in jobs):
        return False
    decision = protocol.choose(cfg, runner.collect(output, "selection"))
    _common.write_json(path, decision)
    for label, s in decision["settings"].items():
        effects = ", ".join(f"{v['label']}: " + ("outside" if v["effect"] is None else f"{100 * v['effect']:+.2f}")
                            for v in s["grid"])
        log(f"[confirm] selection: {label} -> {s['chosen_label']} ({effects}; {s['reason']})")
    return True


def _start(cfg_path: str, output: Path, job: dict[str, Any], quick: bool) -> subprocess.Popen:
    sub = "selection" if job["phase"] == "selection" else "confirm"
    log_path = Path(output, "logs", sub, f"{job['label']}__seed{job['seed']}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "exploration_trl.experiments.confirmatory.command", "--config", cfg_path,
           "--output-dir", str(output), "--job", job_key(job)] + (["--quick"] if quick else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log_path, "a") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def run(cfg_path: str, cfg: dict[str, Any], output: Path, workers: int, log, quick: bool = False) -> int:
    """Run every job of the protocol, `workers` at a time; returns 0 when all have finished (the verdict written),
    1 when some failed twice."""
    from .analysis import write_verdict

    output = Path(output)
    runner.warm_start(cfg, output, log)  # once, before the workers, which all read it
    running: dict[str, tuple[subprocess.Popen, dict]] = {}
    failures: dict[str, int] = {}

    def stop(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            if cfg.get("selection"):
                decide_selection(cfg, output, log)
            for key, (proc, job) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[key]
                if code == 0 and finished(output, job):
                    log(f"[confirm] {key} done")
                else:
                    failures[key] = failures.get(key, 0) + 1
                    log(f"[confirm] {key} failed (exit {code}, try {failures[key]} of 2): see logs/")
            todo = [j for j in plan(cfg, output) if j["overrides"] is not None and job_key(j) not in running
                    and failures.get(job_key(j), 0) < 2 and not finished(output, j)]
            while todo and len(running) < workers:
                job = todo.pop(0)
                how = "resuming" if runner.job_paths(output, job)[1].exists() else "starting"
                log(f"[confirm] {job_key(job)} {how} ({len(running) + 1} of {workers} running)")
                running[job_key(job)] = (_start(cfg_path, output, job, quick), job)
            if not running:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        # Ctrl-C or a kill of the driver: the runs stop as Ctrl-C stops a trainer; each resumes from its last
        # checkpoint when the same command runs again.
        for proc, _ in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        log(f"[confirm] stopped; {len(running)} runs interrupted (they resume when the same command runs again)")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    left = [job_key(j) for j in plan(cfg, output) if not finished(output, j)]
    if left:
        log(f"[confirm] {len(left)} runs not finished ({', '.join(left[:5])}{' ...' if len(left) > 5 else ''}); "
            "run the same command again to resume them")
        return 1
    write_verdict(cfg, output, log)
    return 0
