"""`exploration-trl demo` and its shipped warm start: the checkpoint loads offline through the Auto classes and
solves what its record says, and a shortened demo writes the documented summary, models, cards and plot."""

from __future__ import annotations

import json
import math

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
    assert models == ["warm_start", "dsgrpo", "grpo"]
    for name in models:
        entry = summary[name]
        assert set(demo.SUMMARY_KEYS) <= set(entry)
        assert set(entry["pass_at_k"]) == {"1", "2", "4", "8"}
        values = [entry["pass_at_k"][k] for k in ("1", "2", "4", "8")]
        assert all(0 <= v <= 1 for v in values) and values == sorted(values)
        assert entry["seconds"] > 0
    assert summary["warm_start"]["weights_changed"] is None and summary["warm_start"]["reward_first"] is None
    for name in ("dsgrpo", "grpo"):
        entry = summary[name]
        assert entry["weights_changed"] is True
        assert math.isfinite(entry["reward_first"]) and math.isfinite(entry["reward_last"])
        folder = out / name
        assert (folder / "model.safetensors").is_file() and (folder / "eval" / "results.json").is_file()
        card = (folder / "README.md").read_text()
        assert "pass@1" in card and "countdown-tiny" in card
        assert 'tokenizer("nums: 3 5 7\\ntarget: 22\\n"' in card  # the plain-text prompt it was trained on
        assert exploration_trl.PROJECT_URL in card and "pypi.org" not in card
    assert summary["dsgrpo"]["setting"] == demo.DEMO_SETTINGS["dsgrpo"]
    assert summary["grpo"]["setting"] == {}
    assert (out / "pass_at_k.png").stat().st_size > 10_000
    # the printed table has a row per model with its pass@1
    for name in models:
        row = next(line for line in printed.splitlines() if line.startswith(f"| {name} "))
        assert f"{100 * summary[name]['pass_at_k']['1']:.1f}" in row
    assert "[demo]" in printed and "step" in printed  # progress


@pytest.mark.parametrize("argv, message", [
    (["--method", "ppo"], "--method"),
    (["--compare", "grpo,bogus"], "--compare"),
    (["--steps", "0"], "--steps"),
])
def test_bad_demo_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    assert cli_main(["demo", "--quick", "--output", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "d").exists()


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
