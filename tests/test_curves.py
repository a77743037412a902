"""`exploration-trl countdown-tiny --curves --quick`: the budget experiment end to end on a smoke budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exploration_trl.experiments.research import curves


def test_quick_curves_writes_rows_verdicts_and_plot(tmp_path):
    data = curves.run_curves(["grpo", "dsgrpo_best"], [0, 1], tmp_path, quick=True, workers=1, command="test")
    saved = json.loads((tmp_path / curves.CURVES_FILE).read_text())
    assert (tmp_path / curves.PLOT_FILE).stat().st_size > 10_000
    rows = saved["rows"]
    assert {(r["label"], r["seed"], r["step"]) for r in rows} == {
        (lb, sd, st) for lb in ("grpo", "dsgrpo_best") for sd in (0, 1) for st in curves.QUICK_EVAL_STEPS}
    for r in rows:
        assert 0 <= r["pass@1"] <= r["pass@64"] <= 1 and r["token_entropy"] > 0 and r["distinct_correct"] >= 0
    step0 = {(r["label"], r["seed"]): r["pass@1"] for r in rows if r["step"] == 0}
    assert len(set(step0.values())) <= 2  # step 0 is the warm start: the same for every setting of a seed
    # Four steps barely move either setting from the warm start: with 2 seeds each step after 0 is compared with
    # GRPO's trajectory (steps 2 and 4), and neither clears 2 standard errors either way: "no".
    v = saved["verdicts"]["dsgrpo_best"]["vs_grpo"]
    assert v["verdict"] == "no" and v["compared"] == 2 and v["last"]["step"] == 4 and v["last"]["seeds"] == 2
    last = [r for r in rows if r["label"] == "dsgrpo_best" and r["step"] == 4]
    assert v["last"]["pass@1"] == pytest.approx(sum(r["pass@1"] for r in last) / 2)
    assert v["last"]["pass@64"] == pytest.approx(sum(r["pass@64"] for r in last) / 2)
    assert abs(v["best"]["z"]) <= 2 and abs(v["last"]["z"]) <= 2
    assert saved["verdicts"]["grpo"]["vs_grpo"] is None
    assert saved["missing"] == [] and all(r["finished"] for r in saved["ran"])
    assert data["plot"].endswith(curves.PLOT_FILE)
    # a rerun resumes: nothing left to train
    again = curves.run_curves(["grpo", "dsgrpo_best"], [0, 1], tmp_path, quick=True, workers=1, command="test")
    assert again["rows"] == saved["rows"]


def test_run_order_keeps_settings_paired_over_seeds():
    assert curves.plan(["a", "b", "c"], [0, 1]) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("c", 0), ("c", 1)]


def test_cli_curves_quick(tmp_path, capsys):
    from exploration_trl.cli import main

    out = tmp_path / "cli"
    assert main(["countdown-tiny", "--curves", "--quick", "--curves-settings", "grpo", "--curves-seeds", "0",
                 "--output-dir", str(out)]) == 0
    saved = json.loads((out / curves.CURVES_FILE).read_text())
    assert saved["command"].startswith("exploration-trl") or "countdown-tiny" in saved["command"]
    assert [r["step"] for r in saved["rows"]] == list(curves.QUICK_EVAL_STEPS)
    assert (out / curves.PLOT_FILE).is_file()
    assert "| grpo " in capsys.readouterr().out


def test_cli_curves_refuses_flags_of_other_modes(tmp_path, capsys):
    from exploration_trl.cli import main

    assert main(["countdown-tiny", "--curves", "--methods", "grpo", "--output-dir", str(tmp_path)]) != 0
    assert "error: --methods does not apply to --curves" in capsys.readouterr().err
    assert not (tmp_path / curves.CURVES_FILE).exists()


def test_cli_curves_warm_start_is_where_the_runs_start(tmp_path, capsys):
    """`--curves-warm-start` (the scale check): the runs load that folder. A copy of the shipped warm start with its
    weights zeroed samples uniformly over the characters and solves nothing at step 0, where the shipped one solves
    about a fifth; curves.json records the folder."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from exploration_trl.cli import main

    ws = tmp_path / "ws"
    shutil.copytree(curves.warm_start_dir(), ws)
    weights = load_file(str(ws / "model.safetensors"))
    save_file({k: torch.zeros_like(v) for k, v in weights.items()}, str(ws / "model.safetensors"))
    out = tmp_path / "cli"
    assert main(["countdown-tiny", "--curves", "--quick", "--curves-settings", "grpo", "--curves-seeds", "0",
                 "--curves-steps", "0", "--curves-warm-start", str(ws), "--output-dir", str(out)]) == 0
    saved = json.loads((out / curves.CURVES_FILE).read_text())
    assert [(r["step"], r["pass@1"]) for r in saved["rows"]] == [(0, 0.0)]
    assert saved["warm_start"]["path"] == str(ws) and saved["warm_start"]["shipped"] is False
    assert saved["warm_start"]["num_parameters"] == 105_792

    capsys.readouterr()
    assert main(["countdown-tiny", "--curves", "--quick", "--curves-warm-start", str(tmp_path / "nope"),
                 "--output-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--curves-warm-start" in err[0] and "--sft-only --export" in err[0]
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("name, verdict", [("curves.json", "no"), ("curves_scale.json", "beats")])
def test_documented_verdicts_follow_from_the_documented_rows(name, verdict):
    """docs/curves.json (the demo's warm start) and docs/curves_scale.json (the 3x larger one): the verdicts the docs
    reports are the rule's on the stored rows, so a change to the rule that would change them fails here."""
    data = json.loads((Path(__file__).resolve().parents[1] / "docs" / name).read_text())
    assert curves.verdicts(data["rows"]) == data["verdicts"]
    assert data["verdicts"]["kl_cov_best"]["vs_grpo"]["verdict"] == verdict
    assert data["verdicts"]["pkpo_published"]["vs_grpo"]["verdict"] == "beats"
    assert not data["missing"]
