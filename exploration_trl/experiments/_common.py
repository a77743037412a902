"""Helpers shared by the `tree` and `countdown-tiny` experiments: method specs, YAML overrides, tables, timing.

Nothing here imports torch or TRL at module level, so `exploration-trl --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Experiment-level method names that are not registry names: `grpo` plus TRL's plain entropy bonus.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_entropy": ("grpo", {"entropy_coef": 0.01}),
}

#: Config fields the experiments set themselves (budgets, output, generation); `--config` may not change them.
RESERVED_FIELDS = frozenset({
    "output_dir", "max_steps", "max_completion_length", "generation_kwargs", "use_cpu", "report_to",
    "save_strategy", "num_train_epochs", "disable_tqdm", "logging_dir",
})


def parse_list(value: str | Sequence[str], flag: str, allowed: Iterable[str] | None = None) -> list[str]:
    """`"a,b , c"` -> `["a", "b", "c"]`; with `allowed`, every item must be one of them (ValueError naming `flag`)."""
    items = value if not isinstance(value, str) else value.split(",")
    out = [str(v).strip() for v in items if str(v).strip()]
    if not out:
        raise ValueError(f"{flag} is empty; give a comma-separated list")
    if allowed is not None:
        allowed = list(allowed)
        for item in out:
            if item not in allowed:
                raise ValueError(f"{flag}: unknown value '{item}'; allowed: {', '.join(allowed)}")
    if len(set(out)) != len(out):
        raise ValueError(f"{flag}: duplicate values in '{','.join(out)}'")
    return out


def parse_int_list(value: str, flag: str, minimum: int = 0) -> list[int]:
    out = []
    for item in parse_list(value, flag):
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"{flag}: '{item}' is not an integer; give e.g. 0,1,2") from None
        if n < minimum:
            raise ValueError(f"{flag}: {n} is below the minimum {minimum}")
        out.append(n)
    return out


def check_positive(value: int | float, flag: str, minimum: int | float = 1) -> None:
    if value is None or value < minimum:
        raise ValueError(f"{flag} must be >= {minimum}, got {value}")


def add_output_dir(parser: argparse.ArgumentParser, help: str, default: str | None = None) -> None:
    """`--output-dir DIR` into `args.output`, with the old spelling `--output` kept as a hidden alias."""
    parser.add_argument("--output-dir", dest="output", metavar="OUTPUT_DIR", default=default, help=help)
    parser.add_argument("--output", dest="output", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def method_names() -> list[str]:
    """Single-method names accepted by the experiments (compositions like `progrpo+casp` are accepted too)."""
    from ..trainers import METHODS

    return list(METHODS) + list(ALIASES)


def validate_method(name: str, flag: str = "--methods") -> str:
    """Return `name` if it is an alias or a (possibly composed) registry method, else raise a one-line ValueError."""
    if name in ALIASES:
        return name
    from ..trainers import parse_method

    try:
        parse_method(name)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}; experiment aliases: {', '.join(ALIASES)}") from None
    return name


def resolve_method(name: str, overrides: Mapping[str, Any] | None = None) -> tuple[type, dict[str, Any]]:
    """`(trainer_cls, config_kwargs)` for an experiment method name (alias defaults, then `overrides`)."""
    from ..trainers import get_trainer_class

    base, defaults = ALIASES.get(name, (name, {}))
    kwargs = dict(defaults)
    kwargs.update(overrides or {})
    return get_trainer_class(base), kwargs


def load_overrides(path: str | None, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Read `--config YAML`: a mapping `method -> {config_field: value}`, plus an optional `all` entry applied to
    every method first. Fields are checked against each method's config class."""
    if not path:
        return {}
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config: file '{path}' not found")
    with open(p) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config: '{path}' must hold a mapping of method -> {{field: value}}")
    out: dict[str, dict[str, Any]] = {}
    common = data.get("all") or {}
    if not isinstance(common, dict):
        raise ValueError("--config: 'all' must map config fields to values")
    for key in data:
        if key != "all":
            validate_method(str(key), "--config")
            if not isinstance(data[key] or {}, dict):
                raise ValueError(f"--config: entry '{key}' must map config fields to values")
    for method in methods:
        merged = {**common, **(data.get(method) or {})}
        cls, defaults = resolve_method(method)
        known = {f.name for f in dataclasses.fields(cls.config_class)}
        for field_name in merged:
            if field_name in RESERVED_FIELDS:
                raise ValueError(f"--config: '{field_name}' is set by the experiment (use its flags instead)")
            if field_name not in known:
                import difflib

                hint = difflib.get_close_matches(field_name, sorted(known), n=1)
                extra = f" (did you mean '{hint[0]}'?)" if hint else ""
                raise ValueError(f"--config: unknown field '{field_name}' for method '{method}'{extra}")
        out[method] = merged
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def fmt_pm(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    m, s = mean_std([v * scale for v in values])
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table with aligned columns."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def records_to_json_command(module: str, compute, argv: list[str] | None = None) -> int:
    """`python -m <module> RECORDS_DIR OUT.json`: `compute(RECORDS_DIR)` written to OUT.json (one usage line and exit
    2 on other arguments)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(f"usage: python -m {module} RECORDS_DIR OUT.json", file=sys.stderr)
        return 2
    write_json(argv[1], compute(argv[0]))
    print(f"wrote {argv[1]}")
    return 0


def write_json(path: str | Path, data: Any) -> Path:
    """Write strict JSON (NaN/inf -> null) atomically, with the evaluation harness's writer."""
    from ..eval.harness import clean_json, write_json_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, clean_json(data))
    return path


