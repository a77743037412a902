"""One command for a lent GPU machine: the offline smoke test and the overhead benchmark, within a time cap.

Run through `scripts/gpu_validate.sh` (see it, and docs/gpu_validation.md, for the arguments). Standard library only:
the packages the runs need may be installed by this script first, from a folder of wheels, without network.

Stages, in order (each item is written to the report as soon as it is known, so a run stopped at the cap, or
killed, leaves what it measured):

1. install the carried wheels (`pip install --no-index --find-links WHEELS -r scripts/gpu_wheels.txt`), then check
   that the packages import and read the method registry (`exploration_trl.methods.METHODS`);
2. build the model once, offline: Qwen2.5-0.5B's architecture at random weights (`--dry-run`: the toy architecture);
3. `benchmarks/overhead.py --device cuda` (`--dry-run`: `--dry-run`) for TRL and every registered method (or those
   of `--methods`), first at `logging_steps: 10` for all, then on every step; a method that raises is recorded as
   failed and the others go on;
4. the smoke test of the first method (`scripts/gpu_smoke.sh`): full fine-tuning, then
   `exploration-trl eval` of the model;
5. while time is left (not in `--dry-run`): the first method's LoRA run and the eval of its adapter, then the smoke
   test (full fine-tuning) of every other method.

`--large-only` runs stages 1 and 3 only, with the large workload (`overhead.py --large`: 2,048 completion tokens at
Qwen2.5's 151,936-token vocabulary, TRL and the methods whose extra work grows with T or V, `logging_steps: 10`):
its generating steps take about a minute each, so it is a call of its own.

The cap covers all of it: a stage that would run past it is stopped (SIGTERM to its process group), and what was
not reached is listed as not run. Outputs, four files (a lent machine sends back only a few): `gpu_validate.json`,
`gpu_validate.md`, `overhead.json` (with each failed trial's traceback) and `logs.tar.gz` (every stage's log:
pip_install, probe, build_model, overhead, one per smoke run), repacked after each stage. Models and checkpoints stay
in a temporary folder that is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "exploration_trl/gpu_validate/v1"
JSON_FILE, MD_FILE, OVERHEAD_FILE, LOGS_FILE = "gpu_validate.json", "gpu_validate.md", "overhead.json", "logs.tar.gz"
WHEELS_FILE = REPO / "scripts" / "gpu_wheels.txt"
DEFAULT_WHEELS = REPO / "shared" / "wheels"
DEFAULT_CAP_MIN = 8.0
#: Seconds kept at the end of the cap to stop the stage in flight and write the report.
MARGIN_S = 12.0
#: What the runs import; a missing one stops the script before any GPU work.
NEEDED = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "math_verify", "sacrebleu", "matplotlib")
#: Per mode: the model, the smoke test's settings, whether the LoRA run and the other methods get a smoke run too
#: (the dry run leaves them out to stay near 2 minutes; the overhead stage covers every method), and the seconds one
#: smoke run is expected to take before any has run (a run is not started with less time left).
SIZES = {
    "device": {"model": "qwen2.5-0.5b", "dtype": "bfloat16", "smoke_others": True,
               "smoke_run_s": 45.0,
               "smoke": {"SMOKE_MAX_STEPS": "2", "SMOKE_MAX_COMPLETION_LENGTH": "128", "SMOKE_VLLM": "auto"}},
    "dry-run": {"model": "toy", "dtype": "float32", "smoke_others": False,
                "smoke_run_s": 15.0,
                "smoke": {"SMOKE_MAX_STEPS": "1", "SMOKE_MAX_COMPLETION_LENGTH": "8", "SMOKE_VLLM": "0",
                          "SMOKE_ALLOW_CPU": "1", "SMOKE_LAUNCHER": "python"}},
}
RECORD = re.compile(r"^(?P<run>train \S+|eval-\S+)\s+(?P<status>PASS|FAIL)\s+(?P<seconds>\d+)s\s+(?P<log>\S+)\s*$")
PROBE = r"""
import importlib, importlib.metadata as md, json, platform, sys
missing = []
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
    except Exception as e:
        missing.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
if missing:
    print("MISSING " + "; ".join(missing))
    sys.exit(3)
