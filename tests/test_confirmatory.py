"""The confirmatory protocol: the verdict on synthetic data with known answers, Holm on hand numbers, the held-out
split's disjointness, canonical distinct-correct equations, and a killed quick run that resumes to the same
numbers as an uninterrupted one."""

import json

import numpy as np
import pytest

from exploration_trl.experiments.confirmatory import heldout, protocol, runner, verdict
from exploration_trl.rewards.countdown import canonical_equation, distinct_canonical

# GRPO: pass@1 rises 0.2 -> 0.4 while pass@64 falls 0.9 -> 0.7 (a straight line: f(x) = 1.1 - x).
STEPS_X = np.array([0.2, 0.25, 0.3, 0.35, 0.4])
NOISE = np.array([-0.004, -0.002, 0.0, 0.002, 0.004])


def grpo_arm():
    base = np.stack([STEPS_X, 1.1 - STEPS_X], axis=1)  # (K, 2)
    return np.stack([base + np.array([d, -d]) for d in NOISE])  # 5 seeds


def method_arm(shift):
    return np.stack([np.array([0.3 + d, 1.1 - 0.3 + shift + d]) for d in NOISE])


def test_clear_win_has_small_p_and_the_known_effect():
    r = verdict.test(grpo_arm(), method_arm(0.05), resamples=2000, seed=0)
    assert r["effect"] == pytest.approx(0.05, abs=1e-9)
    assert r["p"] < 0.01 and r["ci"][0] > 0


def test_clear_loss_has_p_near_one():
    r = verdict.test(grpo_arm(), method_arm(-0.05), resamples=2000, seed=0)
    assert r["effect"] == pytest.approx(-0.05, abs=1e-9) and r["p"] > 0.99 and r["ci"][1] < 0


def test_null_is_not_significant():
    r = verdict.test(grpo_arm(), method_arm(0.0), resamples=2000, seed=0)
    assert abs(r["effect"]) < 1e-9 and r["p"] > 0.2


def test_seed_outside_grpo_range_gives_no_verdict():
    m = method_arm(0.0)
    m[0, 0] = 0.45  # beyond GRPO's largest pass@1: never extrapolated
    r = verdict.test(grpo_arm(), m, resamples=100, seed=0)
    assert r["effect"] is None and r["p"] is None and "outside" in r["reason"] and r["distances"][0] is None


def test_resample_outside_the_curve_counts_against_the_method():
    m = method_arm(0.05)
    m[:, 0] = 0.399  # at the curve's end: resampled GRPO curves often stop short of it
    r = verdict.test(grpo_arm(), m, resamples=2000, seed=0)
    assert r["outside_resamples"] > 0.1 and r["p"] >= r["outside_resamples"]


def test_holm_on_hand_numbers():
    assert verdict.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert verdict.holm([0.01, None]) == [0.02, None]  # no verdict still counts in the family


def test_small_sample_correction_widens_the_interval():
    plain = verdict.test(grpo_arm(), method_arm(0.002), resamples=4000, seed=0, correction="none")
    fixed = verdict.test(grpo_arm(), method_arm(0.002), resamples=4000, seed=0)
    assert fixed["ci"][1] - fixed["ci"][0] > 1.2 * (plain["ci"][1] - plain["ci"][0])
    assert fixed["p"] > plain["p"]


def test_null_simulation_is_calibrated_at_the_exploratory_noise():
    curve = np.stack([STEPS_X, 1.1 - STEPS_X], axis=1)
    sd = np.full_like(curve, 0.01)
    sd[0] = 0
    r = verdict.null_false_positive_rate(curve, sd, 3, simulations=300, resamples=500, seed=3)
    assert r["false_positive_rate"] <= 0.05


def test_canonical_equations():
    c = canonical_equation
    assert c("3+4") == c("4+3")
    assert c("(1+2)+3") == c("1+(2+3)")
    assert c("2*3+4") == c("4+3*2")
    assert c("5-2") != c("2-5")
    assert c("12/(3+1)") == c("12/(1+3)") != c("(3+1)/12")
    assert c("1+") is None
    assert distinct_canonical(["3+4", "4+3", "3*4", "5"], [True, True, False, False]) == 1


def test_split_holds_out_whole_multisets():
    from exploration_trl.experiments.countdown_tiny import task

    data = task.DataSettings()
    train, held, info = heldout.make_split(data, 0, "confirmatory-v1", 0.25, 500)
    assert len(held) == 500 == info["n_problems"] and len(train) == 3000
    train_sets = {heldout.multiset_key(p["nums"]) for p in train}
    assert not train_sets & {heldout.multiset_key(p["nums"]) for p in held}
    assert all(heldout.is_heldout(p["nums"], "confirmatory-v1", 0.25) for p in held)
    assert info["disjoint_from_training"]


