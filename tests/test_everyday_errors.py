"""Everyday use without surprises: one clear line for every mistake, no silent no-op, a `--help` that helps, the
package's card from the Python API, and cards and console that say when training did nothing.

Each error test asserts the exact line the user sees (`tests/test_cli.py` holds the older ones).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import exploration_trl as et
from exploration_trl.cli import check_prompt_lengths, check_rewards, main, parse_train_args
from exploration_trl.errors import NoRewardError
from exploration_trl.rewards import get_reward, is_correct, missing_columns
from helpers import CLI_BASE as BASE
from helpers import grpo_kwargs, run_error, toy_checkpoint, toy_dataset, train, write_yaml

GRADED_REWARDS = '''
def graded(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [len(set(t)) / 8 for t in texts]


def needs_answer(completions, answer, **kwargs):
    return [1.0 for _ in completions]


def boom(completions, **kwargs):
    raise ValueError("my bug")


def nothing(completions, **kwargs):
    return [None for _ in completions]
'''


def jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    """`my_rewards.py` in the current folder (which is not on sys.path: the CLI must find it itself)."""
    (tmp_path / "my_rewards.py").write_text(GRADED_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    sys.modules.pop("my_rewards", None)
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


# --------------------------------------------------------------------------------------------- 1. one clear line
def test_yaml_syntax_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: grpo\nfoo: [1,\n")
    assert run_error(capsys, ["train", "--config", str(bad)]) == (
        f"error: config file '{bad}' is not valid YAML at line 3, column 1 (expected the node content, but found "
        "'<stream end>'); fix the syntax there"
    )


def test_config_without_value(capsys):
    assert run_error(capsys, ["train", "--config"]) == (
        "error: --config needs a YAML file, e.g. exploration-trl train --config configs/smoke_toy_countdown.yaml"
    )


def test_fractional_max_steps(tmp_path, capsys):
    path = write_yaml(tmp_path, max_steps=2.5)
    assert run_error(capsys, ["train", "--config", path]) == (
        f"error: max_steps in {path} must be a whole number, got 2.5; write e.g. max_steps: 10"
    )


def test_wrong_type_on_the_command_line_is_one_line_without_usage(tmp_path, capsys):
    assert main(["train", "--config", write_yaml(tmp_path), "--learning_rate", "fast"]) == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and len(err.splitlines()) <= 2, err
    assert err.splitlines()[-1] == ("error: --learning_rate 'fast' on the command line is not a number; give e.g. "
                                    "--learning_rate 1e-6")


def test_wrong_type_in_yaml_and_numbers_yaml_reads_as_strings(tmp_path, capsys):
    path = write_yaml(tmp_path, learning_rate="fast")
    assert run_error(capsys, ["train", "--config", path]) == (
        f"error: learning_rate in {path} must be a number, got 'fast'; write e.g. learning_rate: 1e-6"
    )
    # PyYAML reads `1e-6` (no dot) as a string; it is a number all the same.
    path = tmp_path / "sci.yaml"
    path.write_text(yaml.safe_dump({**BASE, "output_dir": str(tmp_path / "o")}) + "learning_rate: 1e-6\n")
    _, args, _ = parse_train_args(["--config", str(path)])
    assert args.learning_rate == 1e-6


def test_temperature_zero(tmp_path, capsys):
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, temperature=0)]) == (
        "error: temperature is 0 but must be > 0: GRPO learns from sampled completions (TRL's default: 1.0)"
    )


@pytest.mark.parametrize(("content", "problem"), [
    ("", "is empty; it needs one row per prompt (for .jsonl, one JSON object per line such as {\"prompt\": \"...\"})"),
    ('{"prompt": "a"}\n{"prompt": \n', ": line 2 is not valid JSON (Expecting value, column 1); fix or remove that line "
                                       "(one JSON object per line)"),
], ids=["empty", "malformed"])
def test_empty_or_malformed_jsonl(tmp_path, capsys, content, problem):
    (tmp_path / "d.jsonl").write_text(content)
    data = str(tmp_path / "d.jsonl")
    sep = "" if problem.startswith(":") else " "
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, dataset_name=data)]) == (
        f"error: dataset_name '{data}'{sep}{problem}"
    )


def test_model_folder_that_does_not_exist(tmp_path, capsys):
    missing = str(tmp_path / "nope" / "model")
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, model_name_or_path=missing)]) == (
        f"error: model_name_or_path '{missing}': no such folder; point it at a saved model folder or a Hub id such "
        "as Qwen/Qwen2.5-0.5B-Instruct"
    )


def test_hub_id_while_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    name = "exploration-trl-tests/no-such-model"
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, model_name_or_path=name)]) == (
        f"error: model_name_or_path '{name}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
        f"download it once online (`hf download {name}`) or point model_name_or_path at a local folder"
    )


def test_use_vllm_without_vllm(tmp_path, capsys, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("trl.import_utils"), "is_vllm_available", lambda *a, **k: False)
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, use_vllm=True)]) == (
        "error: use_vllm is true but vLLM is not installed; pip install 'exploration-trl[vllm]' (on a CUDA machine; "
        "on a CPU: scripts/install_vllm_cpu.sh), or set use_vllm: false to generate with transformers"
    )


def test_eval_model_folder_that_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert run_error(capsys, ["eval", "--model", "outputs/nope", "--benchmark", "countdown3"]) == (
        "error: --model 'outputs/nope': no such folder; point it at a saved model folder or a Hub id such as "
        "Qwen/Qwen2.5-0.5B-Instruct"
    )


def test_null_prompt_names_the_row(tmp_path, capsys):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": None, "answer": "2"}])
    path = write_yaml(tmp_path, dataset_name=data, reward_funcs=["math_accuracy"])
    assert run_error(capsys, ["train", "--config", path]) == (
        f"error: dataset '{data}' row 1 (counting from 0): its 'prompt' is null; fill it in or drop the row"
    )


def test_reward_column_the_dataset_lacks(tmp_path, capsys, rewards_module):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "solution": "1"}, {"prompt": "b", "solution": "2"}])
    for reward, name in (("math_accuracy", "math_accuracy"), ("my_rewards.needs_answer", "needs_answer")):
        path = write_yaml(tmp_path, dataset_name=data, reward_funcs=[reward])
        assert run_error(capsys, ["train", "--config", path]) == (
            f"error: reward '{name}' reads the column 'answer', which dataset '{data}' lacks (columns: prompt, "
            "solution); add or rename the column, or choose another reward"
        )


def test_missing_columns_follows_options_and_alternatives():
    assert missing_columns(get_reward("math_accuracy", answer_column="solution"), ["prompt", "solution"]) == []
    assert missing_columns(get_reward("countdown"), ["prompt", "input", "output"]) == []
    assert missing_columns(get_reward("countdown"), ["prompt", "nums"]) == ["target"]
    assert missing_columns(get_reward("code_execution"), ["prompt", "test"]) == ["entry_point"]


def test_reward_exception_keeps_its_traceback_and_names_the_reward(tmp_path, rewards_module):
    """Run as a user does (the console script, in the folder of the reward module, no PYTHONPATH)."""
    script = Path(sys.executable).with_name("exploration-trl")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "exploration_trl.cli"]
    path = write_yaml(tmp_path, reward_funcs=["my_rewards.boom"])
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command + ["train", "--config", path], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 1
    err = proc.stderr
    assert "Traceback (most recent call last)" in err
    assert f'File "{tmp_path / "my_rewards.py"}", line 12, in boom' in err  # the user's own frame
    named = "exploration_trl.rewards.base.RewardFunctionError: reward 'boom' raised ValueError: my bug"
    assert "\nValueError: my bug" in err and named in err  # the original first, then the one naming the reward
    assert err.index("\nValueError: my bug") < err.index("direct cause") < err.index(named)


def test_negative_max_train_samples_and_zero(tmp_path, capsys):
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, max_train_samples=0)]) == (
        "error: max_train_samples is 0, which leaves no training rows; set a positive number or remove the key to use "
        "every row"
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize(("method", "key"), [
    ("casp", "casp_alpha"), ("progrpo", "progrpo_alpha"), ("dsgrpo", "ds_gamma_p"), ("dsgrpo", "ds_gamma_n"),
    ("kl_cov", "kl_cov_coef"), ("grpo", "ppl_shaping_alpha"), ("grpo", "epsilon"), ("grpo", "learning_rate"),
])
def test_negative_coefficients(tmp_path, capsys, method, key):
    msg = run_error(capsys, ["train", "--config", write_yaml(tmp_path, method=method, **{key: -0.1})])
    assert msg.startswith(f"error: {key} is -0.1 but must be >= 0: it is "), msg


def test_correct_threshold_at_the_maximum_reward(tmp_path, capsys):
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, correct_reward_threshold=1.0)]) == (
        "error: correct_reward_threshold is 1, but the highest total reward these rewards can give is 1 (countdown "
        "with reward_weights 1), so every completion would count as wrong (correct means total reward > "
        "correct_reward_threshold); set it below 1, e.g. 0.5"
    )


def test_correct_threshold_below_a_weighted_maximum_passes():
    from types import SimpleNamespace

    rewards = [get_reward("countdown"), get_reward("format")]
    dataset = SimpleNamespace(column_names=["prompt", "nums", "target"])
    args = SimpleNamespace(reward_weights=[1.0, 0.1], correct_reward_threshold=1.05)
    check_rewards(rewards, dataset, args, "countdown")  # 1.05 < 1 + 0.1: some completion can be correct
    args.correct_reward_threshold = 1.1
    with pytest.raises(ValueError, match="highest total reward these rewards can give is 1.1"):
        check_rewards(rewards, dataset, args, "countdown")


def test_empty_reward_list(tmp_path, capsys):
    assert run_error(capsys, ["train", "--config", write_yaml(tmp_path, reward_funcs=[])]) == (
        "error: reward_funcs is empty ([]); list at least one reward (e.g. [math_accuracy, format]) or remove the key "
        "to use the dataset's default (countdown)"
    )


def test_prompt_longer_than_the_context(tmp_path, capsys):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": "a" * 1100, "answer": "1"}] + [{"prompt": "b", "answer": "1"}] * 3)
    path = write_yaml(tmp_path, dataset_name=data, reward_funcs=["math_accuracy"])
    assert run_error(capsys, ["train", "--config", path]) == (
        f"error: dataset '{data}' row 0 has a 1100-token prompt, as long as the model's whole context (1024 tokens) "
        "with no room for a completion; shorten or drop long prompts (filter the dataset)"
    )


def test_prompt_plus_completion_longer_than_the_context_warns(tmp_path, capsys):
    from types import SimpleNamespace

    from datasets import Dataset

    ckpt = toy_checkpoint(tmp_path / "ckpt")  # char-level tokenizer, 1024 positions
    dataset = Dataset.from_dict({"prompt": ["a" * 1000, "b"]})
    capsys.readouterr()
    check_prompt_lengths(ckpt, dataset, SimpleNamespace(max_completion_length=64), "d.jsonl")
    assert capsys.readouterr().err.strip() == (
        "warning: 1 prompts (e.g. row 0, 1000 tokens) plus max_completion_length (64) exceed the model's context "
        "(1024 tokens): their completions get cut short; lower max_completion_length or shorten those prompts"
    )


def test_compare_across_benchmarks(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"benchmark": "gsm8k", "problems": [{"n": 2, "c": 1}]}))
    b.write_text(json.dumps({"benchmark": "math500", "problems": [{"n": 2, "c": 0}]}))
    assert run_error(capsys, ["compare", str(a), str(b)]) == (
        f"error: compare: the results are of different benchmarks (gsm8k: {a}; math500: {b}); compare runs of one "
        "benchmark, or pass --mixed-benchmarks to put them side by side anyway"
    )
    assert main(["compare", str(a), str(b), "--mixed-benchmarks"]) == 0
    assert "gsm8k" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------- 2. no silent no-op
def test_all_rewards_none_stops_at_the_first_batch(tmp_path, capsys, rewards_module):
    path = write_yaml(tmp_path, reward_funcs=["my_rewards.nothing"])
    assert run_error(capsys, ["train", "--config", path]) == (
        "error: no reward scored any completion: every reward (nothing) returned None for every completion of the "
        "first batch; check that the dataset has the columns the rewards read (e.g. `answer` for math_accuracy) and "
        "that its reference answers parse"
    )


def test_all_rewards_none_from_the_python_api(tmp_path):
    def none_reward(completions, **kwargs):
        return [None] * len(completions)

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    cls = et.get_trainer_class("grpo")
    with pytest.raises(NoRewardError, match=r"^no reward scored any completion: every reward \(none_reward\)"):
        train(cls, cls.config_class, ckpt, tmp_path / "out", reward=none_reward, max_steps=1)


def test_entropy_by_correctness_is_left_out_not_nan(tmp_path):
    """With no correct completion, `entropy_correct` is not logged (it used to be NaN); `entropy_wrong` is."""
    def zero_reward(completions, **kwargs):
        return [0.0] * len(completions)

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    cls = et.get_trainer_class("grpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path / "out", reward=zero_reward, max_steps=2)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all("exploration/entropy_correct" not in h for h in logs)
    assert all(math.isfinite(h["exploration/entropy_wrong"]) for h in logs)
    assert all(math.isfinite(v) for h in logs for k, v in h.items() if k.startswith("exploration/"))


# --------------------------------------------------------------------------------------------- one "correct"
def test_one_definition_of_correct_in_training_and_eval(tmp_path):
    from exploration_trl.core import advantages as core_adv
    from exploration_trl.eval.harness import run_eval

    rewards = torch.tensor([0.0, 0.4, 0.6, 1.0])
    assert is_correct(rewards, 0.5).tolist() == [False, False, True, True]
    assert is_correct(None) is False and not is_correct(float("nan"))
    # DS-GRPO (core) gives its bonus to exactly the completions is_correct calls correct.
    adv, logps, mask = torch.zeros(4), torch.full((4, 3), -1.0), torch.ones(4, 3)
    new = core_adv.dsgrpo_advantages(adv, rewards, logps, mask, gamma_p=0.1, gamma_n=0.1, correct_threshold=0.5,
                                   granularity="token")
    assert ((new - adv[:, None]).mean(-1) > 0).tolist() == is_correct(rewards, 0.5).tolist()
    # Eval counts a completion correct by the same rule, at the default threshold, and records it.
    ckpt = toy_checkpoint(tmp_path / "ckpt")
    results = run_eval(ckpt, "countdown3", n=2, max_tokens=4, limit=2, output_dir=tmp_path / "eval", progress=False,
                       diversity=False, semantic=False)
    assert results["settings"]["correct_reward_threshold"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert all(r["correct"] == [bool(is_correct(s)) for s in r["scores"]] for r in rows)


# --------------------------------------------------------------------------------------------- 3. defaults
def test_cpu_and_float32_chosen_without_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("exploration_trl.cli.train_args._has_accelerator", lambda: False)
    cfg = {k: v for k, v in BASE.items() if k != "use_cpu"}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**cfg, "output_dir": str(tmp_path / "out")}))
    _, args, _ = parse_train_args(["--config", str(path)])
    assert (args.use_cpu, args.bf16) == (True, False)
    assert capsys.readouterr().err.strip() == (
        "info: no GPU found, so training runs on the CPU in float32 (use_cpu: true, bf16: false); set them in the "
        "YAML to choose otherwise"
    )
    _, args, _ = parse_train_args(["--config", str(path), "--bf16", "true"])  # what the user sets wins
    assert (args.use_cpu, args.bf16) == (True, True)
    assert capsys.readouterr().err.strip() == (
        "info: no GPU found, so training runs on the CPU (use_cpu: true); set it in the YAML to choose otherwise"
    )


def test_python_api_configs_also_choose_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr("exploration_trl.trainers.base.has_accelerator", lambda: False)
    args = et.CaSPConfig(output_dir="unused", report_to=[])  # TRL alone stops at "doesn't support bf16/gpu"
    assert (args.use_cpu, args.bf16, str(args.device)) == (True, False, "cpu")


def test_no_gradient_checkpointing_future_warning_and_trl_default_kept():
    from exploration_trl.trainers import ExplorationGRPOConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ExplorationGRPOConfig(output_dir="unused", use_cpu=True, report_to=[])
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True  # TRL's default: on
    off = ExplorationGRPOConfig(output_dir="unused", use_cpu=True, report_to=[], activation_checkpointing=False)
    assert off.activation_checkpointing is False and off.gradient_checkpointing is False


def test_training_prints_no_gradient_checkpointing_deprecations(tmp_path):
    """TRL 1.16's rollout helpers call transformers' deprecated names on every rollout; only those are filtered."""
    from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

    cls = et.get_trainer_class("casp")
    ckpt = toy_checkpoint(tmp_path / "ckpt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = cls(model=ckpt, reward_funcs=letter_reward, train_dataset=toy_dataset(),
                      args=cls.config_class(**grpo_kwargs(tmp_path / "out", max_steps=1)))
        trainer.train()
        warnings.warn("`is_gradient_checkpointing` is deprecated (from user code)", FutureWarning)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "gradient_checkpointing" in m and "user code" not in m]
    assert any("user code" in m for m in messages)  # the filter is scoped to transformers' model code


def test_reward_module_in_the_current_folder_trains_and_no_false_alarm(tmp_path, capsys, rewards_module):
    """`my_rewards.graded` from ./my_rewards.py without PYTHONPATH; a run that learns gets no warning."""
    path = write_yaml(tmp_path, reward_funcs=["my_rewards.graded"], max_steps=2, learning_rate=0.05,
                      max_completion_length=8)
    assert main(["train", "--config", path]) == 0
    assert "warning:" not in capsys.readouterr().err
    card = (tmp_path / "out" / "README.md").read_text()
    assert "**Note:**" not in card and "unchanged" not in card and "fine-tuned version of" in card
    assert "- Rewards: `graded`" in card


# --------------------------------------------------------------------------------------------- 4. --help
def test_train_help(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "usage: exploration-trl train --config FILE.yaml [--KEY VALUE ...]"
    from exploration_trl.cli.train_help_text import method_summaries
    from exploration_trl.trainers import METHODS

    assert list(method_summaries()) == list(METHODS)  # every method is listed with its one-line summary (its record's)
    for name, summary in method_summaries().items():
        assert f"\n  {name:<38}{summary}\n" in out, name
    assert "  progrpo                               ProGRPO / ARM: confidence-reweighted advantages in mixed groups " \
           "(advantage side)" in out
    assert len(lines) < 60 + 19 * len(METHODS)  # compact: 9 methods and their keys took ~225 lines, 14 take 271
    assert "  --config FILE" in out and "  --help-all" in out
    for method in ("grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov"):
        assert f"\n  {method} " in out
    for key, default in (("casp_alpha", "0.01"), ("progrpo_alpha", "0.3"), ("ds_gamma_p", "0.01"),
                         ("kl_cov_ratio", "0.002"), ("clip_cov_ratio", "0.0002"), ("correct_reward_threshold", "0.0")):
        assert f"  {key} = {default}" in out, key
    assert "its preset changes TRL's defaults: epsilon_high = 0.28" in out  # ProGRPO's


@pytest.mark.parametrize("argv", [[], ["--max_steps", "2"]])
def test_train_without_config_or_model_prints_usage_and_exits_2(tmp_path, capsys, monkeypatch, argv):
    """A bare `train` (or one with overrides only) used to start a long run of the toy model on every default and
    write trainer_output/: it stops before parsing, with the usage and one line naming what is missing."""
    import exploration_trl.cli.train as train_module

    def must_not_parse(argv):
        raise AssertionError("train went on to parse (and run) without a config or a model")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_module, "parse_train_args_and_trainer", must_not_parse)
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: exploration-trl train --config FILE.yaml [--KEY VALUE ...]\n"
                          "       exploration-trl train --model_name_or_path MODEL [--KEY VALUE ...]\n")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [("error: train needs a training YAML or a model: give --config FILE.yaml (e.g. "
                       "configs/smoke_toy_countdown.yaml) or --model_name_or_path MODEL (a Hub id, a local folder, or "
                       "toy); `exploration-trl train --help` lists the keys")]
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # no trainer_output/


@pytest.mark.parametrize("argv", [["--config", "c.yaml"], ["--config=c.yaml"], ["--model_name_or_path", "toy"],
                                  ["--model-name-or-path=toy", "--max_steps", "1"]])
def test_a_config_or_a_model_is_enough_to_go_on(argv):
    from exploration_trl.cli.train import check_config_or_model

    check_config_or_model(argv)  # raises nothing


def test_train_help_all_and_unknown_key_points_to_it(tmp_path, capsys):
    assert main(["train", "--help-all"]) == 0
    out = capsys.readouterr().out
    assert "--per_device_train_batch_size" in out and len(out.splitlines()) > 1000
    path = write_yaml(tmp_path, num_generationz=4)
    assert run_error(capsys, ["train", "--config", path]) == (
        f"error: unknown key 'num_generationz' in {path} (did you mean 'num_generations'?); `exploration-trl train "
        "--help` lists the method keys and `--help-all` every TRL/transformers key"
    )


# --------------------------------------------------------------------------------------------- 5. Python API card
def test_python_api_save_model_writes_the_package_card_with_rewards_and_lora(tmp_path):
    from peft import LoraConfig

    from helpers import distinct_char_reward, letter_reward

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    args = et.CaSPConfig(**grpo_kwargs(tmp_path / "out", max_steps=1))
    trainer = et.CaSPTrainer(model=ckpt, reward_funcs=[letter_reward, distinct_char_reward], args=args,
                             train_dataset=toy_dataset(),
                             peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "[None](https://huggingface.co/None)" not in card  # TRL's generic card
    assert "**CaSP" in card and "`CaSPTrainer`" in card
    assert "- Rewards: `letter_reward`, `distinct_char_reward`" in card
    assert "| `r` | 4 |" in card and "| `lora_alpha` | 8 |" in card and "| `target_modules` | q_proj, v_proj |" in card
    assert "| `casp_alpha` | 0.01 |" in card
    # push_to_hub() ends in create_model_card (TRL's keyword arguments accepted) and gets the same card.
    (tmp_path / "out" / "README.md").unlink()
    trainer.create_model_card(model_name="out", tags=["x"])
    assert "- Rewards: `letter_reward`, `distinct_char_reward`" in (tmp_path / "out" / "README.md").read_text()


def test_composed_trainer_class_from_the_top_level():
    cls = et.get_trainer_class("progrpo+casp")
    assert cls.__name__ == "ProGRPOCaSPTrainer" and cls.config_class.__name__ == "ProGRPOCaSPConfig"


# --------------------------------------------------------------------------------------------- 6. push
def test_push_to_hub_checks_the_network_before_training(tmp_path, capsys, monkeypatch):
    def unreachable(**kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_fake")
    monkeypatch.setattr("huggingface_hub.whoami", unreachable)
    path = write_yaml(tmp_path, push_to_hub=True, hub_model_id="me/toy")
    assert run_error(capsys, ["train", "--config", path]) == (
        "error: cannot push to the Hub: network unreachable (Name or service not known)"
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_push_dry_run_renders_the_card_and_lists_files_offline(tmp_path, capsys, monkeypatch):
    from exploration_trl.hub import write_model_card
    from exploration_trl.toy import build_toy, save_toy

    def no_network(*args, **kwargs):
        raise AssertionError("a dry run must not touch the network")

    for name in ("create_repo", "upload_folder", "whoami", "get_token"):
        monkeypatch.setattr(f"huggingface_hub.{name}", no_network)
    folder = save_toy(*build_toy("abc", seed=0), tmp_path / "model")
    write_model_card(folder, "casp", "Qwen/Qwen2.5-0.5B-Instruct", dataset="gsm8k")
    (folder / "checkpoint-5").mkdir()
    (folder / "checkpoint-5" / "model.safetensors").write_bytes(b"x")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert main(["push", "--output-dir", str(folder), "--repo-id", "me/casp-toy", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("dry run:"):].splitlines()  # (DeepSpeed may print its accelerator line first)
    assert lines[0].startswith("dry run: would upload 7 files (") and lines[0].endswith(
        f"from {folder} to https://huggingface.co/me/casp-toy:")
    assert any(line.startswith("  model.safetensors  (") for line in lines)
    assert "checkpoint-5" not in out  # checkpoints are not uploaded
    assert "README.md as it would be uploaded:" in out and "base_model: Qwen/Qwen2.5-0.5B-Instruct" in out
    assert "me/casp-toy" in out.split("README.md as it would be uploaded:")[1]  # the card names the repo
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert run_error(capsys, ["push", "--output-dir", str(folder)]) == (
        "error: cannot push to the Hub: --repo-id is missing; give USER/NAME (or use --dry-run to preview)"
    )


# --------------------------------------------------------------------------------------------- 7. logs
def test_eval_progress_in_a_log_has_no_cursor_moves(tmp_path, capsys):
    from exploration_trl.eval.harness import run_eval

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    run_eval(ckpt, "countdown3", n=2, max_tokens=4, limit=3, batch_size=2, output_dir=tmp_path / "eval",
             diversity=False, semantic=False, progress=True)
    err = capsys.readouterr().err
    assert "eval countdown3" in err  # progress is shown
    assert "\x1b[A" not in err


# --------------------------------------------------------------------------------------------- issue 13, item 3
def test_run_that_changed_nothing_says_so_on_the_console_and_in_the_card(tmp_path, capsys):
    """The toy never solves Countdown: the reward never varies, every advantage is 0 and no weight moves."""
    assert main(["train", "--config", write_yaml(tmp_path, max_steps=2)]) == 0
    err = capsys.readouterr().err
    warnings_ = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings_ == [
        "warning: Training changed no weight: the saved weights are exactly the starting model's, so this model is "
        "the base model unchanged.",
        "warning: The reward never varied within a group: on every step all completions of each prompt got the same "
        "reward (frac_reward_zero_std = 1), so every GRPO advantage was 0 and the reward taught nothing. A starting "
        "model that sometimes succeeds, more generations per prompt (num_generations) or a graded reward gives a "
        "learning signal.",
    ]
    out = tmp_path / "out"
    assert (out / "model.safetensors").read_bytes() == (out / "toy_base" / "model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert "**unchanged**: a reinforcement-learning run with **GRPO**" in card
    assert "fine-tuned version" not in card
    assert "**Note:** Training changed no weight" in card and "**Note:** The reward never varied within a group" in card
    from exploration_trl.hub import load_card_state

    assert load_card_state(out)["outcome"] == {"weights_changed": False, "reward_never_varied": True, "diverged": None}