import torch
import exploration_trl, exploration_trl.trainers
from exploration_trl.methods import METHODS
versions = {}
for name in ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "math-verify", "vllm", "deepspeed"):
    try:
        versions[name] = md.version(name)
    except md.PackageNotFoundError:
        versions[name] = None
versions["exploration_trl"] = exploration_trl.__version__
versions["python"] = platform.python_version()
cuda = torch.cuda.is_available()
print("PROBE " + json.dumps({"methods": list(METHODS), "versions": versions, "cuda": cuda,
                             "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                             "cuda_version": torch.version.cuda}))
"""


class Stop(Exception):
    """SIGTERM or SIGINT to this script: write the report and stop."""


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/gpu_validate.sh", description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=None, metavar="MINUTES",
                   help=f"time cap for everything, in minutes (default {DEFAULT_CAP_MIN:g}; --dry-run: 5)")
    p.add_argument("--wheels", default=None, metavar="DIR",
                   help="folder of carried wheels, installed without network (default: $GPU_VALIDATE_WHEELS, else "
                        "shared/wheels when it exists; none: nothing is installed)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: $OUT when set, else outputs/gpu_validate)")
    p.add_argument("--dry-run", action="store_true",
                   help="the same stages on CPU with a tiny model and workload (checks the code, not the numbers)")
    p.add_argument("--workdir", default=None, help="folder for models and checkpoints (default: a temporary one)")
    p.add_argument("--methods", default=None, metavar="M1,M2",
                   help="only these methods (registered names, or advantage+loss compositions), in this order: the "
                        "first gets the smoke test (default: every registered method)")
    p.add_argument("--large-only", action="store_true",
                   help="only the large overhead workload (2,048 completion tokens at Qwen2.5's 151,936 vocabulary, "
                        "TRL and a few methods, logging_steps 10): its own call of a lent machine, no smoke runs")
    args = p.parse_args(argv)
    if args.cap is not None and not args.cap > 0:
        p.error(f"--cap is {args.cap:g} but must be > 0 (minutes)")
    args.cap = args.cap if args.cap is not None else (5.0 if args.dry_run else DEFAULT_CAP_MIN)
    if args.methods is not None:
        args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        if not args.methods:
            p.error("--methods is empty; name at least one method, e.g. --methods casp,kl_cov")
        if args.large_only:
            p.error("--methods does not apply to --large-only (it measures overhead_device.LARGE_METHODS); leave "
                    "one of them out")
    wheels = args.wheels or os.environ.get("GPU_VALIDATE_WHEELS")
    if wheels and not Path(wheels).is_dir():
        p.error(f"--wheels {wheels} is not a folder; collect the wheels as docs/gpu_validation.md says, or leave "
                "--wheels out when the packages are installed")
    args.wheels = Path(wheels) if wheels else (DEFAULT_WHEELS if DEFAULT_WHEELS.is_dir() else None)
    args.out = Path(args.out or os.environ.get("OUT") or REPO / "outputs" / "gpu_validate")
    return args


class Validation:
    def __init__(self, args):
        self.args = args
        self.mode = "dry-run" if args.dry_run else "device"
        self.sizes = SIZES[self.mode]
        self.started = time.time()
        self.deadline = self.started + 60.0 * args.cap
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = Path(tempfile.mkdtemp(prefix="gpu_validate_logs_"))  # packed into LOGS_FILE, not sent one by one
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get(
            "PYTHONPATH")])]), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.report = {"schema": SCHEMA, "mode": self.mode, "large_only": args.large_only,
                       "cap_s": round(60.0 * args.cap), "seconds": 0.0,
                       "stopped_at_cap": False, "not_run": [], "error": None, "commit": _commit(),
                       "install": None, "probe": None, "methods": [], "smoke": [], "overhead": None}

    # ------------------------------------------------------------------------------------------------ helpers
    def left(self) -> float:
        return self.deadline - MARGIN_S - time.time()

    def say(self, text: str) -> None:
        print(f"[gpu_validate {time.time() - self.started:5.0f}s/{60 * self.args.cap:.0f}s] {text}", flush=True)

    def stream(self, cmd: list[str], env: dict | None = None, log: Path | None = None) -> tuple[int | None, list[str]]:
        """Run `cmd` in its own process group, echoing its output; stop it (SIGTERM, then SIGKILL) at the cap.
        Returns `(exit status or None when stopped at the cap, output lines)`."""
        proc = subprocess.Popen(cmd, cwd=REPO, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        lines: list[str] = []
        sink = open(log, "w", encoding="utf-8") if log else None  # noqa: SIM115 - closed below

        def pump():
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if sink:
                    sink.write(line)
                print("    " + line, end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        stopped = False
        try:
            proc.wait(timeout=max(1.0, self.deadline - 3.0 - time.time()))
        except subprocess.TimeoutExpired:
            stopped = True
            self.say(f"time cap: stopping {' '.join(cmd[:3])} ...")
        except Stop:
            stopped = True
            self._kill(proc)
            raise
        finally:
            if stopped:
                self._kill(proc)
            reader.join(timeout=10)
            if sink:
                sink.close()
        return (None if stopped else proc.returncode), lines

    @staticmethod
    def _kill(proc) -> None:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                return
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue

    def write(self) -> None:
        self.report["seconds"] = round(time.time() - self.started, 1)
        _atomic(self.out / JSON_FILE, json.dumps(self.report, indent=1) + "\n")
        _atomic(self.out / MD_FILE, markdown(self.report))
        tmp = self.out / (LOGS_FILE + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for log in sorted(self.logs.iterdir()):
                tar.add(log, arcname=f"logs/{log.name}")
        tmp.replace(self.out / LOGS_FILE)

    def not_run(self, what: str) -> None:
        self.report["not_run"].append(what)
        self.report["stopped_at_cap"] = True
        self.say(f"time cap: {what} not run")

    # ------------------------------------------------------------------------------------------------ stages
    def install(self) -> bool:
        wheels = self.args.wheels
        if wheels is None:
            self.report["install"] = {"wheels": None, "status": "skipped: no wheels folder"}
            return True
        python = sys.executable
        log = self.logs / "pip_install.log"
        base = [python, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                "--disable-pip-version-check"]
        self.say(f"installing the wheels of {wheels} (no network) ...")
        rc, lines = self.stream([*base, "-r", str(WHEELS_FILE)], log=log)
        status = "installed"
        if rc not in (0, None) and any("externally-managed-environment" in x for x in lines):
            rc, lines = self.stream([*base, "--break-system-packages", "-r", str(WHEELS_FILE)], log=log)
        if rc not in (0, None):
            # A requirement the folder lacks, or an image whose installed packages' own requirements pip cannot
            # satisfy offline: install the pins the folder has, without resolving; the import check decides.
            pins = carried_pins(wheels)
            self.say(f"pip could not resolve every requirement offline; installing the {len(pins)} pinned wheels "
                     "the folder has, without dependencies (the import check below names anything missing)")
            if pins:
                rc, lines = self.stream([*base, "--no-deps", *pins], log=log)
            status = ("installed without dependencies" if pins and rc == 0 else
                      f"failed (see pip_install.log): {len(pins)} of the pinned wheels found in {wheels}")
        if rc is None:
            status = "stopped at the time cap"
        self.report["install"] = {"wheels": str(wheels), "status": status}
        return rc is not None

    def probe(self) -> bool:
        rc, lines = self.stream([sys.executable, "-c", PROBE, ",".join(NEEDED)], log=self.logs / "probe.log")
        found = next((x for x in lines if x.startswith("PROBE ")), None)
        if rc != 0 or found is None:
            missing = next((x[8:] for x in lines if x.startswith("MISSING ")), None)
            self.report["error"] = (f"cannot import {missing}: add its wheel to the wheels folder "
                                    "(docs/gpu_validation.md, scripts/gpu_wheels.txt)" if missing else
                                    f"the package does not import (exit {rc}): {lines[-1] if lines else ''}")
            return False
        self.report["probe"] = json.loads(found[6:])
        registered = self.report["probe"]["methods"]
        chosen = self.args.methods or registered
        unknown = [m for m in chosen if not all(part in registered for part in m.split("+"))]
        if unknown:
            self.report["error"] = (f"--methods: unknown method {unknown[0]!r}; choose from {', '.join(registered)} "
                                    "(or advantage+loss, e.g. progrpo+casp)")
            return False
        self.report["methods"] = chosen
        if self.mode == "device" and not self.report["probe"]["cuda"]:
            self.report["error"] = "torch sees no CUDA device; run with --dry-run to check the script on CPU"
            return False
        self.say(f"{self.report['probe']['device']}; methods: {', '.join(self.report['methods'])}")
        return True

    def build_model(self, workdir: Path) -> str | None:
        name, dtype = self.sizes["model"], self.sizes["dtype"]
        self.say(f"building {name} at random weights ({dtype}) ...")
        rc, lines = self.stream([sys.executable, "-m", "exploration_trl.random_model", name, str(workdir / "model"),
                                 "--dtype", dtype], log=self.logs / "build_model.log")
        if rc != 0 or not lines:
            self.report["error"] = f"could not build the random {name} model (exit {rc})"
            return None
        return lines[-1].strip()

    def smoke(self, workdir: Path, model: str, method: str, variants: str, evaluate: str) -> None:
        """`scripts/gpu_smoke.sh` for one method; `evaluate` is its SMOKE_EVAL (1: the model's eval, and the
        adapter's after a LoRA run; adapter: only the adapter's; 0: none)."""
        runs = [f"train {method}-{v}" for v in variants.split()]
        runs += ["eval-base"] if evaluate == "1" else []
        runs += ["eval-adapter"] if evaluate != "0" and "lora" in variants.split() else []
        estimate = self.sizes["smoke_run_s"]
        done = [r for r in self.report["smoke"] if isinstance(r.get("seconds"), (int, float))]
        if done:
            estimate = sum(r["seconds"] for r in done) / len(done)
        if self.left() < estimate:
            for run in runs:
                self.report["smoke"].append({"run": run, "status": "not run (time cap)", "seconds": None})
            self.not_run(f"smoke {method}")
            return
        self.say(f"smoke: {', '.join(runs)} ...")
        env = {**self.env, **self.sizes["smoke"], "SMOKE_MODEL": model, "SMOKE_METHODS": method,
               "SMOKE_VARIANTS": variants, "SMOKE_EVAL": evaluate,
               "SMOKE_OUT": str(workdir / "smoke"), "PYTHON": sys.executable}
        if self.mode == "device" and shutil.which("accelerate") is None:
            env["SMOKE_LAUNCHER"] = "python"  # the launcher's console script is not on PATH
        rc, lines = self.stream(["bash", str(REPO / "scripts" / "gpu_smoke.sh")], env=env,
                                log=self.logs / f"smoke_{method}_{variants.replace(' ', '_')}.log")
        recorded = {}
        for line in lines:
            m = RECORD.match(line)
            if m:
                recorded[m["run"]] = m
        first_missing = True
        for run in runs:
            m = recorded.get(run)
            if m is not None:
                log = Path(m["log"])
                if log.is_file():
                    shutil.copyfile(log, self.logs / log.name)
                self.report["smoke"].append({"run": run, "status": m["status"], "seconds": int(m["seconds"]),
                                             "log": f"{LOGS_FILE}:logs/{log.name}"})
            elif rc is None:
                self.report["smoke"].append({"run": run, "status": "stopped at the time cap" if first_missing
                                             else "not run (time cap)", "seconds": None})
                first_missing = False
            else:
                tail = next((x for x in reversed(lines) if x.strip()), "")
                self.report["smoke"].append({"run": run, "status": f"FAIL (gpu_smoke.sh exit {rc}: {tail[-200:]})",
                                             "seconds": None})
        if rc is None:
            self.report["stopped_at_cap"] = True
            self.report["not_run"].append(f"smoke {method} (stopped)")
        self.write()

    def overhead(self) -> None:
        if self.left() <= 0:
            self.not_run("overhead benchmark")
            return
        large = self.args.large_only
        # --large-only: overhead_device's LARGE_METHODS (TRL and the methods whose extra work grows with T or V)
        methods = ["trl", *self.report["methods"]]
        self.say(f"overhead{' (large workload)' if large else ''}: "
                 f"{'overhead_device.LARGE_METHODS' if large else ', '.join(methods)} ...")
        output = self.out / OVERHEAD_FILE
        cmd = [sys.executable, str(REPO / "benchmarks" / "overhead.py"),
               *(["--dry-run"] if self.mode == "dry-run" else ["--device", "cuda"]),
               *(["--large"] if large else ["--methods", ",".join(methods)]), "--output", str(output),
               "--deadline", f"{self.deadline - MARGIN_S:.1f}"]
        rc, lines = self.stream(cmd, log=self.logs / "overhead.log")
        data = json.loads(output.read_text()) if output.is_file() else None
        if data is not None:
            self.report["overhead"] = {k: data.get(k) for k in ("versions", "workload", "methods", "trials",
                                                               "summary", "not_run", "stopped", "seconds")}
            self.report["overhead"]["failed"] = {m: {mode: f["error"] for mode, f in modes.items()}
                                                 for m, modes in (data.get("failed") or {}).items()}
            self.report["overhead"]["file"] = OVERHEAD_FILE
        else:
            self.report["overhead"] = {"trials": {}, "summary": {}, "not_run": methods,
                                       "stopped": "stopped at the time cap" if rc is None else f"failed (exit {rc})"}
        self.report["overhead"]["exit_status"] = rc
        if rc is None or (data or {}).get("stopped"):
            self.report["stopped_at_cap"] = True
            self.report["not_run"].append(f"overhead of {', '.join(self.report['overhead']['not_run'] or [])}")
        self.write()

    def run(self) -> int:
        self.say(f"{self.mode} mode; Python {sys.version.split()[0]} ({sys.executable}); output {self.out}; "
                 f"cap {self.args.cap:g} min")
        workdir_ctx = (tempfile.TemporaryDirectory(prefix="gpu_validate_") if self.args.workdir is None
                       else _Keep(Path(self.args.workdir)))
        try:
            with workdir_ctx as workdir:
                workdir = Path(workdir)
                ok = self.install() and self.probe()
                self.write()
                if ok and self.args.large_only:  # the overhead trials build their own model; no smoke runs
                    self.overhead()
                model = self.build_model(workdir) if ok and not self.args.large_only else None
                if model is not None:
                    methods = self.report["methods"]
                    first = methods[0]
                    self.overhead()
                    self.smoke(workdir, model, first, "full", evaluate="1")  # and the model's eval
                    if self.sizes["smoke_others"]:
                        self.smoke(workdir, model, first, "lora", evaluate="adapter")  # and the adapter's eval
                        for method in methods[1:]:
                            self.smoke(workdir, model, method, "full", evaluate="0")
        except Stop as e:
            self.report["error"] = f"stopped by {e}"
        self.write()
        print(markdown(self.report), flush=True)
        print(f"wrote {self.out / JSON_FILE} and {self.out / MD_FILE}")
        shutil.rmtree(self.logs, ignore_errors=True)
        status, message = outcome(self.report)
        print(message, file=sys.stderr if status == 2 else sys.stdout)
        return status


def outcome(report: dict) -> tuple[int, str]:
    """The exit status and its one line: 2 the set-up failed, 1 a run failed (a smoke run, an overhead trial that
    raised or a non-finite loss), else 0 (also when the cap stopped it: the report says what did not run)."""
    if report["error"]:
        return 2, f"gpu_validate: error: {report['error']}"
    overhead = report.get("overhead") or {}
    failed = [r["run"] for r in report["smoke"] if str(r["status"]).startswith("FAIL")]
    failed += [f"overhead of {m} ({', '.join(modes)})" for m, modes in (overhead.get("failed") or {}).items()]
    failed += [f"{m} (non-finite loss)" for m, modes in (overhead.get("trials") or {}).items()
               if any(t.get("loss_finite") is False for t in modes.values())]
    if overhead.get("exit_status") not in (0, None) and not overhead.get("failed"):
        failed.append(f"overhead benchmark (exit {overhead['exit_status']}; {LOGS_FILE}:logs/overhead.log)")
    if failed:
        return 1, f"gpu_validate: FAILED: {', '.join(failed)}"
    return 0, "gpu_validate: " + ("stopped at the time cap; not run: " + "; ".join(report["not_run"])
                                  if report["stopped_at_cap"] else "everything ran and passed")


def carried_pins(wheels: Path) -> list[str]:
    """The exact `name==version` lines of scripts/gpu_wheels.txt (the packages the image lacks) that have a wheel in
    the folder (pip picks the one that fits the interpreter); a range line is left to the image's version."""
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    have = set()
    for path in wheels.glob("*.whl"):
        parts = path.name.split("-")
        if len(parts) >= 5:
            have.add((norm(parts[0]), parts[1]))
    pins = []
    for line in WHEELS_FILE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = (x.strip() for x in line.split("==", 1))
            if (norm(name), version) in have:
                pins.append(f"{name}=={version}")
    return pins


class _Keep:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.mkdir(parents=True, exist_ok=True)
        return str(self.path)

    def __exit__(self, *exc):
        return False


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _num(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def markdown(report: dict) -> str:
    """The report as Markdown: the set-up, the overhead table (a row per method) and the smoke table."""
    probe = report.get("probe") or {}
    versions = probe.get("versions") or {}
    mode = "dry run on CPU: checks the code, not the numbers" if report["mode"] == "dry-run" else "device"
    lines = [f"# GPU validation ({mode})", ""]
    lines.append(f"- device: {probe.get('device', '?')}; CUDA {probe.get('cuda_version') or '–'}; "
                 + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    lines.append(f"- commit: {report.get('commit') or '?'}; install: "
                 f"{(report.get('install') or {}).get('status', '?')}")
    lines.append(f"- time: {report['seconds']:.0f} s of a {report['cap_s']} s cap"
                 + (f"; stopped at the cap, not run: {'; '.join(report['not_run'])}" if report["stopped_at_cap"]
                    else ""))
    if report.get("error"):
        lines.append(f"- error: {report['error']}")
    over = report.get("overhead") or {}
    trials, summary = over.get("trials") or {}, over.get("summary") or {}
    if report.get("large_only") and over.get("methods"):  # the large workload measures its own few methods
        methods = list(over["methods"])
    else:
        methods = ["trl", *report.get("methods", [])] if report.get("methods") else list(trials)
    lines += ["", "## Overhead per step against TRL (`benchmarks/overhead.py`)", ""]
    if over.get("workload"):
        lines += [f"Workload: {over['workload']}", ""]
    lines += ["| method | train-only s, logging 10 | × TRL | train-only s, every step | × TRL | amortised × TRL, "
              "logging 10 | generating s | × TRL | peak GB | syncs train / gen | loss finite | goals met |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    failed = over.get("failed") or {}
    for method in methods:
        modes, s = trials.get(method) or {}, summary.get(method) or {}
        if method in failed:
            errors = "; ".join(f"{mode}: {error}" for mode, error in failed[method].items())
            lines.append(f"| {method} | FAILED ({errors[:300]}) |" + " – |" * 10)
            continue
        if "logging10" not in modes:
            lines.append(f"| {method} | not run (time cap) |" + " – |" * 10)
            continue
        ten, every = modes["logging10"], modes.get("every_step") or {"train_only_s": None}
        s10, s1 = s.get("logging10") or {}, s.get("every_step") or {}
        finite = [t.get("loss_finite") for t in modes.values()]
        lines.append(
            f"| {method} | {ten['train_only_s']:.4f} | {_num(s10.get('train_only_x_trl'), '.3f')} | "
            f"{_num(every['train_only_s'], '.4f')} | {_num(s1.get('train_only_x_trl'), '.3f')} | "
            f"{_num(s.get('train_only_logging10_amortised_x_trl'), '.3f')} | {ten['generating_s']:.4f} | "
            f"{_num(s10.get('generating_x_trl'), '.3f')} | {_num(ten.get('peak_memory_gb'), '.2f')} | "
            f"{ten['syncs_train_only']} / {ten['syncs_generating']} | "
            f"{'no' if False in finite else 'yes' if True in finite else '–'} | "
            f"{'–' if s.get('meets_goals') is None else 'yes' if s['meets_goals'] else 'no'} |")
    lines += ["", "## Smoke (`scripts/gpu_smoke.sh`)", "", "| run | result | seconds |", "|---|---|---|"]
    for r in report.get("smoke") or []:
        lines.append(f"| {r['run']} | {r['status']} | {_num(r.get('seconds'), 'd')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return Validation(args).run()


if __name__ == "__main__":
    sys.exit(main())
