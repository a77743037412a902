"""``run_eval``: sample, grade, and report pass@k plus exploration metrics - resumably.

Files written to ``output_dir``:

* ``samples.jsonl`` - one line per finished problem (appended and flushed as soon as the problem is graded):
  index, id, the sampling settings, completions, reward scores, correctness, extracted answers, per-completion
  mean token entropy, token counts and finish reasons. A rerun with the same sampling settings skips the
  problems already there; with different settings it refuses (use a new output dir or ``overwrite=True``).
  ``limit``, ``ks``, ``batch_size`` and the diversity options are not sampling settings: a rerun may change
  them (e.g. raise ``limit`` to extend a run).
* ``results.json`` - summary + per-problem counts (schema ``exploration_trl.eval/results/v1``; see
  :func:`summarize`), written atomically (temporary file in the same folder + ``os.replace``).
* ``pass_at_k.png`` - the pass@k curve.

The folder's names and what a rerun resumes from: :mod:`exploration_trl.eval.run_folder`.

Correctness: one definition with training, :func:`exploration_trl.rewards.is_correct`: a completion is correct when
its reward is above ``correct_reward_threshold`` (0: the benchmarks' verifiers give 1 to a right answer and 0
otherwise, with no partial credit); a ``None`` reward counts as wrong.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from exploration_trl.eval import EvalError
from exploration_trl.eval.benchmarks import Benchmark, load_benchmark
from exploration_trl.eval.generation import DEFAULT_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS, derive_seed
from exploration_trl.eval.results import (
    RESULTS_FILE,
    clean_json,
    json_default,
    load_results,
    package_versions,
    write_json_atomic,
)
from exploration_trl.eval.run_folder import (
    PLOT_FILE,
    SAMPLES_FILE,
    SAMPLING_KEYS,
    _delete_outputs,
    _finished_problems,
    _model_as_given,
    _model_id,
    _portable,
    default_output_dir,
)
from exploration_trl.eval.summary import mean_of, summarize
from exploration_trl.rewards import DEFAULT_CORRECT_THRESHOLD, is_correct

__all__ = [
    "RESULTS_SCHEMA",
    "SAMPLING_KEYS",
    "run_eval",
    "grade_problem",
    "summarize",
    "load_results",
    "extract_answer",
    "default_output_dir",
    "write_json_atomic",
    "package_versions",
]

logger = logging.getLogger(__name__)

RESULTS_SCHEMA = "exploration_trl.eval/results/v1"
#: Correct means reward > this (the default of training's `correct_reward_threshold`; see `is_correct`).
CORRECT_REWARD_THRESHOLD = DEFAULT_CORRECT_THRESHOLD


# --------------------------------------------------------------------------------------------- answers
def extract_answer(text: str, answer_type: str) -> str | None:
    """The final answer of a completion as the benchmark's reward reads it, for maj@n and solution multiplicity: one
    extraction, so what is counted is what was graded.

    ``math``: :func:`exploration_trl.rewards.math.stated_answer`, the text ``math_accuracy`` hands math-verify (the
    last ``\\boxed{}``'s content, else the rest of the line after the last "answer is"), as written: forms of one
    value (``\\frac{1}{2}``, ``0.5``, ``1/2``) are counted as one answer by math-verify in :func:`summarize`.
    ``countdown``: the equation the countdown reward reads (last ``<answer>...</answer>``) without whitespace or a
    trailing ``= target``; ``code``: ``None``.
    """
    if not isinstance(text, str):
        return None
    if answer_type == "math":
        from exploration_trl.rewards.math import stated_answer

        return stated_answer(text)
    if answer_type == "countdown":
        from exploration_trl.rewards.countdown import extract_equation

        eq = extract_equation(text)
        if eq is None:
            return None
        eq = re.sub(r"\s+", "", eq).split("=")[0]
        return eq if re.fullmatch(r"[\d+\-*/().]+", eq) and re.search(r"\d", eq) else None
    return None


# --------------------------------------------------------------------------------------------- main
def run_eval(
    model: Any,
    benchmark: str | Path | Benchmark,
    n: int = 16,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ks: list[int] | str | None = None,
    output_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
    diversity: bool = True,
    semantic: bool = True,
    backend: str = "auto",
    progress: bool = True,
    overwrite: bool = False,
    reward: str | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    tokenizer: Any = None,
    plot: bool = True,
    vllm_memory_utilization: float | None = None,
) -> dict:
    """Evaluate ``model`` on ``benchmark``: ``n`` samples per problem, graded by the benchmark's reward.

    Args:
        model: Hub id, checkpoint dir, LoRA adapter dir, loaded model or ``(model, tokenizer)``.
        benchmark: built-in name, local file, or a :class:`Benchmark`.
        n, temperature, top_p, max_tokens, seed, backend: sampling settings (see :func:`generate`).
        ks: k values of the pass@k table (default 1, 2, 4, ..., n); each must be ``<= n``.
        output_dir: where the files go (default :func:`default_output_dir`).
        limit: evaluate the first ``limit`` problems only.
        batch_size: sequences per ``model.generate`` call (transformers backend).
        diversity / semantic: diversity among correct solutions; ``semantic`` adds the embedding cosine.
        overwrite: delete this harness's files in ``output_dir`` first instead of resuming.
        reward / question_column / answer_column: see :func:`load_benchmark`.
        vllm_memory_utilization: vLLM's ``gpu_memory_utilization`` (on a CPU: the share of the host's RAM it
            reserves); default: vLLM's on a GPU, chosen from the free RAM on a CPU (see ``load_generator``).

    Returns:
        The ``results.json`` content.
    """
    from exploration_trl.eval.generation import resolve_backend
    from exploration_trl.metrics.passk import parse_ks

    n, max_tokens, batch_size, seed = _checked_settings(n, temperature, top_p, max_tokens, batch_size, seed)
    ks = parse_ks(ks, n, error=EvalError) if ks is not None else None
    bench = _resolve_benchmark(benchmark, limit, question_column, answer_column, reward)
    reward_fn = _reward_function(bench)
    sampling = _sampling_settings(model, bench, n, temperature, top_p, max_tokens, seed, backend)
    out = Path(output_dir) if output_dir is not None else default_output_dir(model, bench.name, n, temperature)
    out.mkdir(parents=True, exist_ok=True)
    model_name = Path(sampling["model"]).name or str(sampling["model"])
    sampling = _portable(sampling, out)  # no absolute local path in results.json / samples.jsonl (they get pushed)
    if overwrite:
        _delete_outputs(out)
    done = _finished_problems(out, bench, sampling)
    todo = [i for i in range(len(bench.records)) if i not in done]

    resolved_backend = resolve_backend(backend, model if not isinstance(model, tuple) else model[0])
    start = time.time()
    gen_seconds = 0.0
    if todo:
        resolved_backend, gen_seconds = _sample_and_grade(
            model, bench, todo, done, out / SAMPLES_FILE, sampling, reward_fn, backend=resolved_backend,
            tokenizer=tokenizer, vllm_memory_utilization=vllm_memory_utilization, n=n, temperature=temperature,
            top_p=top_p, max_tokens=max_tokens, batch_size=batch_size, seed=seed, progress=progress,
        )

    ordered = [done[i] for i in range(len(bench.records))]
    reward_failures = _pop_reward_failures()
    summary = summarize(ordered, ks=ks, answer_type=bench.answer_type, diversity=diversity, semantic=semantic)
    results = {
        "schema": RESULTS_SCHEMA,
        "model": _model_as_given(model, sampling["model"]),
        "benchmark": _benchmark_record(bench),
        "settings": {
            **sampling,
            "resolved_backend": resolved_backend,
            "limit": limit,
            "ks": [int(k) for k in summary["pass_at_k"]],
            "batch_size": batch_size,
            "diversity": diversity,
            "semantic": semantic,
            "correct_reward_threshold": CORRECT_REWARD_THRESHOLD,
        },
        "versions": package_versions(),
        "summary": summary,
        "problems": [_problem_record(r) for r in ordered],
        "timing": _timing(gen_seconds, start, ordered),
        "reward_failures_this_run": reward_failures,
        "files": {"samples": SAMPLES_FILE, "plot": PLOT_FILE if plot else None},
    }
    _write_results(out, results, plot, label=f"{model_name} ({bench.name})")
    results["path"] = str(out / RESULTS_FILE)
    return results


# ---- run_eval's steps, in the order it takes them
def _checked_settings(n, temperature, top_p, max_tokens, batch_size, seed) -> tuple[int, int, int, int]:
    """`(n, max_tokens, batch_size, seed)` as ints, after refusing settings that cannot sample: before any model or
    benchmark is loaded, so that a typo fails in a second."""
    if int(n) < 1:
        raise EvalError(f"n must be >= 1, got {n}")
    if not (temperature >= 0):
        raise EvalError(f"temperature must be >= 0, got {temperature}")
    if not (0 < top_p <= 1):
        raise EvalError(f"top_p must be in (0, 1], got {top_p}")
    if int(max_tokens) < 1 or int(batch_size) < 1:
        raise EvalError("max_tokens and batch_size must be positive")
    return int(n), int(max_tokens), int(batch_size), int(seed)


def _resolve_benchmark(benchmark, limit, question_column, answer_column, reward) -> Benchmark:
    """The problems to evaluate (the first `limit`), from a name, a file or a `Benchmark`; an empty one is refused
    here rather than summarised as nothing."""
    if isinstance(benchmark, Benchmark):
        bench = benchmark
        if limit is not None:
            bench = Benchmark(**{**bench.__dict__, "records": bench.records[: int(limit)]})
    else:
        bench = load_benchmark(benchmark, limit=limit, question_column=question_column,
                               answer_column=answer_column, reward=reward)
    if not bench.records:
        raise EvalError(f"benchmark {bench.name!r} has no problems")
    return bench


def _reward_function(bench: Benchmark):
    """The benchmark's reward, looked up before sampling so that an unknown name costs no generation."""
    from exploration_trl.rewards import get_reward

    try:
        return get_reward(bench.reward, **bench.reward_kwargs)
    except (KeyError, ValueError) as e:
        raise EvalError(f"unknown reward {bench.reward!r}: {e}") from None


