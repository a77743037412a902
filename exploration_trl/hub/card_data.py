"""The card's YAML header: Hub metadata and the `model-index`, as `huggingface_hub.ModelCard.load` reads them.

* `base_model` (a Hub id; left out when the model was a local folder with no Hub id behind it),
* `library_name`: `peft` for an adapter folder (`adapter_config.json`), else `transformers`,
* `tags`: `exploration-trl`, each method of the composition, `grpo`, `rlvr`, `trl`,
* `datasets`: the training set's Hub id when it has one,
* `model-index`: pass@1 and pass@k (largest k) per benchmark.

Keys the card does not manage (`license`, `language`, ...) and tags others added survive an update.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BENCHMARK_DATASETS",
    "adapter_settings",
    "adapter_type",
    "bench_meta",
    "build_card_data",
    "detect_adapter",
    "eval_results_from",
    "existing_metadata",
    "resolve_base_model",
    "resolve_dataset",
]

logger = logging.getLogger(__name__)

#: Built-in benchmark -> (Hub dataset id or None, config, split, display name).
BENCHMARK_DATASETS: dict[str, tuple[str | None, str | None, str | None, str]] = {
    "gsm8k": ("openai/gsm8k", "main", "test", "GSM8K"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "MATH-500"),
    "humaneval": ("openai/openai_humaneval", None, "test", "HumanEval"),
    "aime24": (None, None, None, "AIME 2024"),
    "aime25": (None, None, None, "AIME 2025"),
    "amc23": (None, None, None, "AMC 2023"),
    "countdown3": (None, None, None, "Countdown-3"),
    "countdown": (None, None, None, "Countdown (synthetic)"),
    # `exploration-trl demo` / `countdown-tiny`: training problems and their held-out test problems.
    "countdown-tiny": (None, None, None, "countdown-tiny (3 numbers in 1..12, targets 1..100)"),
    "countdown_tiny_test": (None, None, None, "countdown-tiny held-out problems"),
}
BASE_TAGS = ("exploration-trl",)
TRAILING_TAGS = ("grpo", "rlvr", "trl")
#: Header keys the card writes itself; every other key of an existing card is kept.
MANAGED_KEYS = {"base_model", "library_name", "tags", "datasets", "model-index", "model_name", "pipeline_tag",
                "eval_results"}
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def detect_adapter(output_dir: str | Path) -> bool:
    """True when the folder holds a PEFT adapter (`adapter_config.json`)."""
    return (Path(output_dir) / "adapter_config.json").is_file()


def _adapter_config(output_dir: Path) -> dict:
    try:
        return json.loads((output_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def adapter_type(output_dir: Path, config: Mapping | None = None) -> str:
    """The adapter's PEFT type as it is usually written (`LoRA`, ...); `LoRA` when the config does not say."""
    name = (config if config is not None else _adapter_config(output_dir)).get("peft_type") or "LoRA"
    name = str(getattr(name, "value", name))
    return {"LORA": "LoRA"}.get(name, name)


#: Adapter settings a card lists (those present in `adapter_config.json`), in this order.
ADAPTER_KEYS = ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias",
                "use_rslora", "use_dora", "init_lora_weights")


def adapter_settings(output_dir: Path, config: Mapping | None = None) -> list[tuple[str, str]]:
    """`(key, value)` rows of the adapter's settings (rank, alpha, dropout, target modules, ...) from `config` (a
    PEFT config as a dict) or the folder's `adapter_config.json`; `[]` when there is neither."""
    config = dict(config) if config is not None else _adapter_config(output_dir)
    rows = []
    for key in ADAPTER_KEYS:
        value = config.get(key)
        if value is None or (key in ("use_rslora", "use_dora") and value is False):
            continue
        if hasattr(value, "value"):  # enums (peft_type)
            value = value.value
        if isinstance(value, (set, frozenset, list, tuple)):
            value = ", ".join(sorted(map(str, value)))
        rows.append((key, str(value)))
    return rows


def _is_local(name: str) -> bool:
    p = Path(name).expanduser()
    return p.exists() or name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or not _HUB_ID_RE.match(name)


def resolve_base_model(base_model: str | None, output_dir: Path, depth: int = 0) -> tuple[str | None, str]:
    """`(hub_id or None, display text)`. A local folder has no Hub id unless it is an adapter of a Hub model."""
    if base_model is None:
        base_model = _adapter_config(output_dir).get("base_model_name_or_path")
        if base_model is None:
            return None, "unknown"
    name = str(base_model)
    if not _is_local(name):
        return name, f"[{name}](https://huggingface.co/{name})"
    local = Path(name).expanduser()
    if depth < 3 and (local / "adapter_config.json").is_file():
        inner = _adapter_config(local).get("base_model_name_or_path")
        if inner:
            hub, _ = resolve_base_model(inner, local, depth + 1)
            if hub:
                return hub, f"[{hub}](https://huggingface.co/{hub}) + the adapter in `{local.name}`"
    return None, f"`{local.name or name}` (a local checkpoint, not on the Hub)"


