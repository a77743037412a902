"""`exploration-trl train`: YAML parsing, the toy demo end to end, and one-line errors for bad input."""

import json
import subprocess
import sys
from pathlib import Path

from exploration_trl.cli import main, parse_train_args
from helpers import run_error, toy_checkpoint, write_yaml


def test_yaml_sets_method_config_and_cli_overrides(tmp_path):
    path = write_yaml(tmp_path, method="progrpo+casp", casp_alpha=0.02, progrpo_alpha=0.5)
    script, args, model = parse_train_args(["--config", path, "--casp_top_n", "5"])
    assert script.method == "progrpo+casp" and type(args).__name__ == "ProGRPOCaSPConfig"
    assert (args.casp_alpha, args.casp_top_n, args.progrpo_alpha, args.epsilon_high) == (0.02, 5, 0.5, 0.28)
    assert model.model_name_or_path == "toy"


def test_unknown_yaml_key(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, method="casp", casp_alpah=0.1)])
    assert "unknown key 'casp_alpah'" in msg and "did you mean 'casp_alpha'" in msg


def test_key_of_another_method(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, kl_cov_ratio=0.1)])
    assert msg.startswith("error: key 'kl_cov_ratio' in ") and "is a kl_cov setting; set `method: kl_cov`" in msg


def test_unknown_cli_key(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path), "--num_generationz", "4"])
    assert "unknown key 'num_generationz'" in msg and "command line" in msg


def test_unknown_method(tmp_path, capsys):
    # The choices are the registry's, in registration order (a new method's module adds itself, no edit here).
    from exploration_trl.methods import METHODS

    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, method="ppo")])
    assert msg == (f"error: unknown method 'ppo'; choose one of: {', '.join(METHODS)} (or advantage+loss, e.g. "
                   "progrpo+casp)")
    assert msg.startswith("error: unknown method 'ppo'; choose one of: grpo, progrpo, dsgrpo, casp, kl_cov, ")


def test_two_loss_side_methods(tmp_path, capsys):
    from exploration_trl.methods import ADVANTAGE_SIDE, LOSS_SIDE

    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, method="casp+kl_cov")])
    assert f"at most one of {', '.join(ADVANTAGE_SIDE)} and one of {', '.join(LOSS_SIDE)}" in msg
    assert {"progrpo", "pkpo"} <= set(ADVANTAGE_SIDE) and {"casp", "kl_cov", "clip_cov"} <= set(LOSS_SIDE)


def test_unknown_reward(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, reward_funcs=["acuracy"])])
    assert "unknown reward 'acuracy'" in msg and "math_accuracy" in msg and "countdown" in msg


def test_num_generations_below_two(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, num_generations=1)])
    assert "2 generations" in msg and "1" in msg


def test_batch_not_divisible_into_groups(tmp_path, capsys):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, per_device_train_batch_size=6)])
    assert "generation_batch_size (6) must be divisible by num_generations (4)" in msg


def test_missing_dataset_column(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"question": "1+1?", "answer": "2"}) for _ in range(8)))
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, dataset_name=str(data), reward_funcs=["math_accuracy"])])
    assert msg == ("error: dataset '%s' has no column 'prompt' (columns: question, answer); set dataset_prompt_column "
                   "to the prompt column" % data)


def test_missing_config_file(capsys):
    assert run_error(capsys, ["train", "--config", "nope.yaml"]) == "error: config file 'nope.yaml' not found"


