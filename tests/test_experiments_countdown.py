"""`exploration-trl countdown-tiny`: problem generation, the SFT cache, and the `--quick` end-to-end run."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from exploration_trl.experiments import countdown_tiny as cd
from exploration_trl.experiments.research import countdown_tiny_command as cd_command
from exploration_trl.rewards.countdown import countdown, evaluate_equation


def test_render_keeps_the_value():
    for nums in [(3, 7, 12), (2, 2, 9), (1, 5, 5), (8, 4, 2)]:
        for tree in cd.expressions(nums):
            v = cd._value(tree)
            if v is None:
                continue
            for full in (False, True):
                value, used = evaluate_equation(cd.render(tree, full_parens=full))
                assert value == v and sorted(used) == sorted(nums)


def test_minimal_parentheses():
    assert cd.render(("-", 12, ("+", 3, 2))) == "12-(3+2)"
    assert cd.render(("+", 12, ("-", 3, 2))) == "12+3-2"
    assert cd.render(("*", ("+", 1, 2), 3)) == "(1+2)*3"
    assert cd.render(("/", 8, ("*", 2, 2))) == "8/(2*2)"
    assert cd.render(("+", ("*", 3, 7), 12), full_parens=True) == "(3*7)+12"


def test_problems_split_and_solutions():
    data = cd.DataSettings(max_num=6, max_target=30, num_train=200, num_test=40, solutions_per_problem=3)
    train, test = cd.make_problems(data, seed=1)
    assert len(train) == 200 and len(test) == 40
    key = lambda p: (tuple(sorted(p["nums"])), p["target"])  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in test}
    assert len({key(p) for p in train}) == 200
    for p in train[:50] + test:
        assert len(p["nums"]) == 3 and 1 <= p["target"] <= 30 and p["solutions"]
        rewards = countdown(p["solutions"], nums=p["nums"], target=p["target"])
        assert rewards == [1.0] * len(p["solutions"])
    for p in train[:50]:
        assert 1 <= len(p["sft_texts"]) <= 3
        assert countdown(p["sft_texts"], nums=p["nums"], target=p["target"]) == [1.0] * len(p["sft_texts"])
    # several distinct correct answers exist per problem on average
    assert sum(len(p["solutions"]) for p in test) / len(test) > 2
    # seeded: the same split again
    again = cd.make_problems(data, seed=1)
    assert again[1] == test
    with pytest.raises(ValueError, match="distinct problems"):
        cd.make_problems(cd.DataSettings(max_num=3, max_target=10, num_train=500, num_test=10), seed=0)


def test_prompt_and_completion_format_is_graded_by_the_reward():
    prompt = cd.prompt_text([3, 7, 12], 33)
    assert prompt == "nums: 3 7 12\ntarget: 33\n"
    assert countdown(["7*3+12", "12+3*7", "(7*3)+12", "7*3*12"], nums=[3, 7, 12], target=33) == [1.0, 1.0, 1.0, 0.0]


def test_cache_key_tracks_the_settings_that_change_the_checkpoint():
    a, b = cd.quick_settings(0), cd.quick_settings(0)
    assert cd.cache_key(a) == cd.cache_key(b)
    b.rl.steps += 1
    b.eval.n_samples += 1
    assert cd.cache_key(a) == cd.cache_key(b)  # RL / eval settings do not change the SFT checkpoint
    b.sft.steps += 1
    assert cd.cache_key(a) != cd.cache_key(b)
    c = cd.quick_settings(1)
    assert cd.cache_key(a) != cd.cache_key(c)


def _parse(*argv):
    parser = argparse.ArgumentParser()
    cd_command.register(parser.add_subparsers())
    return parser.parse_args(["countdown-tiny", *argv])


def test_output_dir_flag_keeps_the_old_spelling_as_a_hidden_alias(capsys):
    assert _parse("--output-dir", "a").output == "a" and _parse("--output", "b").output == "b"
    assert _parse().output is None  # main_from_args picks runs/countdown_tiny, _sweep or _sft
    with pytest.raises(SystemExit):
        _parse("--help")
    shown = capsys.readouterr().out
    assert "--output-dir OUTPUT_DIR" in shown and shown.count("--output") == shown.count("--output-dir")  # alias hidden


def test_bad_cli_input(tmp_path):
    with pytest.raises(ValueError, match="--methods"):
        cd_command.main_from_args(_parse("--methods", "grpo,foo", "--output", str(tmp_path)))
    with pytest.raises(ValueError, match="--rl-steps"):
        cd_command.main_from_args(_parse("--quick", "--rl-steps", "0", "--output", str(tmp_path)))
    with pytest.raises(ValueError, match="--num-test"):
        cd_command.main_from_args(_parse("--quick", "--num-test", "100000", "--output", str(tmp_path)))


def test_quick_end_to_end(tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = _parse("--quick", "--methods", "grpo,casp", "--workers", "1", "--output-dir", str(out),
                  "--cache-dir", str(cache))
    assert cd_command.main_from_args(args) == 0
    printed = capsys.readouterr().out
    assert "pass@1 %" in printed and "| casp" in printed

    data = json.loads((out / "countdown_tiny.json").read_text())
    assert (out / "pass_at_k.png").stat().st_size > 1000
    assert set(data["results"]) == {"sft", "grpo", "casp"}
    assert data["split"]["train_test_overlap"] == 0
    assert data["sft"]["reused_cache"] is False
    n = data["settings"]["eval"]["n_samples"]
    for name, r in data["results"].items():
        ks = sorted(int(k) for k in r["pass_at_k"])
        assert ks[0] == 1 and ks[-1] == n
        values = [r["pass_at_k"][str(k)] for k in ks]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:])), (name, values)
        assert r["token_entropy"] is not None and math.isfinite(r["token_entropy"]) and r["token_entropy"] >= 0
        mult = r["solution_multiplicity"]
        assert mult is not None and 0.0 <= mult["mean"] <= n
        assert r["num_problems"] == data["split"]["num_test_evaluated"]
        if name != "sft":
            assert r["rl"]["seconds"] > 0 and r["rl"]["reward_mean"] is not None
            assert 0.0 <= r["rl"]["reward_mean"] <= 1.0

    # The warm start is cached by its settings: asking again reuses the checkpoint.
    settings = cd.quick_settings(0)
    train, _ = cd.make_problems(settings.data, settings.seed)
    path, info, reused = cd.warm_start(settings, train, cache, log=lambda *_: None)
    assert reused and str(path) == data["checkpoint"] and info["num_parameters"] > 0


def test_settings_table_gives_both_presets():
    default, quick = cd.Settings(seed=3), cd.quick_settings(3)
    for section, table in cd.SETTINGS_TABLE.items():
        for key, (d, q) in table.items():
            assert getattr(getattr(default, section), key) == d and getattr(getattr(quick, section), key) == q
    assert default.rl_seed == 3
    default.rl.seed = 5
    assert default.rl_seed == 5 and cd.Settings().rl.seed is None  # sections are not shared between instances


def test_quick_sweep_writes_the_frontier(tmp_path, capsys):
    from exploration_trl.experiments.research import countdown_sweep

    out = tmp_path / "sweep"
    args = _parse("--quick", "--sweep", "--workers", "1", "--output", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert cd_command.main_from_args(args) == 0
    assert "Best setting per method" in capsys.readouterr().out

    data = json.loads((out / "frontier.json").read_text())
    assert set(data) == {"rows"}
    n = cd.quick_settings().eval.n_samples
    metric_keys = {"pass_at_1", "pass_at_k", "distinct_correct", "entropy"}
    for row in data["rows"]:
        assert set(row) == {"method", "setting", "seeds", "k"} | metric_keys and row["k"] == n
        for key in metric_keys:
            assert set(row[key]) == {"mean", "std"} and math.isfinite(row[key]["mean"])
        assert 0 <= row["pass_at_1"]["mean"] <= row["pass_at_k"]["mean"] <= 1
    assert [r["method"] for r in data["rows"]] == ["initial_policy", *(m for m, _ in countdown_sweep.QUICK_GRID)]
    assert (out / "frontier.png").stat().st_size > 5000
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["split"]["train_test_overlap"] == 0 and sweep["rl_seeds"] == [0]
    assert all(r["rl"]["seconds"] > 0 for r in sweep["runs"])
    # The initial policy row is the warm start's own evaluation.
    sft_eval = json.loads(next((out / "eval" / "sft").glob("*.json")).read_text())
    assert data["rows"][0]["pass_at_1"]["mean"] == pytest.approx(sft_eval["summary"]["pass_at_k"]["1"])


def test_sft_only_export_is_a_loadable_checkpoint(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = tmp_path / "ckpt"
    args = _parse("--quick", "--sft-only", "--export", str(export), "--output", str(tmp_path / "out"),
                  "--cache-dir", str(tmp_path / "cache"))
    assert cd_command.main_from_args(args) == 0
    info = json.loads((export / cd.EXPORT_INFO).read_text())
    assert info["command"].startswith("exploration-trl countdown-tiny --sft-only --export") and "--quick" in info["command"]
    assert info["seed"] == 0 and info["settings"]["model"]["hidden_size"] == cd.quick_settings().model.hidden_size
    assert info["heldout"]["num_problems"] == cd.quick_settings().eval.num_problems
    assert 0 <= info["pass_at_1"] <= info["pass_at_k"][str(info["heldout"]["n_samples"])] <= 1
    files = {f.name for f in export.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", cd.EXPORT_INFO} <= files
    assert info["size_mb"] == pytest.approx(sum((export / f).stat().st_size for f in info["files"]) / 2**20)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    prompt = cd.prompt_text([3, 4, 5], 17)
    assert tok.decode(tok(prompt)["input_ids"]) == prompt  # spaces and newlines survive the reload

    # Nothing is overwritten, and --export needs --sft-only (and the reverse).
    with pytest.raises(ValueError, match="--export: .* is not an empty folder"):
        cd_command.main_from_args(args)
    with pytest.raises(ValueError, match="--export applies to --sft-only"):
        cd_command.main_from_args(_parse("--quick", "--export", str(tmp_path / "x")))
    with pytest.raises(ValueError, match="--sft-only needs --export"):
        cd_command.main_from_args(_parse("--quick", "--sft-only"))
