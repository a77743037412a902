"""The tables of a card: pass@k per benchmark and the method's and GRPO's hyperparameters (the framework versions
are `exploration_trl.eval.results.package_versions`, the record `results.json` keeps too)."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..methods import method_infos, shapings
from .card_data import bench_meta

__all__ = ["extract_hyperparameters", "result_table", "still_on"]

#: The GRPO / optimisation settings worth showing on a card (when present in the config).
GRPO_KEYS = (
    "learning_rate", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "max_steps", "num_train_epochs",
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
    "steps_per_generation", "num_iterations", "max_completion_length", "temperature", "top_p", "beta", "epsilon",
    "epsilon_high", "delta", "loss_type", "scale_rewards", "importance_sampling_level", "mask_truncated_completions",
    "top_entropy_quantile", "correct_reward_threshold", "use_vllm", "bf16", "activation_checkpointing", "seed",
)


def _fmt_value(v: Any) -> str:
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt_value(x) for x in v) or "[]"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}"


def result_table(results: Sequence[Mapping]) -> tuple[list[str], list[list[str]]]:
    """`(header, rows)` of the pass@k table: one row per benchmark, pass@k / avg@n / maj@n in %."""
    ks = sorted({k for r in results for k in r["pass_at_k"]})
    header = ["benchmark", "problems", "n", "temperature"] + [f"pass@{k}" for k in ks] + ["avg@n", "maj@n"]
    rows = []
    for r in results:
        _, _, _, display = bench_meta(r["benchmark"])
        rows.append(
            [display, _fmt_value(r.get("num_problems")), _fmt_value(r.get("n")), _fmt_value(r.get("temperature"))]
            + [_pct(r["pass_at_k"].get(k)) for k in ks]
            + [_pct(r.get("avg_at_n")), _pct(r.get("maj_at_n"))]
        )
    return header, rows


def _args_dict(training_args: Any) -> dict[str, Any]:
    if training_args is None:
        return {}
    if isinstance(training_args, Mapping):
        return dict(training_args)
    if dataclasses.is_dataclass(training_args):
        return {f.name: getattr(training_args, f.name, None) for f in dataclasses.fields(training_args)}
    if hasattr(training_args, "to_dict"):
        return dict(training_args.to_dict())
    return dict(vars(training_args))


def still_on(training_args: Any) -> bool:
    """True when the config switches on a shaping (STILL's perplexity shaping or position bonus): one of the
    coefficients of a registered shaping is not 0."""
    args = _args_dict(training_args)
    return any(float(args.get(k) or 0.0) != 0.0 for shaping in shapings() for k in shaping.coefficients)


def extract_hyperparameters(method: str | None, training_args: Any) -> dict[str, list[tuple[str, str]]]:
    """`{"method": [(field, value)], "grpo": [(field, value)]}` from a config object or a dict.

    `method` lists the fields with the method's config prefixes (`MethodInfo.config_prefixes`: `casp_*`, ...) plus
    the shaping fields when a shaping is on; `grpo` lists :data:`GRPO_KEYS` that the config has (`max_steps` or
    `num_train_epochs`, whichever decided the run length)."""
    args = _args_dict(training_args)
    out: dict[str, list[tuple[str, str]]] = {"method": [], "grpo": []}
    if not args:
        return out
    prefixes = tuple(p for info in method_infos(method) for p in info.config_prefixes)
    for key in sorted(args):
        if prefixes and key.startswith(prefixes):
            out["method"].append((key, _fmt_value(args[key])))
    if still_on(args):
        shaping_prefixes = tuple(p for shaping in shapings() for p in shaping.config_prefixes)
        out["method"] += [(k, _fmt_value(v)) for k, v in args.items() if k.startswith(shaping_prefixes)]
    for key in GRPO_KEYS:
        if key not in args:
            continue
        if key == "num_train_epochs" and (args.get("max_steps") or 0) > 0:
            continue
        if key == "max_steps" and (args.get("max_steps") or 0) <= 0:
            continue
        out["grpo"].append((key, _fmt_value(args[key])))
    return out