def test_protocol_files_load():
    for name in ("countdown3", "countdown4"):
        cfg = protocol.load(f"configs/confirmatory/{name}.yaml")
        base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
        assert len(base["seeds"]) >= 5 and not {0, 1, 2} & set(base["seeds"])
        assert all(len(s["seeds"]) >= 5 for s in cfg["settings"])


def test_killed_quick_run_resumes_to_the_uninterrupted_numbers(tmp_path):
    full = protocol.load("configs/confirmatory/countdown3.yaml")
    cfg = protocol.quick(full)
    # DS-GRPO shifts the advantages of all-wrong groups too, so the policy moves although the quick warm start (20
    # SFT steps) solves nothing and GRPO's advantages are all 0.
    ds = next(s for s in full["settings"] if s["label"] == "dsgrpo_published")
    cfg["settings"].append({**ds, "seeds": [10], "steps": [0, 1, 2, 3, 4, 6]})
    whole = runner.run_one(cfg, str(tmp_path / "a"), "dsgrpo_published", 10)
    with pytest.raises(runner.Stopped):
        runner.run_one(cfg, str(tmp_path / "b"), "dsgrpo_published", 10, stop_after=3)
    partial = json.loads((tmp_path / "b" / "runs" / "dsgrpo_published__seed10.json").read_text())
    assert not partial["finished"] and partial["last_step"] == 3
    resumed = runner.run_one(cfg, str(tmp_path / "b"), "dsgrpo_published", 10)
    assert resumed["resumed_from"] and resumed["resumed_from"][0].endswith("checkpoint-3")
    assert [r["step"] for r in resumed["rows"]] == [0, 1, 2, 3, 4, 6]
    assert len({r["token_entropy"] for r in whole["rows"]}) > 1  # the policy moved: equal rows are not trivial
    assert resumed["rows"] == whole["rows"]


def test_the_protocol_runs_any_model_through_train(tmp_path):
    """`task: train`: each (setting, seed) is an `exploration-trl train` run of a training YAML with the held-out
    evaluation; its record holds the evaluated steps, a second call reruns nothing, and the verdict is written."""
    import subprocess
    import sys

    import yaml

    from exploration_trl.toy import make_toy_checkpoint

    # One local model for both runs (`toy` itself would be initialised from each run's seed).
    model = make_toy_checkpoint(tmp_path / "model", alphabet="0123456789+-*/()= ", seed=0)
    train_yaml = tmp_path / "train.yaml"
    train_yaml.write_text(yaml.safe_dump({
        "model_name_or_path": str(model), "dataset_name": "countdown", "max_train_samples": 16, "reward_funcs": ["countdown"],
        "use_cpu": True, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
        "learning_rate": 5e-4, "logging_steps": 1, "report_to": "none", "eval_benchmark": "countdown3",
        "eval_num_problems": 2, "eval_max_tokens": 8}))
    proto = tmp_path / "protocol.yaml"
    proto.write_text(yaml.safe_dump({
        "name": "toy_train", "task": "train", "train_config": str(train_yaml), "baseline": "grpo", "checkpoints": [2],
        "eval": {"seed": 314159, "n_samples": 4}, "bootstrap": {"resamples": 100, "seed": 1, "correction": "inflate_t"},
        "settings": [{"label": "grpo", "method": "grpo", "seeds": [10], "steps": [0, 1, 2]},
                     {"label": "ds", "method": "dsgrpo", "seeds": [11], "steps": [0, 2]}]}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "exploration_trl.cli", "confirm", "--config", str(proto), "--output-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
    assert set(records) == {"grpo__seed10", "ds__seed11"}
    assert all(r["finished"] for r in records.values())
    assert [r["step"] for r in records["grpo__seed10"]["rows"]] == [0, 1, 2]
    assert [r["step"] for r in records["ds__seed11"]["rows"]] == [0, 2]
    assert all(0.0 <= r["pass@1"] <= r["pass@n"] <= 1.0 for rec in records.values() for r in rec["rows"])
    # The evaluation seed is the protocol's, not the RL seed: step 0 (the same model) is the same in both runs.
    assert records["grpo__seed10"]["rows"][0] == records["ds__seed11"]["rows"][0]
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps  # nothing reran
    assert "starting" not in again.stdout