def environment() -> dict[str, Any]:
    """Versions and CPU facts recorded next to every result (runtimes depend on them)."""
    from importlib import metadata

    out: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    for pkg in ("torch", "transformers", "trl"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:  # pragma: no cover
            out[pkg] = None
    out["cpu"] = _cpu_model()
    try:
        import torch

        out["torch_threads"] = torch.get_num_threads()
        # The kernels torch dispatches to: results on a CPU differ from machine to machine (docs/demo_spread.json).
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:  # pragma: no cover
        pass
    return out


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Timer:
    """`with Timer() as t: ...; t.seconds`."""

    def __enter__(self):
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        return False


def quiet_training_logs() -> Callable[[], None]:
    """Silence transformers/TRL info and the per-step warnings of tiny runs; returns a function restoring them."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from ..trainers.callbacks.divergence import DivergenceWarning

    catcher = warnings.catch_warnings()
    catcher.__enter__()
    warnings.simplefilter("ignore")
    warnings.simplefilter("default", DivergenceWarning)  # a diverging run is said so, even in a quiet run
    trl_logger = logging.getLogger("trl")
    trl_level = trl_logger.level
    trl_logger.setLevel(logging.ERROR)

    def restore():
        catcher.__exit__(None, None, None)
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()
        trl_logger.setLevel(trl_level)

    return restore


def common_config_kwargs(output_dir: str | Path, seed: int, steps: int, **extra) -> dict[str, Any]:
    """GRPO config keywords shared by the CPU experiments (no checkpoints, no reporting, quiet)."""
    kw = dict(
        output_dir=str(output_dir),
        max_steps=int(steps),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=int(seed),
        data_seed=int(seed),
        disable_tqdm=True,
        logging_steps=max(1, int(steps) // 20),
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        warmup_steps=0,
    )
    kw.update(extra)
    return kw


def drop_printer(trainer) -> None:
    """With `disable_tqdm=True` transformers prints every log dict; the experiments print their own summaries."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def set_threads(threads: int | None) -> None:
    """Torch intra-op threads for this process. The toy models are far too small to gain from several threads;
    on a busy 2-core machine 2 threads per process were measured ~9x slower than 1 (spin-waiting)."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def _init_worker(threads: int | None) -> None:
    set_threads(threads)
    quiet_training_logs()


def run_jobs(fn: Callable, jobs: Sequence[tuple], workers: int = 1, threads: int | None = 1,
             on_result: Callable[[Any], None] | None = None) -> list:
    """`[fn(*job) for job in jobs]`, in order; with `workers > 1` in that many spawned processes (one torch thread
    each by default). `fn` must be a module-level function and its arguments and result picklable."""
    results = []
    if workers <= 1 or len(jobs) <= 1:
        set_threads(threads)
        for job in jobs:
            r = fn(*job)
            if on_result is not None:
                on_result(r)
            results.append(r)
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker,
                             initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for fut in futures:
            r = fut.result()
            if on_result is not None:
                on_result(r)
            results.append(r)
    return results


def cpu_seconds() -> float:
    """CPU time of this process (user + system), to tell contention apart from work in the reported runtimes."""
    return time.process_time()


def save_figure(fig, out_png: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure to `out_png` (parent folders created); the caller closes the figure."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    import io

    from ..io_safety import write_atomic

    buf = io.BytesIO()  # rendered in memory, then written atomically: an old figure is never truncated
    fig.savefig(buf, format=out.suffix.lstrip(".") or "png", dpi=dpi)
    write_atomic(out, buf.getvalue())
    return out
