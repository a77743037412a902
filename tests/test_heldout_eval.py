"""Held-out pass@k while training (`trainers/components/heldout_eval.py`): the numbers, HF's schedule and checkpoint
selection, the config errors, and 2 real processes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from helpers import child_pythonpath

from exploration_trl.eval.harness import run_eval
from exploration_trl.experiments import countdown_tiny as ct
from exploration_trl.experiments import demo
from exploration_trl.rewards.countdown import countdown
from exploration_trl.trainers.base import ExplorationGRPOConfig, ExplorationGRPOTrainer
from exploration_trl.trainers.components.heldout_eval import passk_confidence_interval

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _trainer(tmp_path, bench=None, **overrides):
    s = demo.demo_settings(quick=False)
    train, _ = ct.make_problems(s.data, s.seed)
    model, tok = ct.load_checkpoint(demo.warm_start_dir())
    kw = {"output_dir": str(tmp_path / "out"), "max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4,
              "max_completion_length": 20, "learning_rate": 1e-3, "use_cpu": True, "bf16": False, "report_to": [],
              "save_strategy": "no", "disable_tqdm": True, "seed": 0, "logging_steps": 1, "eval_n": 8, "eval_ks": [1, 8]}
    kw.update(overrides)
    data = Dataset.from_dict({"prompt": [ct.prompt_text(p["nums"], p["target"]) for p in train[:16]],
                              "nums": [list(p["nums"]) for p in train[:16]], "target": [p["target"] for p in train[:16]]})
    return ExplorationGRPOTrainer(model=model, processing_class=tok, reward_funcs=countdown,
                                  args=ExplorationGRPOConfig(**kw), train_dataset=data, heldout_benchmark=bench)


def _bench(num=6):
    s = demo.demo_settings(quick=False)
    _, test = ct.make_problems(s.data, s.seed)
    return ct.heldout_benchmark(test, num)


def test_confidence_interval_hand_worked():
    # per-problem pass@1 = 0.25, 0.5, 0.75: mean 0.5, sample variance 0.0625, se = sqrt(0.0625 / 3) = 0.14434
    m, lo, hi = passk_confidence_interval([4, 4, 4], [1, 2, 3], 1)
    assert m == pytest.approx(0.5)
    assert lo == pytest.approx(0.5 - 1.959964 * 0.1443376, abs=1e-6)
    assert hi == pytest.approx(0.5 + 1.959964 * 0.1443376, abs=1e-6)
    assert passk_confidence_interval([4, 4], [0, 4], 1) == (0.5, 0.0, 1.0)  # clipped to [0, 1]
    assert passk_confidence_interval([4], [2], 4) == (1.0, 1.0, 1.0)


def test_schedule_logs_passk_and_step0_equals_the_eval_harness(tmp_path):
    bench = _bench()
    trainer = _trainer(tmp_path, bench, eval_strategy="steps", eval_steps=2, eval_on_start=True)
    assert str(trainer.args.eval_strategy.value if hasattr(trainer.args.eval_strategy, "value")
               else trainer.args.eval_strategy) == "steps"  # restored after __init__
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_pass@8" in e]
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert e["eval_pass@8_ci_low"] <= e["eval_pass@8"] <= e["eval_pass@8_ci_high"]
        assert 0 <= e["eval_pass@1"] <= e["eval_pass@8"] <= 1
        assert e["eval_num_problems"] == 6 and e["eval_token_entropy"] > 0
    model, tok = ct.load_checkpoint(demo.warm_start_dir())
    ref = run_eval((model.eval(), tok), bench, n=8, temperature=1.0, top_p=1.0, max_tokens=20,
                   output_dir=tmp_path / "ref", batch_size=256, seed=0, diversity=False, semantic=False,
                   backend="transformers", progress=False, overwrite=True, plot=False, ks=[1, 8])["summary"]
    first = evals[0]
    assert first["eval_pass@1"] == pytest.approx(ref["pass_at_k"]["1"], abs=1e-12)
    assert first["eval_pass@8"] == pytest.approx(ref["pass_at_k"]["8"], abs=1e-12)
    assert first["eval_token_entropy"] == pytest.approx(ref["token_entropy"], rel=1e-9)
    assert first["eval_distinct_correct"] == pytest.approx(ref["solution_multiplicity"]["mean"])


def test_metric_for_best_model_and_load_best_model_at_end(tmp_path):
    trainer = _trainer(tmp_path, _bench(4), max_steps=3, eval_strategy="steps", eval_steps=1, save_strategy="steps",
                       save_steps=1, metric_for_best_model="eval_pass@8", load_best_model_at_end=True,
                       learning_rate=2e-2)
    trainer.train()
    values = {e["step"]: e["eval_pass@8"] for e in trainer.state.log_history if "eval_pass@8" in e}
    assert sorted(values) == [1, 2, 3]
    assert trainer.state.best_metric == max(values.values())
    best_step = min(s for s, v in values.items() if v == max(values.values()))  # HF keeps the first on ties
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")


def test_builtin_benchmark_by_name_and_config_errors(tmp_path):
    trainer = _trainer(tmp_path, eval_benchmark="countdown3", eval_num_problems=2, eval_strategy="steps", eval_steps=5)
    assert trainer.heldout_benchmark.name == "countdown3" and len(trainer.heldout_benchmark.records) == 2
    with pytest.raises(ValueError, match="eval_benchmark 'no_such_bench'"):
        _trainer(tmp_path, eval_benchmark="no_such_bench")
    with pytest.raises(ValueError, match=r"eval_ks holds 16 but each k must satisfy 1 <= k <= eval_n=8"):
        ExplorationGRPOConfig(output_dir=str(tmp_path), eval_benchmark="gsm8k", eval_n=8, eval_ks=[1, 16])
    with pytest.raises(ValueError, match="eval_n is 0"):
        ExplorationGRPOConfig(output_dir=str(tmp_path), eval_benchmark="gsm8k", eval_n=0)
    cfg = ExplorationGRPOConfig(output_dir=str(tmp_path), eval_benchmark="gsm8k", eval_n=8, eval_ks="1,8")
    assert cfg.eval_ks == [1, 8]


@pytest.mark.skipif(shutil.which("accelerate") is None and not Path(sys.executable).with_name("accelerate").exists(),
                    reason="the accelerate CLI is part of the package's requirements")
def test_two_processes_split_the_problems_and_gather_the_same_metrics(tmp_path):
    env = {**os.environ, "PYTHONPATH": child_pythonpath(TESTS), "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, str(TESTS / "heldout_driver.py"), str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=600, env=env, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    config = yaml.safe_load((ROOT / "configs" / "accelerate" / "multi_gpu.yaml").read_text())
    # main_process_port 0: accelerate picks a free port (`pytest -n 2` runs two launches side by side)
    config.update(num_processes=2, use_cpu=True, main_process_port=0)
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(config))
    acc = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    two = subprocess.run([acc, "launch", "--config_file", str(tmp_path / "ddp.yaml"), str(TESTS / "heldout_driver.py"),
                          str(tmp_path / "two")], capture_output=True, text=True, timeout=600, env=env, check=False)
    assert two.returncode == 0, two.stderr[-3000:]
    ref = json.loads((tmp_path / "one" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ref["world"] == 1 and [r["world"] for r in ranks] == [2, 2]
    for r in ranks:
        assert r["metrics"]["eval_num_problems"] == 9
        for key in ("eval_pass@1", "eval_pass@8", "eval_pass@8_ci_low", "eval_distinct_correct", "eval_token_entropy"):
            assert math.isclose(r["metrics"][key], ref["metrics"][key], rel_tol=1e-9, abs_tol=1e-12), key


def test_card_curves_show_heldout_passk():
    from exploration_trl.hub.curves import (
        heldout_keys,
        plot_training_curves,
        training_summary,
    )

    history = [{"step": 0, "eval_pass@1": 0.2, "eval_pass@1_ci_low": 0.1, "eval_pass@1_ci_high": 0.3,
                "eval_pass@8": 0.8, "eval_pass@8_ci_low": 0.7, "eval_pass@8_ci_high": 0.9},
               {"step": 1, "reward": 0.3, "entropy": 0.5},
               {"step": 2, "eval_pass@1": 0.3, "eval_pass@8": 0.7, "eval_pass@1_ci_low": 0.2, "eval_pass@1_ci_high": 0.4,
                "eval_pass@8_ci_low": 0.6, "eval_pass@8_ci_high": 0.8}]
    assert heldout_keys(history) == ["eval_pass@1", "eval_pass@8"]
    png = plot_training_curves(history)
    assert png is not None and png[:4] == b"\x89PNG"
    assert "held-out pass@1 20.0% at step 0 → 30.0% at step 2" in training_summary(history)
    assert "held-out pass@8 80.0% at step 0 → 70.0% at step 2" in training_summary(history)
    assert plot_training_curves([{"step": 0, "eval_pass@1": 0.2}]) is not None  # held-out alone still plots
