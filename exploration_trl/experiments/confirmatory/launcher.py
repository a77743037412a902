"""The second protocol's launcher at HEAD (amendment 2): runs the frozen code of a `git archive` of the protocol
commit, job by job, and adds what the frozen driver cannot:

* **the platform of every segment**: before a job starts it appends a line to
  `<folder>/platforms/<phase>/<label>__seed<s>.jsonl` (this host's platform id, the step it resumes from) and one
  when it ends; `platforms/hosts/<id>.json` describes the platform (`platform.py`);
* **the same-platform check and the platform control** (`platform_rule.py`): on a platform not yet checked, GRPO
  seed 100 to step 200, compared with the committed record; if it differs, the control's 18 runs come first;
* **a lock per job and a slot per core**: a job runs only while its process holds `locks/<...>.lock` and one of
  `locks/slot-<i>.lock` (flock, inherited by the job's process, so a lock outlives a killed launcher and dies with
  its job); several launchers on one folder share the slots; a job that some other process runs (the frozen driver,
  found in /proc) is left alone and counts against the slots when it works on this run folder;
* **pause**: SIGTERM or Ctrl-C sends SIGINT to every job's process group (the jobs start with SIGINT at its
  default, which a background shell would have set to ignored), waits for them, then SIGTERM; a job resumes from its
  last complete checkpoint (one without `trainer_state.json`, cut by a kill, is moved aside first).
  `scripts/confirm_pause.sh` pauses everything and waits until nothing is left.

    python -m exploration_trl.experiments.confirmatory.launcher --archive /work/protocol_v2 \
        --output-dir /work/confirmatory_runs/countdown3_v2 --parallel 2
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import platform, platform_rule, protocol, provenance

POLL_S = 5.0
CHECK, CONTROL, CONFIRM = "check", "control", "confirm"
REPO = Path(__file__).resolve().parents[3]


def log(msg: str, output: Path | None = None) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
    print(line, flush=True)
    if output is not None:
        with open(Path(output) / "launcher.log", "a") as f:
            f.write(line + "\n")


# ------------------------------------------------------------------------------------------------- set-up
def check_archive(archive: Path, amendment: dict[str, Any], output: Path) -> str:
    """The archive is the protocol commit's, and its package source is the one every record names."""
    commit_file = archive / "exploration_trl" / "_commit.py"  # 4e6b608's name for what is now archive_commit.py
    if not commit_file.is_file():
        raise ValueError(f"--archive {archive}: no exploration_trl/_commit.py; extract `git archive 4e6b608` there")
    text = commit_file.read_text()
    if f'"{amendment["protocol_commit"]}' not in text:
        raise ValueError(f"--archive {archive}: not an archive of the protocol commit {amendment['protocol_commit']}")
    wanted = {json.loads(p.read_text())["provenance"]["source_hash"] for p in (output / "runs").glob("*__seed*.json")}
    got = provenance.source_hash(archive / "exploration_trl")
    if wanted and got not in wanted:
        raise ValueError(f"--archive {archive}: its package hashes to {got[:12]}, the records' to "
                         f"{sorted(wanted)[0][:12]}; extract a fresh `git archive` of the protocol commit")
    return got


def copy_start(output: Path, folder: Path) -> None:
    """The warm start and split of the run folder, into a check's or control's folder (the same files, so the same
    checksum in their records)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "warm_start").is_dir():
        shutil.copytree(output / "warm_start", folder / "warm_start")
    if (output / "split.json").is_file() and not (folder / "split.json").is_file():
        shutil.copyfile(output / "split.json", folder / "split.json")


def write_config(folder: Path, cfg: dict[str, Any]) -> Path:
    import yaml

    path = folder / "config.yaml"
    text = yaml.safe_dump(cfg, sort_keys=False)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------- jobs
def record_of(folder: Path, label: str, seed: int) -> dict[str, Any] | None:
    path = Path(folder) / "runs" / f"{label}__seed{seed}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def is_finished(job: dict[str, Any]) -> bool:
    rec = record_of(job["folder"], job["label"], job["seed"])
    return bool(rec and rec.get("finished"))


def foreign_jobs() -> set[tuple[str, str]]:
    """`(output dir, PHASE:LABEL:SEED)` of every frozen `--job` process on this machine (whoever started it)."""
    out = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "exploration_trl.experiments.confirmatory.command" in args and "--job" in args and "--output-dir" in args:
            out.add((str(Path(args[args.index("--output-dir") + 1]).resolve()), args[args.index("--job") + 1]))
    return out


def plan(output: Path, archive: Path, amendment: dict[str, Any], pid: str, scope: str) -> list[dict[str, Any]]:
    """The jobs this platform still has to run, in order: the same-platform check until it is decided, the platform
    control unless the check passed, then (scope `all`) the method arms in the protocol's order."""
    cfg = protocol.load(archive / "configs" / "confirmatory" / "countdown3_v2.yaml")
    jobs: list[dict[str, Any]] = []
    check_file = Path(output) / platform_rule.PLATFORMS / "checks" / f"{pid}.json"
    check = json.loads(check_file.read_text()) if check_file.is_file() else None
    if check is None:
        folder = platform_rule.check_folder(output, pid)
        c = amendment["same_platform_check"]
        jobs.append({"kind": CHECK, "folder": folder, "cfg": platform_rule.check_config(cfg, amendment),
                     "label": c["label"], "seed": int(c["seed"])})
    if check is None or not check["reproduces"]:
        folder = platform_rule.control_folder(output, pid)
        ctl = platform_rule.control_config(cfg, amendment)
        jobs += [{"kind": CONTROL, "folder": folder, "cfg": ctl, "label": ctl["baseline"], "seed": sd}
                 for sd in ctl["settings"][0]["seeds"]]
    if scope == "all":
        chosen = {k: v["chosen"] for k, v in json.loads((Path(output) / "selection.json").read_text())["settings"]
                  .items()}
        jobs += [{"kind": CONFIRM, "folder": Path(output), "cfg": None, "label": j["label"], "seed": j["seed"]}
                 for j in protocol.confirm_jobs(cfg, chosen)]
    return [j for j in jobs if not is_finished(j)]


