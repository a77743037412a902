"""A held-out style self-check: `train` on 25 broken YAMLs, in-process through `exploration_trl.cli.main`. Each ends
with one `error:` line and exit status 2, with no traceback, and leaves no output folder behind."""

from __future__ import annotations

import pytest
import yaml

from helpers import CLI_BASE, run_error


def _jsonl(tmp_path, text):
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    return str(path)


def _file(tmp_path):
    path = tmp_path / "taken"
    path.write_text("not a folder")
    return str(path)


#: name -> (changes to CLI_BASE, or a callable tmp_path -> changes; raw YAML text instead when a str; a fragment
#: the error line must contain)
CASES = {
    "yaml_syntax": ("method: grpo\nmax_steps: [1\n", "not valid YAML"),
    "not_a_mapping": ("- method\n- grpo\n", "cfg.yaml"),
    "empty_file": ("", "is empty; give at least model_name_or_path"),
    "comments_only": ("# method: grpo\n# max_steps: 4\n", "is empty; give at least model_name_or_path"),
    "empty_mapping": ("{}\n", "is empty; give at least model_name_or_path"),
    "bf16_word": ({"bf16": "maybe"}, "bf16"),
    "one_generation": ({"num_generations": 1}, "2 generations per prompt"),  # TRL's own line
    "unknown_key": ({"learning_rat": 0.1}, "learning_rat"),
    "unknown_method": ({"method": "grpoo"}, "grpoo"),
    "max_steps_float": ({"max_steps": 2.5}, "max_steps"),
    "learning_rate_word": ({"learning_rate": "fast"}, "learning_rate"),
    "negative_casp_alpha": ({"method": "casp", "casp_alpha": -0.1}, "casp_alpha"),
    "temperature_zero": ({"temperature": 0}, "temperature"),
    "negative_epsilon": ({"epsilon": -0.2}, "epsilon"),
    "kl_cov_ratio_above_one": ({"method": "kl_cov", "kl_cov_ratio": 2.0}, "kl_cov_ratio"),
    "clip_cov_window_reversed": ({"method": "clip_cov", "clip_cov_lb": 1.0, "clip_cov_ub": 0.5}, "clip_cov_lb"),
    "missing_model_folder": ({"model_name_or_path": "./no-such-model"}, "no-such-model"),
    "missing_dataset_file": ({"dataset_name": "missing.jsonl"}, "missing.jsonl"),
    "empty_reward_list": ({"reward_funcs": []}, "reward_funcs"),
    "unknown_reward": ({"reward_funcs": ["countdwn"]}, "countdwn"),
    "no_training_rows": ({"max_train_samples": 0}, "max_train_samples"),
    "null_prompt": (lambda t: {"dataset_name": _jsonl(t, '{"prompt": null, "answer": "1"}\n'),
                               "reward_funcs": ["math_accuracy"]}, "null"),
    "bad_jsonl_line": (lambda t: {"dataset_name": _jsonl(t, '{"prompt": "1+1", "answer": "2"}\nnot json\n'),
                                  "reward_funcs": ["math_accuracy"]}, "line 2"),
    "output_dir_is_a_file": (lambda t: {"output_dir": _file(t)}, "taken"),
    "output_dir_under_a_file": (lambda t: {"output_dir": _file(t) + "/run"}, "taken"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_yaml_is_one_line_and_leaves_nothing(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec, fragment = CASES[name]
    out = tmp_path / "out"
    path = tmp_path / "cfg.yaml"
    if isinstance(spec, str):
        path.write_text(spec)
    else:
        changes = spec(tmp_path) if callable(spec) else spec
        cfg = {**CLI_BASE, "output_dir": str(out), **changes}
        path.write_text(yaml.safe_dump(cfg))
    before = sorted(p.name for p in tmp_path.iterdir())
    line = run_error(capsys, ["train", "--config", str(path)])
    assert fragment in line, line
    assert not out.exists(), f"{name} left {sorted(p.name for p in out.rglob('*'))}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing else created either


def test_at_least_twenty_cases():
    assert len(CASES) >= 20