def test_local_jsonl_with_prompt_column_trains(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) for i in range(8)))
    path = write_yaml(tmp_path, dataset_name=str(data), dataset_prompt_column="question", reward_funcs=["math_accuracy"])
    assert main(["train", "--config", path]) == 0
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_demo_config_as_a_console_script(tmp_path):
    """The README's demo path: the console script on the shipped demo YAML writes a model and its card."""
    out = tmp_path / "demo"
    script = Path(sys.executable).with_name("exploration-trl")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "exploration_trl.cli"]
    proc = subprocess.run(
        command + ["train", "--config", "configs/smoke_toy_countdown.yaml", "--output_dir", str(out), "--max_steps", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    card = (out / "README.md").read_text()
    assert "casp" in card.lower()


def test_composed_method_saves_and_reloads_training_args(tmp_path, monkeypatch):
    """A composed config class must pickle into training_args.bin and load in a fresh process. The CLI resolves the
    method string once, from the YAML to the saved card (`parse_train_args_and_trainer` hands the trainer on)."""
    from exploration_trl import methods
    from exploration_trl.trainers import composition

    calls, original = [], methods.parse_method
    monkeypatch.setattr(methods, "parse_method", lambda method: calls.append(method) or original(method))
    monkeypatch.setattr(composition, "parse_method", methods.parse_method)
    path = write_yaml(tmp_path, method="progrpo+casp")
    assert main(["train", "--config", path]) == 0
    assert calls == ["progrpo+casp"] and "ProGRPOCaSPTrainer" in (tmp_path / "out" / "README.md").read_text()
    proc = subprocess.run(
        [sys.executable, "-c", "import torch,sys; a = torch.load(sys.argv[1], weights_only=False); "
         "print(type(a).__name__, a.casp_top_n, a.progrpo_alpha)", str(tmp_path / "out" / "training_args.bin")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.stdout.split() == ["ProGRPOCaSPConfig", "3", "0.3"], proc.stderr[-1500:]


def test_push_to_hub_without_token_fails_in_one_line_before_training(tmp_path, capsys, monkeypatch):
    """`push_to_hub: true` without a token: one clear error line before any training (no run lost at its end)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, push_to_hub=True, hub_model_id="me/toy")])
    assert msg == "error: cannot push to the Hub: no token found (run `hf auth login`, or set HF_TOKEN)"
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_prompt_template_and_system_prompt_make_chat_prompts(tmp_path):
    from exploration_trl.cli import load_train_dataset

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "What is 2+3?", "answer": "#### 5"}) + "\n")
    path = write_yaml(tmp_path, dataset_name=str(data), dataset_prompt_column="question",
                      dataset_prompt_template="{prompt}\nPut the final answer in \\boxed{}.", system_prompt="Be brief.")
    script, args, _ = parse_train_args(["--config", path])
    dataset, _ = load_train_dataset(script, args)
    assert dataset[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?\nPut the final answer in \\boxed{}."},
    ]


def test_prompt_template_without_placeholder(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, dataset_name=str(data),
                                                            reward_funcs=["math_accuracy"],
                                                            dataset_prompt_template="Solve it.")])
    assert msg == "error: dataset_prompt_template must contain {prompt} (where the question goes)"


def test_top_level_help_lists_every_registered_subcommand(capsys):
    """The top-level description is built from the registered subcommands (it once listed them by hand and left
    `demo` out)."""
    import argparse

    import pytest

    from exploration_trl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    names = list(sub.choices)
    assert {"train", "eval", "compare", "demo", "push"} <= set(names)
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"exploration-trl command line: {', '.join(names)}." in help_text


def test_train_ends_with_the_folder_and_card_it_saved(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", "--config", write_yaml(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"saved the model to {out} and its card to {out / 'README.md'}"
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_eval_records_and_prints_the_model_as_the_user_named_it(tmp_path, capsys, monkeypatch):
    """`--model out --output-dir ev/run1` records and prints `out`, not `../../out` (the path relative to the results
    folder, which the settings keep for resuming); an absolute path is printed as given but recorded relative to the
    results folder, since `push` uploads results.json. The model card still finds the results of its own folder."""
    from exploration_trl.hub.eval_results import collect_results

    monkeypatch.chdir(tmp_path)
    toy_checkpoint(tmp_path / "out")
    flags = ["--benchmark", "countdown3", "--n", "2", "--limit", "1", "--max-tokens", "8", "--no-semantic", "--quiet"]

    assert main(["eval", "--model", "out", "--output-dir", "ev/run1", *flags]) == 0
    printed = capsys.readouterr().out
    assert "problems x n=2 (out)" in printed and "../../out" not in printed
    results = json.loads((tmp_path / "ev" / "run1" / "results.json").read_text())
    assert results["model"] == "out" and results["settings"]["model"] == "../../out"

    absolute = str(tmp_path / "out")
    assert main(["eval", "--model", absolute, "--output-dir", "ev/run2", *flags]) == 0
    assert f"problems x n=2 ({absolute})" in capsys.readouterr().out
    assert json.loads((tmp_path / "ev" / "run2" / "results.json").read_text())["model"] == "../../out"

    assert main(["eval", "--model", "out", "--output-dir", "out/eval_countdown3", *flags]) == 0
    assert [r["benchmark"] for r in collect_results("out")] == ["countdown3"]