def _lock(path: Path) -> int | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def set_aside_incomplete(folder: Path, label: str, seed: int) -> list[str]:
    """Move checkpoints cut by a kill (transformers writes `trainer_state.json` last) out of the resume's way."""
    moved = []
    ckpt = Path(folder) / "ckpt" / f"{label}__seed{seed}"
    for c in sorted(ckpt.glob("checkpoint-*")) if ckpt.is_dir() else []:
        if c.is_dir() and not (c / "trainer_state.json").is_file():
            target = c.with_name(f"incomplete-{c.name}-{int(time.time())}")
            c.rename(target)
            moved.append(target.name)
    return moved


def resume_step(folder: Path, label: str, seed: int) -> int:
    ckpt = Path(folder) / "ckpt" / f"{label}__seed{seed}"
    steps = [int(c.name.split("-")[1]) for c in ckpt.glob("checkpoint-*")] if ckpt.is_dir() else []
    return max(steps, default=0)


def append_segment(job: dict[str, Any], event: dict[str, Any]) -> None:
    path = platform_rule.segments_path(job["folder"], "confirm", job["label"], job["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **event}, sort_keys=True) + "\n")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(job: dict[str, Any], archive: Path, cfg_path: Path, fds: tuple[int, int]) -> subprocess.Popen:
    key = f"confirm:{job['label']}:{job['seed']}"
    log_path = Path(job["folder"], "logs", "confirm", f"{job['label']}__seed{job['seed']}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "exploration_trl.experiments.confirmatory.command", "--config", str(cfg_path),
           "--output-dir", str(job["folder"]), "--job", key]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(archive)}
    with open(log_path, "a") as f:
        return subprocess.Popen(cmd, cwd=archive, stdout=f, stderr=subprocess.STDOUT, env=env, pass_fds=fds,
                                start_new_session=True, preexec_fn=_default_sigint)


def finish_check(output: Path, job: dict[str, Any], pid: str, amendment: dict[str, Any]) -> dict[str, Any]:
    rec = record_of(job["folder"], job["label"], job["seed"])
    committed = record_of(output, job["label"], job["seed"])
    result = {"platform_id": pid, **platform_rule.compare_check(rec, committed,
                                                                [int(s) for s in amendment["same_platform_check"]
                                                                 ["steps"]])}
    path = Path(output) / platform_rule.PLATFORMS / "checks" / f"{pid}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


CGROUP = Path("/sys/fs/cgroup/cpu/protocol_runs")


def prioritise(group: Path = CGROUP, shares: int = 262144) -> str:
    """Put this launcher (and so every job it starts) in a cpu cgroup of very high weight, where the machine allows it.

    `nice -n 19` on the other work is not enough: with the kernel's autogroups each session gets an equal share
    whatever its nice value, and the jobs run in sessions of their own. Measured on 2 cores with four nice-19 test
    processes beside two jobs: 42% of a core per job, a 1,000-step run 530-574 s instead of 240 s; in the group,
    100% each. Returns what was done, for the log."""
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(shares))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        return f"no cpu cgroup ({e.strerror}): the jobs share the cores with everything else"
    return f"jobs in cpu cgroup {group} (cpu.shares {shares})"


