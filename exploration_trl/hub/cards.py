"""Model cards for trained output folders: `README.md` with Hub metadata, method, results, curves and citations.

`write_model_card(output_dir, method, base_model, ...)` renders `templates/model_card.md.j2` (a copy of
`model_cards/model_card.md.j2` in the repository) with `huggingface_hub.ModelCard.from_template`, so the YAML
header is exactly what `ModelCard.load` reads back:

* `base_model` (a Hub id; left out when the model was a local folder with no Hub id behind it),
* `library_name`: `peft` for an adapter folder (`adapter_config.json`), else `transformers`,
* `tags`: `exploration-trl`, each method of the composition, `grpo`, `rlvr`, `trl`,
* `datasets`: the training set's Hub id when it has one,
* `model-index`: pass@1 and pass@k (largest k) per benchmark from `exploration-trl eval`'s `results.json`.

The card is *updated* in place on a second call: the inputs of the first call are kept in an HTML comment at
the end of the card, so `write_model_card(output_dir)` (as `exploration-trl push` does) re-renders it with new
results while keeping the method, hyperparameters, curves and framework versions recorded at training time.
Metadata keys the card does not manage (`license`, `language`, ...) and text between
`<!-- exploration-trl:keep -->` and `<!-- /exploration-trl:keep -->` survive updates.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import logging
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from .citations import METHOD_PAPERS, PAPERS, bibtex_for, method_parts

__all__ = [
    "CARD_FILE",
    "CURVES_FILE",
    "RenderedCard",
    "write_model_card",
    "render_model_card",
    "load_card_state",
    "normalize_results",
    "collect_results",
    "eval_results_from",
    "extract_hyperparameters",
    "plot_training_curves",
    "detect_adapter",
    "TEMPLATE_NAME",
]

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
CURVES_FILE = "training_curves.png"
TEMPLATE_NAME = "model_card.md.j2"
STATE_TAG = "exploration-trl-card"
_STATE_RE = re.compile(r"<!-- " + STATE_TAG + r" (\{.*?\}) -->", re.DOTALL)
_KEEP_RE = re.compile(r"<!-- exploration-trl:keep -->.*?<!-- /exploration-trl:keep -->", re.DOTALL)
STATE_VERSION = 1

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
}

#: Config-field prefixes of each method's own hyperparameters.
METHOD_PREFIXES: dict[str, tuple[str, ...]] = {
    "progrpo": ("progrpo_",),
    "dsgrpo": ("ds_",),
    "casp": ("casp_",),
    "kl_cov": ("kl_cov_",),
    "clip_cov": ("clip_cov_",),
}
STILL_KEYS = ("ppl_shaping_alpha", "position_bonus_gamma", "position_bonus_start_step", "position_bonus_num_steps")
#: The GRPO / optimisation settings worth showing on a card (when present in the config).
GRPO_KEYS = (
    "learning_rate", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "max_steps", "num_train_epochs",
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
    "steps_per_generation", "num_iterations", "max_completion_length", "temperature", "top_p", "beta", "epsilon",
    "epsilon_high", "delta", "loss_type", "scale_rewards", "importance_sampling_level", "mask_truncated_completions",
    "top_entropy_quantile", "correct_reward_threshold", "use_vllm", "bf16", "gradient_checkpointing", "seed",
)
BASE_TAGS = ("exploration-trl",)
TRAILING_TAGS = ("grpo", "rlvr", "trl")
VERSION_PACKAGES = (
    "exploration-trl", "trl", "transformers", "peft", "torch", "datasets", "accelerate", "huggingface-hub",
)
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


# ------------------------------------------------------------------------------------------------ helpers
def detect_adapter(output_dir: str | Path) -> bool:
    """True when the folder holds a PEFT adapter (`adapter_config.json`)."""
    return (Path(output_dir) / "adapter_config.json").is_file()


def _adapter_config(output_dir: Path) -> dict:
    try:
        return json.loads((output_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _is_local(name: str) -> bool:
    p = Path(name).expanduser()
    return p.exists() or name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or not _HUB_ID_RE.match(name)


def _resolve_base_model(base_model: str | None, output_dir: Path, depth: int = 0) -> tuple[str | None, str]:
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
            hub, _ = _resolve_base_model(inner, local, depth + 1)
            if hub:
                return hub, f"[{hub}](https://huggingface.co/{hub}) + the adapter in `{local.name}`"
    return None, f"`{local.name or name}` (a local checkpoint, not on the Hub)"


def _resolve_dataset(dataset: Any) -> tuple[list[str], str | None]:
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


def extract_hyperparameters(method: str | None, training_args: Any) -> dict[str, list[tuple[str, str]]]:
    """`{"method": [(field, value)], "grpo": [(field, value)]}` from a config object or a dict.

    `method` lists the method's prefixed fields (`casp_*`, `progrpo_*`, ...) plus the STILL shaper fields when a
    shaper is on; `grpo` lists :data:`GRPO_KEYS` that the config has (`max_steps` or `num_train_epochs`, whichever
    decided the run length)."""
    args = _args_dict(training_args)
    out: dict[str, list[tuple[str, str]]] = {"method": [], "grpo": []}
    if not args:
        return out
    prefixes = tuple(p for part in method_parts(method) for p in METHOD_PREFIXES.get(part, ()))
    for key in sorted(args):
        if prefixes and key.startswith(prefixes):
            out["method"].append((key, _fmt_value(args[key])))
    if _still_on(args):
        out["method"] += [(k, _fmt_value(args[k])) for k in STILL_KEYS if k in args]
    for key in GRPO_KEYS:
        if key not in args:
            continue
        if key == "num_train_epochs" and (args.get("max_steps") or 0) > 0:
            continue
        if key == "max_steps" and (args.get("max_steps") or 0) <= 0:
            continue
        out["grpo"].append((key, _fmt_value(args[key])))
    return out


def _still_on(args: Mapping) -> bool:
    return any(float(args.get(k) or 0.0) != 0.0 for k in ("ppl_shaping_alpha", "position_bonus_gamma"))


def package_versions() -> list[tuple[str, str]]:
    out = []
    for pkg in VERSION_PACKAGES:
        try:
            out.append((pkg, metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            if pkg == "exploration-trl":
                from exploration_trl import __version__

                out.append((pkg, __version__))
    out.append(("python", ".".join(map(str, sys.version_info[:3]))))
    return out


# ------------------------------------------------------------------------------------------------ curves
def _history_from_folder(output_dir: Path) -> list[dict] | None:
    """`log_history` of `trainer_state.json` in the folder, else of its newest `checkpoint-*`."""
    candidates = [output_dir / "trainer_state.json"]
    ckpts = sorted(
        (p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    candidates += [c / "trainer_state.json" for c in ckpts]
    for path in candidates:
        if path.is_file():
            try:
                history = json.loads(path.read_text(encoding="utf-8")).get("log_history")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if history:
                return history
    return None


def _series(log_history: Iterable[Mapping], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, entry in enumerate(log_history or []):
        v = entry.get(key) if isinstance(entry, Mapping) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(entry.get("step", i)))
            ys.append(float(v))
    return xs, ys


def plot_training_curves(log_history: Sequence[Mapping] | None, out: str | Path | None = None) -> bytes | None:
    """PNG of the mean reward (± its std across completions when logged) and the token entropy per logged step.

    Returns the PNG bytes (also written to `out` when given), or `None` when `log_history` has neither metric.
    """
    rx, ry = _series(log_history, "reward")
    ex, ey = _series(log_history, "entropy")
    if not ry and not ey:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    try:
        for ax, xs, ys, title, color in ((axes[0], rx, ry, "mean reward", "tab:blue"),
                                         (axes[1], ex, ey, "token entropy (nats)", "tab:orange")):
            if ys:
                ax.plot(xs, ys, marker="o" if len(ys) < 30 else None, markersize=3, linewidth=1.6, color=color)
                if title == "mean reward":
                    sx, sy = _series(log_history, "reward_std")
                    if sy and sx == xs:
                        ax.fill_between(xs, [y - s for y, s in zip(ys, sy)], [y + s for y, s in zip(ys, sy)],
                                        alpha=0.15, color=color, linewidth=0)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    finally:
        plt.close(fig)
    data = buf.getvalue()
    if out is not None:
        _atomic_write(Path(out), data)
    return data


def _training_summary(log_history: Sequence[Mapping] | None) -> str | None:
    parts = []
    for key, label, unit in (("reward", "mean reward", ""), ("entropy", "token entropy", " nats")):
        _, ys = _series(log_history, key)
        if len(ys) >= 2:
            parts.append(f"{label} {ys[0]:.3g} → {ys[-1]:.3g}{unit}")
        elif ys:
            parts.append(f"{label} {ys[0]:.3g}{unit}")
    if not parts:
        return None
    steps = [e.get("step") for e in log_history or [] if isinstance(e, Mapping) and "step" in e]
    last = max((s for s in steps if isinstance(s, (int, float))), default=None)
    where = f" over {int(last)} steps" if last else ""
    return f"From the first to the last logged step{where}: " + "; ".join(parts) + "."


# ------------------------------------------------------------------------------------------------ results
def _pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def normalize_results(data: Mapping[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """Reduce a `results.json` (schema `exploration_trl.eval/results/v1`, or a minimal hand-written one) to what a
    card shows: `benchmark`, `pass_at_k` {int k: float}, `n`, `num_problems`, `avg_at_n`, `maj_at_n`,
    `token_entropy`, `temperature`, `top_p`, `max_tokens`, `model`, `path`.

    Accepts `benchmark` as a dict with `name` or a string, the pass@k table under `summary.pass_at_k` or at top
    level, and falls back to per-problem `problems[].n/c`. Raises `ValueError` when no pass@k can be found."""
    where = str(path) if path is not None else "results"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} is not a results.json (not a JSON object)")
    summary = data.get("summary") if isinstance(data.get("summary"), Mapping) else {}
    settings = data.get("settings") if isinstance(data.get("settings"), Mapping) else {}
    bench = data.get("benchmark")
    if isinstance(bench, Mapping):
        bench_name, bench_source = bench.get("name"), bench.get("source")
        num_problems = bench.get("num_problems")
    else:
        bench_name, bench_source, num_problems = bench, None, None
    bench_name = str(bench_name or settings.get("benchmark") or "unknown")
    table = summary.get("pass_at_k") or data.get("pass_at_k") or {}
    pass_at_k: dict[int, float] = {}
    if isinstance(table, Mapping):
        for k, v in table.items():
            try:
                if v is not None:
                    pass_at_k[int(k)] = float(v)
            except (TypeError, ValueError):
                continue
    problems = data.get("problems") if isinstance(data.get("problems"), list) else []
    counts = [(int(p["n"]), int(p["c"])) for p in problems if isinstance(p, Mapping) and "n" in p and "c" in p]
    if not pass_at_k and counts:
        n_min = min(n for n, _ in counts)
        ks = [1 << i for i in range(n_min.bit_length()) if (1 << i) <= n_min]
        pass_at_k = {k: sum(_pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks}
    if not pass_at_k:
        raise ValueError(f"{where} has no pass@k table (summary.pass_at_k) and no per-problem n/c counts")
    n = summary.get("n", data.get("n", settings.get("n")))
    if isinstance(n, list):
        n = min(n) if n else None
    if num_problems is None:
        num_problems = summary.get("num_problems", data.get("num_problems", len(counts) or None))
    return {
        "benchmark": bench_name,
        "benchmark_source": bench_source,
        "pass_at_k": dict(sorted(pass_at_k.items())),
        "n": n,
        "num_problems": num_problems,
        "avg_at_n": summary.get("avg_at_n", data.get("avg_at_n")),
        "maj_at_n": summary.get("maj_at_n", data.get("maj_at_n")),
        "token_entropy": summary.get("token_entropy", data.get("token_entropy")),
        "temperature": settings.get("temperature", data.get("temperature")),
        "top_p": settings.get("top_p"),
        "max_tokens": settings.get("max_tokens"),
        "model": data.get("model", settings.get("model")),
        "path": str(path) if path is not None else data.get("path"),
    }


def _load_results_file(source: str | Path) -> tuple[dict, Path]:
    p = Path(source)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise ValueError(f"results file not found: {source}")
    try:
        return json.loads(p.read_text(encoding="utf-8")), p
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{source} is not a results.json (not valid JSON)") from None


def _same_folder(a: Any, output_dir: Path) -> bool:
    """False only when `a` names a *different existing* local folder (so auto-found results of another model,
    e.g. the base model's, never end up in this model's index)."""
    if not a:
        return True
    p = Path(str(a)).expanduser()
    if not p.exists():
        return True
    try:
        return p.resolve() == output_dir.resolve()
    except OSError:
        return True


def collect_results(output_dir: str | Path, results: Any = None, base_model: str | None = None) -> list[dict]:
    """Normalised results for a card: `results` (paths, folders or dicts; errors raise), or when `None` every
    `output_dir/eval*/results.json`; unreadable ones, and ones that evaluate another local folder or `base_model`,
    are skipped with a warning. One entry per benchmark: with several, the one with more problems, then larger n,
    then the later one wins."""
    output_dir = Path(output_dir)
    found: list[dict] = []
    if results is None:
        for path in sorted(output_dir.glob("eval*/results.json")):
            try:
                data, p = _load_results_file(path)
                item = normalize_results(data, p)
            except ValueError as e:
                logger.warning("model card: skipping %s (%s)", path, e)
                continue
            if not _same_folder(item.get("model"), output_dir) or (
                base_model is not None and str(item.get("model")) == str(base_model)
            ):
                logger.warning("model card: skipping %s (it evaluates %s, not %s)", path, item["model"], output_dir)
                continue
            found.append(item)
    else:
        if isinstance(results, (str, os.PathLike, Mapping)):
            results = [results]
        for r in results:
            if isinstance(r, Mapping):
                found.append(normalize_results(r, r.get("path")))
            else:
                data, p = _load_results_file(r)
                found.append(normalize_results(data, p))
    best: dict[str, dict] = {}
    for item in found:
        old = best.get(item["benchmark"])
        score = (item.get("num_problems") or 0, item.get("n") or 0)
        if old is None or score >= (old.get("num_problems") or 0, old.get("n") or 0):
            best[item["benchmark"]] = item
    return list(best.values())


def _bench_meta(name: str) -> tuple[str, str | None, str | None, str]:
    hub, config, split, display = BENCHMARK_DATASETS.get(name, (None, None, None, None))
    return hub or name, config, split, display or name


def eval_results_from(results: Sequence[Mapping]) -> list:
    """`huggingface_hub.EvalResult`s: pass@1 and pass@k (largest k) per benchmark, as fractions rounded to 4 places."""
    from huggingface_hub import EvalResult

    out = []
    for r in results:
        dataset_type, config, split, display = _bench_meta(r["benchmark"])
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


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}"


def _result_table(results: Sequence[Mapping]) -> tuple[list[str], list[list[str]]]:
    ks = sorted({k for r in results for k in r["pass_at_k"]})
    header = ["benchmark", "problems", "n", "temperature"] + [f"pass@{k}" for k in ks] + ["avg@n", "maj@n"]
    rows = []
    for r in results:
        _, _, _, display = _bench_meta(r["benchmark"])
        rows.append(
            [display, _fmt_value(r.get("num_problems")), _fmt_value(r.get("n")), _fmt_value(r.get("temperature"))]
            + [_pct(r["pass_at_k"].get(k)) for k in ks]
            + [_pct(r.get("avg_at_n")), _pct(r.get("maj_at_n"))]
        )
    return header, rows


# ------------------------------------------------------------------------------------------------ state
def load_card_state(path: str | Path) -> dict | None:
    """The inputs recorded in a card written by :func:`write_model_card` (`README.md` path or its folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / CARD_FILE
    if not p.is_file():
        return None
    m = _STATE_RE.search(p.read_text(encoding="utf-8"))
    if not m:
        return None
    try:
        state = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return state if isinstance(state, dict) else None


def _dump_state(state: dict) -> str:
    # `<` and `>` only occur inside JSON strings, where \u003c/\u003e decode to the same text: no `-->` can appear.
    text = json.dumps(state, ensure_ascii=False, sort_keys=True, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# ------------------------------------------------------------------------------------------------ rendering
@dataclass
class RenderedCard:
    """A rendered card and the files it refers to, not yet written. `files` maps names relative to
    `output_dir` to bytes (`README.md` and, when curves were drawn, `training_curves.png`)."""

    output_dir: Path
    text: str
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.output_dir / CARD_FILE

    def snapshot(self) -> dict[str, bytes | None]:
        """Current bytes of every file :meth:`write` would replace (`None`: absent), for :func:`restore_files`."""
        return {name: ((self.output_dir / name).read_bytes() if (self.output_dir / name).is_file() else None)
                for name in self.files}

    def write(self) -> Path:
        """Write each file atomically (temporary file in the folder + `os.replace`), the card last."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name in sorted(self.files, key=lambda n: n == CARD_FILE):
            _atomic_write(self.output_dir / name, self.files[name])
        return self.path


def restore_files(output_dir: str | Path, snapshot: Mapping[str, bytes | None]) -> None:
    """Put back the bytes recorded by :meth:`RenderedCard.snapshot` (deleting files that did not exist)."""
    for name, data in snapshot.items():
        p = Path(output_dir) / name
        if data is None:
            if p.exists():
                p.unlink()
        else:
            _atomic_write(p, data)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _template_text(template: str | Path | None) -> str:
    if template is not None:
        return Path(template).read_text(encoding="utf-8")
    packaged = resources.files("exploration_trl.hub").joinpath("templates").joinpath(TEMPLATE_NAME)
    return packaged.read_text(encoding="utf-8")


def _existing_metadata(readme: Path) -> dict:
    if not readme.is_file():
        return {}
    try:
        from huggingface_hub import ModelCard

        return ModelCard.load(readme).data.to_dict()
    except Exception as e:  # noqa: BLE001 - a broken header is replaced, not fatal
        logger.warning("model card: could not read the metadata of %s (%s); rewriting it", readme, e)
        return {}


def _usage(load_id: str, is_adapter: bool, adapter_type: str, countdown: bool) -> str:
    if countdown:
        question = ("Using the numbers [3, 5, 7], write an arithmetic equation whose value is 22. Give the "
                    "final equation between <answer> and </answer>.")
    else:
        question = "What is 12 * 13 + 7? Please reason step by step, and put your final answer within \\\\boxed{}."
    if is_adapter:
        load = (
            "from peft import AutoPeftModelForCausalLM\n"
            "from transformers import AutoTokenizer\n\n"
            f'model_id = "{load_id}"\n'
            'model = AutoPeftModelForCausalLM.from_pretrained(model_id, dtype="auto", device_map="auto")\n'
            "model = model.merge_and_unload()  # optional: fold the adapter into the base weights\n"
            "tokenizer = AutoTokenizer.from_pretrained(model_id)\n"
        )
        intro = (f"This folder holds a {adapter_type} adapter; `peft` loads the base model named in "
                 "`adapter_config.json` and applies it:")
    else:
        load = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model_id = "{load_id}"\n'
            'model = AutoModelForCausalLM.from_pretrained(model_id, dtype="auto", device_map="auto")\n'
            "tokenizer = AutoTokenizer.from_pretrained(model_id)\n"
        )
        intro = "With `transformers`:"
    gen = (
        f'messages = [{{"role": "user", "content": "{question}"}}]\n'
        "inputs = tokenizer.apply_chat_template(\n"
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True\n'
        ").to(model.device)\n"
        "out = model.generate(**inputs, max_new_tokens=512, do_sample=True, temperature=0.6, top_p=0.95)\n"
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
    )
    evaluate = (
        "To measure pass@k yourself (n samples per problem, unbiased estimator):\n\n"
        "```bash\n"
        "pip install exploration-trl\n"
        f"exploration-trl eval --model {load_id} --benchmark {'countdown3' if countdown else 'gsm8k'} --n 16 "
        "--temperature 0.6\n"
        "```"
    )
    return f"{intro}\n\n```python\n{load}\n{gen}```\n\n{evaluate}"


def render_model_card(
    output_dir: str | Path,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    training_args: Any = None,
    log_history: Sequence[Mapping] | None = None,
    is_adapter: bool | None = None,
    results: Any = None,
    repo_id: str | None = None,
    reward_funcs: Sequence[str] | None = None,
    template: str | Path | None = None,
) -> RenderedCard:
    """Render the card for `output_dir` without writing anything (see :func:`write_model_card`)."""
    from huggingface_hub import ModelCard, ModelCardData

    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise ValueError(f"output dir '{output_dir}' not found")
    readme = output_dir / CARD_FILE
    state = load_card_state(readme) or {}
    method = method or state.get("method")
    if method is None:
        raise ValueError(
            f"{readme} is not an exploration-trl model card yet, so the method is unknown; pass method= "
            "(or --method) and base_model= (or --base-model)"
        )
    parts = method_parts(method)
    method = "+".join(parts)
    base_model = base_model if base_model is not None else state.get("base_model")
    dataset = dataset if dataset is not None else state.get("dataset")
    repo_id = repo_id or state.get("repo_id")
    reward_funcs = list(reward_funcs) if reward_funcs is not None else state.get("reward_funcs")
    if is_adapter is None:
        is_adapter = detect_adapter(output_dir)
    is_adapter = bool(is_adapter)
    adapter_type = str(_adapter_config(output_dir).get("peft_type") or "LoRA") if is_adapter else ""
    adapter_type = {"LORA": "LoRA"}.get(adapter_type, adapter_type)

    # hyperparameters & versions: from this call's config, else as recorded when the card was first written
    if training_args is not None:
        hp = extract_hyperparameters(method, training_args)
        still = _still_on(_args_dict(training_args))
        versions = package_versions()
        trainer_name = _trainer_name(method)
    else:
        hp = {k: [tuple(x) for x in v] for k, v in (state.get("hyperparameters") or {"method": [], "grpo": []}).items()}
        still = bool(state.get("still"))
        versions = [tuple(x) for x in state.get("versions") or package_versions()]
        trainer_name = state.get("trainer") or _trainer_name(method)

    # curves: this call's log_history, else trainer_state.json, else a PNG already in the folder
    files: dict[str, bytes] = {}
    history = log_history if log_history is not None else _history_from_folder(output_dir)
    summary = state.get("training_summary")
    curves = None
    if history:
        png = plot_training_curves(history)
        if png is not None:
            files[CURVES_FILE] = png
            curves = CURVES_FILE
        summary = _training_summary(history)
    elif (output_dir / CURVES_FILE).is_file():
        curves = CURVES_FILE

    # results: explicit, else eval*/results.json, plus those recorded earlier for other benchmarks
    found = collect_results(output_dir, results, base_model=base_model)
    known = {r["benchmark"] for r in found}
    for old in state.get("results") or []:
        if old.get("benchmark") not in known and isinstance(old.get("pass_at_k"), Mapping):
            path = str(output_dir / old["path"]) if old.get("path") else None
            found.append({**old, "path": path, "pass_at_k": {int(k): v for k, v in old["pass_at_k"].items()}})
    found.sort(key=lambda r: r["benchmark"])

    model_name = (repo_id.split("/")[-1] if repo_id else None) or output_dir.resolve().name
    hub_base, base_display = _resolve_base_model(base_model, output_dir)
    dataset_ids, dataset_display = _resolve_dataset(dataset)
    load_id = repo_id or str(output_dir)

    # metadata: keep keys we do not manage (license, language, ...) and foreign tags
    existing = _existing_metadata(readme)
    managed = {"base_model", "library_name", "tags", "datasets", "model-index", "model_name", "pipeline_tag",
               "eval_results"}
    method_tags = [*BASE_TAGS, *parts, *TRAILING_TAGS] + (["still"] if still else [])
    if is_adapter:
        method_tags += ["peft", adapter_type.lower()] if adapter_type else ["peft"]
    # foreign tags survive, except method names (the method may have changed) and `base_model:*` tags, which the
    # Hub derives from `base_model` itself (PEFT writes one with the local path of the base model)
    old_tags = [t for t in existing.get("tags") or []
                if isinstance(t, str) and t not in METHOD_PAPERS and t not in ("lora", "peft", "still")
                and not t.startswith("base_model:")]
    tags = list(dict.fromkeys(method_tags + old_tags))
    extra = {k: v for k, v in existing.items() if k not in managed and k != "licence"}  # TRL writes `licence: license`
    card_data = ModelCardData(
        base_model=hub_base,
        library_name="peft" if is_adapter else "transformers",
        pipeline_tag="text-generation",
        tags=tags,
        datasets=dataset_ids or None,
        model_name=model_name if found else None,  # only the model-index needs it
        eval_results=eval_results_from(found) or None,
        **extra,
    )

    methods = []
    for p in parts + (["still"] if still else []):
        name, description, key = METHOD_PAPERS.get(p, (p, "", "shao2024deepseekmath"))
        methods.append({"name": name, "description": description, "cite": PAPERS[key].short, "url": PAPERS[key].url})
    method_display = " + ".join(METHOD_PAPERS[p][0] if p in METHOD_PAPERS else p for p in parts)
    what = f"a {adapter_type} adapter for {base_display}" if is_adapter else f"a fine-tuned version of {base_display}"
    intro = (
        f"This model is {what}, trained with reinforcement learning from verifiable rewards using "
        f"**{method_display}** in [exploration-trl](https://pypi.org/project/exploration-trl/) "
        "(exploration-preserving RLVR methods for [TRL](https://github.com/huggingface/trl))"
        + (f" on {dataset_display}." if dataset_display else ".")
    )

    for r in found:
        r["display"] = _bench_meta(r["benchmark"])[3]
        plot = Path(r["path"]).with_name("pass_at_k.png") if r.get("path") else None
        r["plot"] = None
        if plot is not None and plot.is_file():
            try:
                r["plot"] = plot.resolve().relative_to(output_dir.resolve()).as_posix()
            except ValueError:
                pass
    header, rows = _result_table(found)
    countdown = _is_countdown(dataset)
    eval_bench = "countdown3" if countdown else "gsm8k"

    new_state = _json_safe({
        "version": STATE_VERSION,
        "method": method,
        "base_model": None if base_model is None else str(base_model),
        "dataset": dataset if dataset is None or isinstance(dataset, str) else [str(d) for d in dataset],
        "repo_id": repo_id,
        "reward_funcs": reward_funcs,
        "is_adapter": is_adapter,
        "trainer": trainer_name,
        "still": still,
        "hyperparameters": hp,
        "versions": versions,
        "training_summary": summary,
        "results": [_state_result(r, output_dir) for r in found],
    })
    keep = _KEEP_RE.search(readme.read_text(encoding="utf-8")) if readme.is_file() else None
    card = ModelCard.from_template(
        card_data,
        template_str=_template_text(template),
        model_name=model_name,
        intro=intro,
        method_display=method_display,
        methods=methods,
        trainer_name=trainer_name,
        results=found,
        result_header=header,
        result_rows=rows,
        load_id=load_id,
        eval_hint_bench=eval_bench,
        eval_hint_dir=str(output_dir),
        repo_hint=repo_id or "USER/NAME",
        dataset_display=dataset_display,
        reward_funcs=", ".join(f"`{r}`" for r in reward_funcs) if reward_funcs else None,
        base_display=base_display,
        weights_display=(f"{adapter_type} adapter (`library_name: peft`)" if is_adapter
                         else "full model (`library_name: transformers`)"),
        training_summary=summary,
        curves=curves,
        method_hparams=hp.get("method") or [],
        grpo_hparams=hp.get("grpo") or [],
        usage=_usage(load_id, is_adapter, adapter_type, countdown=countdown),
        versions=versions,
        bibtex=bibtex_for(method, still=still),
        user_notes=keep.group(0) if keep else None,
        state=_dump_state(new_state),
    )
    text = re.sub(r"\n{3,}", "\n\n", str(card)).rstrip("\n") + "\n"
    files[CARD_FILE] = text.encode("utf-8")
    return RenderedCard(output_dir=output_dir, text=text, files=files)


def _state_result(r: Mapping, output_dir: Path) -> dict:
    """A result as recorded in the card: no local paths (only a path inside the folder, relative to it)."""
    out = {k: v for k, v in r.items() if k not in ("plot", "display", "model", "path")}
    if r.get("path"):
        try:
            out["path"] = Path(r["path"]).resolve().relative_to(output_dir.resolve()).as_posix()
        except (ValueError, OSError):
            pass
    return out


def _is_countdown(dataset: Any) -> bool:
    names = [dataset] if isinstance(dataset, str) else list(dataset or [])
    return any("countdown" in str(n).lower() for n in names)


def _trainer_name(method: str) -> str:
    names = {"grpo": "ExplorationGRPOTrainer", "progrpo": "ProGRPOTrainer", "dsgrpo": "DSGRPOTrainer",
             "casp": "CaSPTrainer", "kl_cov": "KLCovTrainer", "clip_cov": "ClipCovTrainer"}
    parts = method_parts(method)
    if len(parts) == 1:
        return names.get(parts[0], f"{parts[0]} trainer")
    return "".join(names.get(p, p).removesuffix("Trainer") for p in parts) + "Trainer"


def write_model_card(
    output_dir: str | Path,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    training_args: Any = None,
    log_history: Sequence[Mapping] | None = None,
    is_adapter: bool | None = None,
    results: Any = None,
    repo_id: str | None = None,
    reward_funcs: Sequence[str] | None = None,
    template: str | Path | None = None,
) -> Path:
    """Write or update `output_dir/README.md` (and `training_curves.png`); returns the card's path.

    Args:
        output_dir: the trained folder (full model, or a PEFT adapter with `adapter_config.json`).
        method: `grpo`, `progrpo`, `dsgrpo`, `casp`, `kl_cov`, `clip_cov` or a composition such as `progrpo+casp`.
            May be left out when the folder already has a card written by this function.
        base_model: Hub id (or local path) of the model training started from.
        dataset: training dataset: Hub id, built-in name (`gsm8k`, `countdown`, ...) or local file.
        training_args: the trainer's config (or a dict): the method's own fields and key GRPO settings are listed.
        log_history: `trainer.state.log_history`; `reward` and `entropy` give `training_curves.png`. When `None`,
            `trainer_state.json` in the folder (or its newest checkpoint) is used if present.
        is_adapter: `None` detects `adapter_config.json`.
        results: `results.json` paths / folders / dicts of `exploration-trl eval`; `None` reads
            `output_dir/eval*/results.json`. They fill the pass@k table and the `model-index`.
        repo_id: `USER/NAME` on the Hub, used for the title and the loading snippet.
        reward_funcs: names of the training rewards, listed in the card.
        template: another Jinja template (default: the packaged `model_card.md.j2`).

    Every file is written atomically: a failure leaves the previous card in place.
    """
    return render_model_card(
        output_dir, method=method, base_model=base_model, dataset=dataset, training_args=training_args,
        log_history=log_history, is_adapter=is_adapter, results=results, repo_id=repo_id,
        reward_funcs=reward_funcs, template=template,
    ).write()
