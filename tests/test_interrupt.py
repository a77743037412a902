"""Ctrl-C, for real: SIGINT sent to an `exploration-trl train` subprocess saves a checkpoint of the last finished step
and prints how to resume; the resumed run goes on from that step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from exploration_trl.trainers.components.resume import STATE_FILE
from helpers import CLI_BASE


def _default_sigint():
    # A shell starts background jobs with SIGINT ignored, and a child inherits that (Python then installs no
    # KeyboardInterrupt handler): give the child a terminal's default so the test works however pytest was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cmd, env):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)


def _wait_for_steps(proc, n, timeout=240):
    """Read the trainer's stdout until `n` logged steps (HF prints one dict per logging step)."""
    seen, deadline = 0, time.time() + timeout
    while seen < n:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "the run logged too few steps"
        seen += "'loss'" in line
    return seen


def test_sigint_during_train_saves_a_checkpoint_and_says_how_to_resume(tmp_path):
    out = tmp_path / "out"
    cfg = {**CLI_BASE, "output_dir": str(out), "max_steps": 100000, "logging_steps": 1, "save_strategy": "steps",
           "save_steps": 100000, "steps_per_generation": 2}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "exploration_trl.cli", "train", "--config", str(path)]
    proc = _start(cmd, env)
    _wait_for_steps(proc, 3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) == 1, err[-2000:]
    ckpt = checkpoints[0]
    step = int(ckpt.name.split("-")[1])
    assert step >= 3
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / STATE_FILE.format(0)).is_file()
    lines = [line for line in err.splitlines() if line.startswith("interrupted at step")]
    assert lines == [f"interrupted at step {step}: saved {ckpt}; resume with the same config and "
                     f"--resume_from_checkpoint {ckpt}"]

    resumed = subprocess.run([*cmd, "--max_steps", str(step + 2), "--resume_from_checkpoint", str(ckpt)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "no saved rollout buffer" not in resumed.stderr
    assert resumed.stdout.count("'loss'") == 2  # it went on from the saved step: 2 more steps, not step + 2
    assert (out / "model.safetensors").is_file()


def test_sigint_during_eval_keeps_finished_samples_and_resumes(tmp_path):
    """Ctrl-C mid-evaluation: exit 130 with one line, every finished problem's row kept whole in samples.jsonl; the
    same command again resumes (only the missing problems are generated) and ends like an uninterrupted run."""
    import json

    from helpers import toy_checkpoint

    model = toy_checkpoint(tmp_path / "toy")
    out = tmp_path / "eval"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "exploration_trl.cli", "eval", "--model", model, "--benchmark", "countdown3",
           "--n", "2", "--limit", "400", "--max-tokens", "8", "--batch-size", "1", "--output-dir", str(out),
           "--no-semantic", "--quiet"]
    proc = _start(cmd, env)
    samples = out / "samples.jsonl"
    deadline = time.time() + 240
    while not (samples.exists() and samples.read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted: what finished is kept; run the same command again to resume"
    kept = samples.read_text()
    rows = [json.loads(line) for line in kept.splitlines()]  # every kept line is a whole row
    assert len(rows) >= 3 and [r["index"] for r in rows] == list(range(len(rows)))
    assert not (out / "results.json").exists()

    short = [*cmd[:cmd.index("--limit") + 1], str(len(rows) + 2), *cmd[cmd.index("--limit") + 2:]]
    done = subprocess.run(short, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert samples.read_text().startswith(kept)  # the finished rows were not re-generated
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["num_problems"] == len(rows) + 2