def resolve_dataset(dataset: Any) -> tuple[list[str], str | None]:
    """`(Hub dataset ids for the metadata, markdown for the body)`."""
    if dataset is None or dataset == "" or dataset == []:
        return [], None
    items = [dataset] if isinstance(dataset, (str, os.PathLike)) else list(dataset)
    ids, shown = [], []
    for item in items:
        name = str(item)
        if name in BENCHMARK_DATASETS:
            hub, config, split, display = BENCHMARK_DATASETS[name]
            if hub:
                ids.append(hub)
                shown.append(f"[{display}](https://huggingface.co/datasets/{hub}) (`{name}`)")
            else:
                shown.append(f"{display} (built into exploration-trl)")
        elif _is_local(name) or Path(name).suffix in (".jsonl", ".json", ".parquet", ".csv", ".gz"):
            shown.append(f"`{Path(name).name}` (a local file)")
        else:
            ids.append(name)
            shown.append(f"[{name}](https://huggingface.co/datasets/{name})")
    return list(dict.fromkeys(ids)), ", ".join(shown)


def bench_meta(name: str) -> tuple[str, str | None, str | None, str]:
    """`(dataset id, config, split, display name)` of a benchmark; an unknown one is its own id and name."""
    hub, config, split, display = BENCHMARK_DATASETS.get(name, (None, None, None, None))
    return hub or name, config, split, display or name


def eval_results_from(results: Sequence[Mapping]) -> list:
    """`huggingface_hub.EvalResult`s: pass@1 and pass@k (largest k) per benchmark, as fractions rounded to 4 places."""
    from huggingface_hub import EvalResult

    out = []
    for r in results:
        dataset_type, config, split, display = bench_meta(r["benchmark"])
        ks = sorted(r["pass_at_k"])
        chosen = [1] if 1 in ks else ks[:1]
        if ks[-1] not in chosen:
            chosen.append(ks[-1])
        args = {k: v for k, v in (("n", r.get("n")), ("temperature", r.get("temperature"))) if v is not None}
        for k in chosen:
            out.append(EvalResult(
                task_type="text-generation",
                task_name="Text Generation",
                dataset_type=dataset_type,
                dataset_name=display,
                dataset_config=config,
                dataset_split=split,
                metric_type=f"pass@{k}",
                metric_name=f"pass@{k}",
                metric_value=round(float(r["pass_at_k"][k]), 4),
                metric_args=args or None,
            ))
    return out


def existing_metadata(readme: Path) -> dict:
    """The YAML header of the card already in the folder (`{}` when there is none or it is broken)."""
    if not readme.is_file():
        return {}
    try:
        from huggingface_hub import ModelCard

        return ModelCard.load(readme).data.to_dict()
    except Exception as e:  # noqa: BLE001 - a broken header is replaced, not fatal
        logger.warning("model card: could not read the metadata of %s (%s); rewriting it", readme, e)
        return {}


def build_card_data(
    existing: Mapping[str, Any],
    methods: Sequence[str],
    shapings: Sequence[str],
    replaced_tags: Collection[str],
    base_model: str | None,
    adapter: str | None,
    dataset_ids: Sequence[str],
    model_name: str,
    results: Sequence[Mapping],
):
    """The `ModelCardData` of the header. `methods` are the parts of the composition and `shapings` the shapings
    that were on (their names are tags), `replaced_tags` every method or shaping name a card may have tagged (an
    existing card's are dropped, its other tags kept), `base_model` a Hub id or None, `adapter` the adapter type of
    an adapter folder (None for a full model)."""
    from huggingface_hub import ModelCardData

    method_tags = [*BASE_TAGS, *methods, *TRAILING_TAGS, *shapings]
    if adapter is not None:
        method_tags += ["peft", adapter.lower()] if adapter else ["peft"]
    # foreign tags survive, except method names (the method may have changed) and `base_model:*` tags, which the
    # Hub derives from `base_model` itself (PEFT writes one with the local path of the base model)
    old_tags = [t for t in existing.get("tags") or []
                if isinstance(t, str) and t not in replaced_tags and t not in ("lora", "peft")
                and not t.startswith("base_model:")]
    tags = list(dict.fromkeys(method_tags + old_tags))
    extra = {k: v for k, v in existing.items() if k not in MANAGED_KEYS and k != "licence"}  # TRL writes `licence`
    return ModelCardData(
        base_model=base_model,
        library_name="peft" if adapter is not None else "transformers",
        pipeline_tag="text-generation",
        tags=tags,
        datasets=list(dataset_ids) or None,
        model_name=model_name if results else None,  # only the model-index needs it
        eval_results=eval_results_from(results) or None,
        **extra,
    )
