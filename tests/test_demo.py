"""`exploration-trl demo` and its shipped warm start: the checkpoint loads offline through the Auto classes and
solves what its record says, and a shortened demo writes the documented summary, models, cards and plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import exploration_trl

from exploration_trl.cli import main as cli_main
from exploration_trl.experiments import countdown_tiny, demo

#: Held-out pass@1 range the README documents for the shipped warm start (measured: 22.4% on 200 problems x 64).
DOCUMENTED_PASS_AT_1 = (0.18, 0.27)


def test_shipped_warm_start_loads_through_auto_classes_and_solves_the_documented_fraction(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = demo.warm_start_dir()
    info = demo.warm_start_info()
    size = sum(f.stat().st_size for f in path.iterdir() if f.name != countdown_tiny.EXPORT_INFO)
    assert size == info["size_bytes"] and size < 1_000_000  # what the README states: 0.41 MB
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"] == 105_792
    # The Auto tokenizer is the one the warm start was trained with.
    prompt = countdown_tiny.prompt_text([8, 4, 1], 13)
    _, trained_tok = countdown_tiny.load_checkpoint(path)
    assert tok(prompt)["input_ids"] == trained_tok(prompt)["input_ids"]

    settings = demo.demo_settings(quick=False)
    settings.eval.n_samples = 16
    _, test = countdown_tiny.make_problems(settings.data, settings.seed)
    bench = countdown_tiny.heldout_benchmark(test, 200)
    torch.set_num_threads(1)
    res = countdown_tiny.evaluate(model.eval(), tok, bench, settings, tmp_path / "eval")
    pass1 = res["summary"]["pass_at_k"]["1"]
    assert DOCUMENTED_PASS_AT_1[0] <= pass1 <= DOCUMENTED_PASS_AT_1[1], pass1
    assert DOCUMENTED_PASS_AT_1[0] <= info["pass_at_1"] <= DOCUMENTED_PASS_AT_1[1]


def test_warm_start_never_saw_a_heldout_problem():
    settings = demo.demo_settings(quick=True)
    train, test = countdown_tiny.make_problems(settings.data, settings.seed)
    key = countdown_tiny._key
    assert not {key(p) for p in train} & {key(p) for p in test}
    assert demo.warm_start_info()["split"]["train_test_overlap"] == 0
    assert (settings.data.num_train, settings.data.num_test) == (3000, 200)


def test_quick_demo_writes_the_summary_models_cards_and_plot(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli_main(["demo", "--quick", "--output", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "demo_summary.json").read_text())
    models = [k for k in summary if k != demo.META_KEY]
    method = demo.DEFAULT_METHOD
    assert models == ["warm_start", method, "grpo"]
    for name in models:
        entry = summary[name]
        assert set(demo.SUMMARY_KEYS) <= set(entry)
        assert set(entry["pass_at_k"]) == {"1", "2", "4", "8"}
        values = [entry["pass_at_k"][k] for k in ("1", "2", "4", "8")]
        assert all(0 <= v <= 1 for v in values) and values == sorted(values)
        assert entry["seconds"] > 0
    assert summary["warm_start"]["weights_changed"] is None and summary["warm_start"]["reward_first"] is None
    for name in (method, "grpo"):
        entry = summary[name]
        assert entry["weights_changed"] is True
        assert math.isfinite(entry["reward_first"]) and math.isfinite(entry["reward_last"])
        folder = out / name
        assert (folder / "model.safetensors").is_file() and (folder / "eval" / "results.json").is_file()
        card = (folder / "README.md").read_text()
        assert "pass@1" in card and "countdown-tiny" in card
        assert 'tokenizer("nums: 3 5 7\\ntarget: 22\\n"' in card  # the plain-text prompt it was trained on
        assert exploration_trl.PROJECT_URL in card and "pypi.org" not in card
    assert summary[method]["setting"] == demo.DEMO_SETTINGS[method]
    assert summary["grpo"]["setting"] == {}
    assert (out / "pass_at_k.png").stat().st_size > 10_000
    # the printed table has a row per model with its pass@1
    for name in models:
        row = next(line for line in printed.splitlines() if line.startswith(f"| {name} "))
        assert f"{100 * summary[name]['pass_at_k']['1']:.1f}" in row
    assert "[demo]" in printed and "step" in printed  # progress
    # Held-out evaluation on the way: the warm start is step 0 of every trajectory, the last point is the final eval.
    assert summary[demo.META_KEY]["eval_steps"] == [0, 2, 4]
    assert [p["step"] for p in summary["warm_start"]["trajectory"]] == [0]
    for name in (method, "grpo"):
        t = summary[name]["trajectory"]
        assert [p["step"] for p in t] == [0, 2, 4]
        assert t[0] == summary["warm_start"]["trajectory"][0]
        final = summary[name]["pass_at_k"]
        assert (t[-1]["pass@1"], t[-1]["pass@64"]) == (final["1"], final["8"])
        assert all(0 <= p["pass@1"] <= p["pass@64"] <= 1 and p["distinct_correct"] >= 0 for p in t)
    assert set(summary[demo.META_KEY]["versus_grpo"]) == {method}
    assert (out / "trajectory.png").stat().st_size > 10_000
    assert "| step 0 " in printed and "| step 2 " in printed and "(reference)" in printed


@pytest.mark.parametrize("argv, message", [
    (["--method", "ppo"], "--method"),
    (["--compare", "grpo,bogus"], "--compare"),
    (["--steps", "0"], "--steps"),
    (["--warm-start", "no_such_folder"], "--warm-start 'no_such_folder' is not a warm start"),
])
def test_bad_demo_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    assert cli_main(["demo", "--quick", "--output", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "d").exists()


def test_demo_warm_start_is_where_both_models_start(tmp_path, capsys):
    """`demo --warm-start DIR` (the scale check's larger model): everything starts from that folder. A copy of the
    shipped warm start with its weights zeroed samples uniformly and solves nothing, where the shipped one solves
    about a fifth; the summary records the folder."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    ws = tmp_path / "ws"
    shutil.copytree(demo.warm_start_dir(), ws)
    weights = load_file(str(ws / "model.safetensors"))
    save_file({k: torch.zeros_like(v) for k, v in weights.items()}, str(ws / "model.safetensors"))
    out = tmp_path / "demo"
    assert cli_main(["demo", "--quick", "--compare", "none", "--workers", "1", "--warm-start", str(ws),
                     "--output-dir", str(out)]) == 0
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary[demo.META_KEY]["warm_start"]["path"] == str(ws)
    assert summary["warm_start"]["pass_at_k"]["1"] == 0.0 and summary[demo.DEFAULT_METHOD]["pass_at_k"]["1"] == 0.0
    assert f"warm start: {ws}" in capsys.readouterr().out


@pytest.mark.slow
def test_documented_command_rebuilds_the_shipped_warm_start_exactly(tmp_path):
    """The shipped checkpoint is what its documented command makes (seed 0; about 6 minutes of SFT on one core)."""
    from safetensors.torch import load_file

    export = tmp_path / "warm_start"
    argv = ["countdown-tiny", "--sft-only", "--export", str(export), "--sft-hidden-size", "64", "--sft-layers", "2",
            "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "run")]
    assert cli_main(argv) == 0
    rebuilt = load_file(str(export / "model.safetensors"))
    shipped = load_file(str(demo.warm_start_dir() / "model.safetensors"))
    assert rebuilt.keys() == shipped.keys()
    assert max((rebuilt[k] - shipped[k]).abs().max().item() for k in shipped) == 0.0
    info = json.loads((export / countdown_tiny.EXPORT_INFO).read_text())
    assert info["pass_at_k"] == demo.warm_start_info()["pass_at_k"]


def _point(step, p1, p64):
    return {"step": step, "pass@1": p1, "pass@64": p64}


def test_versus_grpo_reads_grpos_trajectory_at_the_methods_pass_at_1():
    """GRPO's checkpoints (20/90) -> (30/80) -> (40/70): at pass@1 25 its trajectory is at 85, at 35 at 75; a method
    at (25, 88) is +3 points, at (35, 70) -5; a point outside GRPO's pass@1 range (45) is not compared."""
    summary = {"warm_start": {"trajectory": [_point(0, .2, .9)]},
               "grpo": {"trajectory": [_point(0, .2, .9), _point(100, .3, .8), _point(200, .4, .7)]},
               "m": {"trajectory": [_point(0, .2, .9), _point(100, .25, .88), _point(200, .35, .70),
                                    _point(300, .45, .9)]},
               demo.META_KEY: {}}
    vs = demo.versus_grpo(summary)
    assert set(vs) == {"m"}
    assert vs["m"]["best"]["step"] == 100 and vs["m"]["best"]["difference"] == pytest.approx(0.03)
    assert vs["m"]["last"]["step"] == 200 and vs["m"]["last"]["difference"] == pytest.approx(-0.05)
    assert vs["m"]["last"]["grpo_pass@64"] == pytest.approx(0.75)
    table = demo.trajectory_table(summary, 64)
    assert "+3.0" not in table.splitlines()[0] and "-5.0 at step 200 (best +3.0 at step 100)" in table
    assert demo.versus_grpo({k: v for k, v in summary.items() if k != "grpo"}) == {}


def test_the_demo_default_follows_the_budget_experiment():
    """The demo trains the setting that came closest to beating GRPO's trajectory in docs/curves.json (the issue's
    rule: if one beats GRPO, it is that one), and says which settings beat GRPO, as measured there."""
    from exploration_trl.experiments import curves

    data = json.loads((Path(__file__).resolve().parents[1] / "docs" / "curves.json").read_text())
    assert curves.closest_to_beating(data) == demo.DEFAULT_LABEL
    default = (demo.DEFAULT_METHOD, demo.DEMO_SETTINGS[demo.DEFAULT_METHOD])
    assert curves.settings_by_label()[demo.DEFAULT_LABEL] == default
    beats = {label for label, v in data["verdicts"].items() if (v.get("vs_grpo") or {}).get("verdict") == "beats"}
    assert set(demo.BEATS_GRPO) == beats


def test_closest_to_beating_takes_the_largest_margin():
    from exploration_trl.experiments import curves

    def v(z):
        return {"vs_grpo": {"verdict": "no", "best": {"z": z}}}

    assert curves.closest_to_beating({"verdicts": {"a": v(0.5), "b": v(1.7), "grpo": {"vs_grpo": None},
                                                   "c": {"vs_grpo": {"verdict": "no verdict", "best": None}}}}) == "b"
    assert curves.closest_to_beating({"verdicts": {}}) is None
