"""Exact resume (exploration_trl/trainers/components/resume.py): a run resumed from a checkpoint inside a rollout's
updates equals the uninterrupted run, for every method and for dynamic sampling (whose refill iterator's position is
saved too), in 1 process, and in 2 (real DDP, gloo) for GRPO, dynamic sampling and every method with state of its
own (the other methods' 2-process runs are `slow`); a checkpoint without the saved buffer (0.2.0, plain TRL) still
resumes and says that the partial rollout is re-sampled.

Each launch of tests/resume_driver.py trains all methods (uninterrupted run, then the resumed one), so the 2-process
launcher starts once. Measured: the resumed final weights equal the uninterrupted ones bit for bit (difference 0.0)
in 1 and 2 processes; without the restore (TRL 1.16 alone) every method's run differs, by 0.04 (CaSP) to 0.17 (KL-Cov)
in max |weight difference| on this toy setup (GRPO with `steps_per_generation: 4`: 0.09).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from exploration_trl.trainers.components.resume import STATE_FILE
from helpers import grpo_kwargs, letter_reward, max_param_diff, toy_checkpoint, toy_dataset
from resume_driver import CASE_METHOD, cases, layout
from test_multiprocess import ROOT, TESTS, _accelerate, _env

METHODS = cases()
TOL = 1e-6  # measured: 0.0 in both process counts


def _own_state(case: str) -> bool:
    """Whether a case is resumed in 2 processes in the main suite: GRPO (the rollout buffer every method shares),
    dynamic sampling (its refill iterator) and every method with state of its own between steps, read from its
    strategy: saved state (`state_dict`), private generators, or a loss-side method (its per-process token
    selection). The other advantage-side methods are functions of the restored rollout; their 2-process resume is
    slow (about 30 s more)."""
    from exploration_trl.methods import parse_method, strategy_of
    from exploration_trl.trainers.strategy import Strategy

    if case in ("grpo", "grpo_dynamic_sampling"):
        return True
    parts = [strategy_of(p) for p in parse_method(CASE_METHOD.get(case, case))]
    return any(s is not None and (s.side == "loss" or s.state_dict is not Strategy.state_dict
                                  or s.generators is not Strategy.generators) for s in parts)


MAIN_TWO_PROCESS = tuple(m for m in METHODS if _own_state(m))


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    ckpt = toy_checkpoint(tmp / "ckpt")

    @cache
    def launch(num_processes: int, methods: tuple[str, ...]) -> Path:
        out = tmp / f"np{num_processes}-{len(methods)}"
        driver = [str(TESTS / "resume_driver.py"), str(out), "--ckpt", ckpt, "--methods", ",".join(methods)]
        if num_processes == 1:
            cmd = [sys.executable, *driver]
        else:
            config = yaml.safe_load((ROOT / "configs" / "accelerate" / "multi_gpu.yaml").read_text())
            # main_process_port 0: accelerate picks a free port (`pytest -n 2` runs two launches side by side)
            config.update(num_processes=num_processes, use_cpu=True, main_process_port=0)
            path = tmp / f"ddp-{num_processes}.yaml"
            path.write_text(yaml.safe_dump(config))
            cmd = [_accelerate(), "launch", "--config_file", str(path), *driver]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env())
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "no saved rollout buffer" not in proc.stderr
        return out

    return launch


@pytest.mark.parametrize(("method", "num_processes"), [
    *((m, 1) for m in METHODS), *((m, 2) for m in MAIN_TWO_PROCESS),
    *(pytest.param(m, 2, marks=pytest.mark.slow) for m in METHODS if m not in MAIN_TWO_PROCESS)])
def test_resume_inside_rollout_is_exact(method, num_processes, launches):
    # One launch per process count and set: every case in 1 process, the main suite's 2-process cases, the slow rest.
    group = METHODS if num_processes == 1 else MAIN_TWO_PROCESS if method in MAIN_TWO_PROCESS else tuple(
        m for m in METHODS if m not in MAIN_TWO_PROCESS)
    out = launches(num_processes, tuple(group)) / method
    result = json.loads((out / "result.json").read_text())
    assert result["num_processes"] == num_processes
    assert result["inside_rollout"] and result["generations_after_resume"] >= 1
    assert result["moved"] > 1e-3  # the run trained: equality below is not that of two untouched models
    assert result["max_param_diff"] <= TOL
    assert result["full_log"] and result["resumed_log"] == result["full_log"]  # losses and metrics, step by step
    if method == "grpo_dynamic_sampling":  # refills (rounds > 1) before the checkpoint and after it
        rounds = {int(step): r for step, r in result["refill_rounds"].items()}
        resume_at = layout(method)[-1]
        assert any(r > 1 for s, r in rounds.items() if s <= resume_at), rounds
        assert any(r > 1 for s, r in rounds.items() if s > resume_at), rounds
    checkpoint = out / "full" / f"checkpoint-{layout(method)[-1]}"
    for rank in range(num_processes):  # one state file per process, the buffer saved (mid-rollout checkpoint)
        assert (checkpoint / STATE_FILE.format(rank)).is_file()


def test_checkpoint_without_buffer_resumes_with_one_line(tmp_path, capfd):
    """A 0.2.0 checkpoint (no state file) resumes; one line says the rollout's remaining updates are re-sampled."""
    import exploration_trl as et

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    cls = et.get_trainer_class("grpo")

    def trainer(out, **kw):
        args = cls.config_class(**grpo_kwargs(out, steps_per_generation=4, max_steps=5, save_strategy="steps",
                                              save_steps=2, **kw))
        return cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())

    full = trainer(tmp_path / "full")
    full.train()
    old = tmp_path / "old-checkpoint-2"
    shutil.copytree(tmp_path / "full" / "checkpoint-2", old)
    (old / STATE_FILE.format(0)).unlink()
    capfd.readouterr()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(old))
    lines = [line for line in capfd.readouterr().err.splitlines() if "no saved rollout buffer" in line]
    assert lines == [f"exploration-trl: {old} has no saved rollout buffer (written by exploration-trl 0.2.0 or "
                     "earlier, or by TRL), so the 2 remaining updates of its rollout train on a re-sampled rollout; "
                     "the run is not the uninterrupted one from here."]
    assert resumed.state.global_step == 5
    assert max_param_diff(full, resumed) > 1e-4  # re-sampled: honestly not the uninterrupted run
