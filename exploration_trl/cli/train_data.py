"""`train`'s data checks before the model loads: the dataset and its prompt column, the rewards (their columns and
whether any completion can count as correct), and prompts that fit the model's context."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .common import CLIError, is_main_process


def load_train_dataset(script_args, training_args):
    """Built-in name, local jsonl/json/parquet/csv file, or Hub dataset; validated against the prompt column."""
    from ..data.builtin import BUILTIN_DATASETS
    from ..data.files import LOCAL_SUFFIXES, check_prompts, load_local_dataset

    name = script_args.dataset_name
    default_rewards: list[str] = []
    if name in BUILTIN_DATASETS:
        builder, default_rewards = BUILTIN_DATASETS[name]
        dataset = builder(seed=training_args.seed)
    elif Path(name).suffix in LOCAL_SUFFIXES:
        dataset = load_local_dataset(name)
    else:
        dataset, default_rewards = _benchmark_or_hub(name, script_args)
    column = script_args.dataset_prompt_column
    if column not in dataset.column_names:
        raise CLIError(
            f"dataset '{name}' has no column '{column}' (columns: "
            f"{', '.join(dataset.column_names)}); set dataset_prompt_column to the prompt column"
        )
    if column != "prompt":
        dataset = dataset.rename_column(column, "prompt")
    if script_args.max_train_samples is not None:
        dataset = dataset.select(range(min(script_args.max_train_samples, len(dataset))))
    check_prompts(dataset, column, name)
    if script_args.dataset_prompt_template or script_args.system_prompt:
        dataset = dataset.map(lambda row: {"prompt": _chat_prompt(row["prompt"], script_args)})
    return dataset, default_rewards


def _chat_prompt(prompt, script_args) -> list[dict]:
    """Apply `dataset_prompt_template` / `system_prompt`, giving a conversational prompt TRL renders with the
    model's chat template (raw Hub questions otherwise reach an instruct model with no answer-format request)."""
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    template = script_args.dataset_prompt_template
    if template:
        if "{prompt}" not in template:
            raise CLIError("dataset_prompt_template must contain {prompt} (where the question goes)")
        last = messages[-1]
        messages[-1] = {**last, "content": template.replace("{prompt}", last["content"])}
    if script_args.system_prompt and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": script_args.system_prompt})
    return messages


def _benchmark_or_hub(name, script_args):
    from datasets import Dataset, load_dataset

    try:
        from ..eval.benchmarks import BUILTIN_BENCHMARKS, load_benchmark
    except ImportError:  # pragma: no cover - eval is part of the package
        BUILTIN_BENCHMARKS = {}
    if name in BUILTIN_BENCHMARKS:
        bench = load_benchmark(name)
        return Dataset.from_list([{k: v for k, v in r.items() if k != "id"} for r in bench.records]), [bench.reward]
    try:
        return load_dataset(name, script_args.dataset_config, split=script_args.dataset_train_split), []
    except Exception as e:  # noqa: BLE001 - any loading failure becomes one line
        raise CLIError(f"could not load dataset '{name}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# ---------------------------------------------------------------------------------------------- rewards
def resolve_reward_funcs(script_args, default_rewards):
    from ..rewards import resolve_rewards

    if script_args.reward_funcs is not None and not script_args.reward_funcs:
        raise CLIError("reward_funcs is empty ([]); list at least one reward (e.g. [math_accuracy, format]) or remove "
                       "the key to use the dataset's default" + (f" ({', '.join(default_rewards)})" if default_rewards
                                                                 else ""))
    names = script_args.reward_funcs or default_rewards
    if not names:
        raise CLIError("reward_funcs is empty; list reward names (e.g. [math_accuracy, format]) or dotted paths")
    try:
        kwargs = json.loads(script_args.reward_kwargs) if isinstance(script_args.reward_kwargs, str) else script_args.reward_kwargs
    except json.JSONDecodeError as e:
        raise CLIError(f"reward_kwargs is not valid JSON: {e.msg}") from None
    # `my_rewards.score` in a YAML finds ./my_rewards.py without `PYTHONPATH=.`, as under `python -m`.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return resolve_rewards(names, kwargs)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def check_rewards(reward_funcs, dataset, training_args, dataset_name) -> None:
    """Before training: every reward finds the dataset columns it reads, and some completion can be correct."""
    from ..rewards import missing_columns, reward_range

    columns = dataset.column_names
    for func in reward_funcs:
        missing = missing_columns(func, columns)
        if missing:
            raise CLIError(
                f"reward '{_reward_name(func)}' reads the column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(c) for c in missing)}, which dataset '{dataset_name}' lacks (columns: "
                f"{', '.join(c for c in columns)}); add or rename the column, or choose another reward"
            )
    ranges = [reward_range(f) for f in reward_funcs]
    weights = training_args.reward_weights or [1.0] * len(reward_funcs)
    if None in ranges or len(weights) != len(reward_funcs):
        return
    best = sum(w * (hi if w >= 0 else lo) for w, (lo, hi) in zip(weights, ranges))
    threshold = training_args.correct_reward_threshold
    if threshold >= best:
        raise CLIError(
            f"correct_reward_threshold is {threshold:g}, but the highest total reward these rewards can give is "
            f"{best:g} ({', '.join(_reward_name(f) for f in reward_funcs)} with reward_weights "
            f"{', '.join(f'{w:g}' for w in weights)}), so every completion would count as wrong (correct means total "
            f"reward > correct_reward_threshold); set it below {best:g}, e.g. {best / 2:g}"
        )


def _context_length(config) -> int | None:
    config = getattr(config, "text_config", None) or config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _prompt_length(tokenizer, prompt) -> int:
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    else:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return len(ids)


def check_prompt_lengths(model: str, dataset, training_args, dataset_name, max_checked: int = 256) -> None:
    """Before the model loads: no prompt longer than the model's context; a warning when prompt plus
    `max_completion_length` does not fit. Reads only the tokenizer and `config.json`; checks the `max_checked`
    longest prompts (by characters)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        context = _context_length(AutoConfig.from_pretrained(model))
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception:  # noqa: BLE001 - no config or tokenizer here: the trainer reports it when it loads the model
        return
    if context is None:
        return
    prompts = dataset["prompt"]
    chars = [len(json.dumps(p)) if isinstance(p, list) else len(str(p)) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -chars[i])[:max_checked]
    lengths = {i: _prompt_length(tokenizer, prompts[i]) for i in order}
    i, longest = max(lengths.items(), key=lambda kv: kv[1])
    if longest >= context:
        raise CLIError(
            f"dataset '{dataset_name}' row {i} has a {longest}-token prompt, as long as the model's whole context "
            f"({context} tokens) with no room for a completion; shorten or drop long prompts (filter the dataset)"
        )
    too_long = sorted(j for j, n in lengths.items() if n + training_args.max_completion_length > context)
    if too_long and is_main_process():
        print(f"warning: {len(too_long)} prompts (e.g. row {too_long[0]}, {lengths[too_long[0]]} tokens) plus "
              f"max_completion_length ({training_args.max_completion_length}) exceed the model's context ({context} "
              "tokens): their completions get cut short; lower max_completion_length or shorten those prompts",
              file=sys.stderr)