def _sampling_settings(model, bench: Benchmark, n, temperature, top_p, max_tokens, seed, backend) -> dict:
    """The `SAMPLING_KEYS` that decide the samples, which a resumed run must match. A packaged benchmark is named
    by its name, not by the path of the installed file (which changes between installs)."""
    from exploration_trl.eval.benchmarks import BUILTIN_BENCHMARKS

    builtin = bench.name in BUILTIN_BENCHMARKS and bench.source.startswith(str(Path(__file__).resolve().parent.parent))
    return {
        "model": _model_id(model),
        "benchmark": bench.name if builtin else (bench.source or bench.name),
        "reward": bench.reward,
        "n": n,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "max_tokens": max_tokens,
        "seed": seed,
        "backend": backend,
    }


def _chunks(todo: list[int], backend: str, batch_size: int, n: int) -> list[list[int]]:
    """The problems of `todo` grouped into generation calls. Fixed chunk boundaries (independent of what is already
    done) keep transformers batches - and so the samples - identical between an interrupted-and-resumed run and an
    uninterrupted one."""
    per_chunk = max(1, batch_size // n) if backend == "transformers" else max(1, 4096 // n)
    chunks: dict[int, list[int]] = {}
    for i in todo:
        chunks.setdefault(i // per_chunk, []).append(i)
    return list(chunks.values())


def _sample_and_grade(
    model, bench: Benchmark, todo: list[int], done: dict[int, dict], samples_path: Path, sampling: dict, reward_fn, *,
    backend: str, tokenizer, vllm_memory_utilization, n: int, temperature, top_p, max_tokens: int, batch_size: int,
    seed: int, progress: bool,
) -> tuple[str, float]:
    """Generate and grade the problems of `todo`, adding each to `done` and appending it to `samples.jsonl` as soon
    as it is graded, so that an interrupted run loses at most one chunk. Returns `(the backend that ran, generation
    seconds)`."""
    from tqdm.auto import tqdm

    from exploration_trl.eval.generation import load_generator

    logger.info("%d of %d problems to generate (%d already in %s)", len(todo), len(bench.records),
                len(bench.records) - len(todo), samples_path)
    generator = load_generator(model, backend=backend, tokenizer=tokenizer, seed=seed,
                               vllm_memory_utilization=vllm_memory_utilization)
    gen_seconds = 0.0
    bar = tqdm(total=len(bench.records), initial=len(bench.records) - len(todo), desc=f"eval {bench.name}",
               unit="problem", disable=not progress)
    # The sampling bar nests under this one only in a terminal: elsewhere its cursor moves (`ESC[A`) litter the
    # log, and the problem bar alone shows the progress.
    inner_progress = progress and sys.stderr.isatty()
    try:
        with open(samples_path, "a", encoding="utf-8") as fh:
            for idx in _chunks(todo, generator.backend, batch_size, n):
                recs = [bench.records[i] for i in idx]
                t0 = time.time()
                samples = generator.generate(
                    [r["prompt"] for r in recs], n, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_tokens, batch_size=batch_size,
                    seeds=[derive_seed(seed, i, str(r["id"])) for i, r in zip(idx, recs)],
                    progress=inner_progress,
                )
                elapsed = (time.time() - t0) / len(idx)
                for i, rec, s in zip(idx, recs, samples):
                    row = grade_problem(i, rec, s, bench, reward_fn, sampling, elapsed)
                    _append_row(fh, row)
                    done[i] = row
                    gen_seconds += elapsed
                    bar.update(1)
    finally:
        bar.close()
        generator.close()
    return generator.backend, gen_seconds


def _append_row(fh, row: dict) -> None:
    """One finished problem, on disk (flushed and synced) before the next is generated: what resuming relies on."""
    fh.write(json.dumps(clean_json(row), ensure_ascii=False, default=json_default) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def _pop_reward_failures() -> dict | None:
    """Completions the reward could not score (verifier crash or timeout) in this run, as the rewards module counted
    them; None when it cannot say."""
    try:
        from exploration_trl.rewards import pop_failure_counts

        return pop_failure_counts()
    except ImportError:
        return None


def _benchmark_record(bench: Benchmark) -> dict:
    """results.json's `benchmark`: what was evaluated, enough to tell two runs' problems apart."""
    return {
        "name": bench.name,
        "source": bench.source,
        "reward": bench.reward,
        "num_problems": len(bench.records),
        "prompt_format": bench.prompt_format,
        "answer_type": bench.answer_type,
    }


def _problem_record(row: dict) -> dict:
    """results.json's entry for one problem: its counts (`n`, `c`, what pass@k is computed from) and answers, without
    the completions (those stay in samples.jsonl)."""
    return clean_json({
        "index": row["index"],
        "id": row["id"],
        "n": len(row["correct"]),
        "c": int(sum(bool(x) for x in row["correct"])),
        "gold": row.get("gold"),
        "answers": row.get("answers"),
        "mean_entropy": mean_of(row.get("entropies") or []),
        "mean_tokens": mean_of(row.get("num_tokens") or []),
    })


def _timing(gen_seconds: float, start: float, ordered: list[dict]) -> dict:
    """Seconds spent by this call (generation, and everything since the backend was chosen) and by all the runs that
    produced these samples."""
    return {
        "generation_seconds_this_run": round(gen_seconds, 3),
        "wall_seconds_this_run": round(time.time() - start, 3),
        "generation_seconds_total": round(sum(r.get("seconds") or 0.0 for r in ordered), 3),
    }


def _write_results(out: Path, results: dict, plot: bool, label: str) -> None:
    """results.json (atomically: a crash leaves the previous one) and, with `plot`, the pass@k curve."""
    write_json_atomic(out / RESULTS_FILE, results)
    if plot:
        from exploration_trl.eval.plots import plot_pass_at_k

        plot_pass_at_k([results], out / PLOT_FILE, labels=[label])


def grade_problem(index: int, rec: dict, samples, bench: Benchmark, reward_fn, sampling: dict, seconds: float) -> dict:
    """Score one problem's completions with the reward, TRL-style, and build its ``samples.jsonl`` row."""
    k = len(samples.completions)
    prompt = rec["prompt"]
    chat = isinstance(prompt, list)
    completions = [[{"role": "assistant", "content": c}] for c in samples.completions] if chat else list(samples.completions)
    columns = {col: [rec[col]] * k for col in bench.gold_columns}
    scores = reward_fn(completions=completions, prompts=[prompt] * k, **columns)
    scores = [None if s is None else float(s) for s in scores]
    if len(scores) != k:
        raise EvalError(f"reward {bench.reward!r} returned {len(scores)} scores for {k} completions")
    correct = [bool(is_correct(s, CORRECT_REWARD_THRESHOLD)) for s in scores]
    gold = rec.get("answer", rec.get("target"))
    return {
        "index": index,
        "id": str(rec["id"]),
        "settings": sampling,
        "gold": gold,
        "completions": list(samples.completions),
        "scores": scores,
        "correct": correct,
        "answers": [extract_answer(c, bench.answer_type) for c in samples.completions],
        "entropies": list(samples.entropies),
        "num_tokens": list(samples.num_tokens),
        "finish_reasons": list(samples.finish_reasons),
        "seconds": round(seconds, 4),
    }