# ---------------------------------------------------------------------------------------------- the loop
def run(archive: Path, output: Path, parallel: int, scope: str, root: Path = REPO) -> int:
    archive, output = Path(archive).resolve(), Path(output).resolve()
    amendment = platform_rule.load("countdown3_v2", root)
    if not (output / "warm_start" / "warm_start.json").is_file():
        raise ValueError(f"--output-dir {output}: no warm_start/; restore the records first "
                         "(confirmatory_state/README.md)")
    check_archive(archive, amendment, output)
    platform.check_environment(amendment["run_environment"])
    desc = platform.describe()
    pid = platform.platform_id(desc)
    host = output / platform_rule.PLATFORMS / "hosts" / f"{pid}.json"
    host.parent.mkdir(parents=True, exist_ok=True)
    host.write_text(json.dumps(desc, indent=1, sort_keys=True) + "\n")
    log(f"[launch] platform {pid}: {desc['cpu'].get('model_name')} ({desc['torch_cpu_capability']}), "
        f"{parallel} at a time, scope {scope}; {prioritise()}", output)
    running: dict[str, tuple[subprocess.Popen, dict[str, Any]]] = {}
    failures: dict[str, int] = {}
    stopping = {"now": False}

    def stop(*_):
        stopping["now"] = True

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping["now"]:
            for key, (proc, job) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[key]
                rec = record_of(job["folder"], job["label"], job["seed"]) or {}
                append_segment(job, {"event": "end", "platform_id": pid, "exit": code,
                                     "last_step": rec.get("last_step"), "finished": bool(rec.get("finished"))})
                if code == 0 and rec.get("finished"):
                    log(f"[launch] {key} done ({rec.get('seconds', 0):.0f} s)", output)
                    if job["kind"] == CHECK:
                        result = finish_check(output, job, pid, amendment)
                        log(f"[launch] same-platform check: {'reproduces' if result['reproduces'] else 'differs'} "
                            f"(first differing step {result['first_differing_step']})", output)
                else:
                    failures[key] = failures.get(key, 0) + 1
                    log(f"[launch] {key} failed (exit {code}, try {failures[key]} of 2): see its log", output)
            foreign = {(d, k) for d, k in foreign_jobs() if Path(d) == output or output in Path(d).parents}
            mine = {(str(j["folder"]), f"confirm:{j['label']}:{j['seed']}") for _, j in running.values()}
            busy = len(running) + len(foreign - mine)
            todo = [j for j in plan(output, archive, amendment, pid, scope)
                    if _key(j) not in running and failures.get(_key(j), 0) < 2
                    and (str(j["folder"]), f"confirm:{j['label']}:{j['seed']}") not in foreign]
            for job in todo:
                if busy >= parallel or stopping["now"]:
                    break
                slot = next((fd for fd in (_lock(output / "locks" / f"slot-{i}.lock") for i in range(parallel))
                             if fd is not None), None)
                if slot is None:
                    break
                lock = _lock(output / "locks" / f"{_key(job).replace(':', '__')}.lock")
                if lock is None:
                    os.close(slot)
                    continue
                if job["kind"] != CONFIRM:
                    copy_start(output, job["folder"])
                cfg_path = (archive / "configs" / "confirmatory" / "countdown3_v2.yaml" if job["cfg"] is None
                            else write_config(job["folder"], job["cfg"]))
                moved = set_aside_incomplete(job["folder"], job["label"], job["seed"])
                step = resume_step(job["folder"], job["label"], job["seed"])
                append_segment(job, {"event": "start", "platform_id": pid, "resume_from_step": step,
                                     "set_aside": moved})
                running[_key(job)] = (start(job, archive, cfg_path, (lock, slot)), job)
                os.close(lock)
                os.close(slot)
                busy += 1
                log(f"[launch] {_key(job)} {'resuming from ' + str(step) if step else 'starting'}", output)
            if not running and not todo:
                break
            time.sleep(POLL_S)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if running:
            pause(running, output)
    left = plan(output, archive, amendment, pid, scope)
    log(f"[launch] {'paused' if stopping['now'] else 'stopped'}; {len(left)} jobs left in scope {scope}", output)
    return 0 if not left else 1


def _key(job: dict[str, Any]) -> str:
    return f"{job['kind']}:{job['folder'].name if job['kind'] != CONFIRM else 'main'}:{job['label']}:{job['seed']}"


def pause(running: dict[str, tuple[subprocess.Popen, dict]], output: Path, grace_s: float = 120.0) -> None:
    """SIGINT to every job's process group, then SIGTERM after `grace_s`; waits until each has exited."""
    for proc, _ in running.values():
        _signal_group(proc.pid, signal.SIGINT)
    deadline = time.time() + grace_s
    for key, (proc, job) in running.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGTERM)
            proc.wait()
        rec = record_of(job["folder"], job["label"], job["seed"]) or {}
        append_segment(job, {"event": "end", "exit": proc.returncode, "paused": True,
                             "last_step": rec.get("last_step"), "finished": bool(rec.get("finished"))})
        log(f"[launch] {key} paused (exit {proc.returncode})", output)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exploration_trl.experiments.confirmatory.launcher",
                                description=__doc__.splitlines()[0])
    p.add_argument("--archive", required=True, help="A `git archive` of the protocol commit, extracted.")
    p.add_argument("--output-dir", required=True, help="The run folder (restored from confirmatory_state/).")
    p.add_argument("--parallel", type=int, default=2, help="Jobs at a time on this folder (default 2).")
    p.add_argument("--scope", choices=("control", "all"), default="all",
                   help="`control`: only this platform's check and control; `all` (default): then the method arms.")
    args = p.parse_args(argv)
    if args.parallel < 1:
        raise SystemExit(f"--parallel is {args.parallel}; it must be at least 1")
    try:
        return run(Path(args.archive), Path(args.output_dir), args.parallel, args.scope)
    except ValueError as e:
        print(f"launcher: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
