"""Evaluation harness: sample n completions per problem, grade them, report pass@k and exploration metrics.

* :mod:`~exploration_trl.eval.benchmarks` - the built-in benchmarks (GSM8K, MATH-500, AIME24/25, AMC23,
  Countdown-3, HumanEval) and local ``.jsonl``/``.json``/``.parquet`` files, as chat prompts plus the
  gold columns of the reward that grades them.
* :mod:`~exploration_trl.eval.generation` - ``generate()`` with a vLLM backend (when importable) or a
  batched ``transformers`` backend that also measures per-completion token entropy.
* :mod:`~exploration_trl.eval.harness` - ``run_eval()``: resumable generation + grading, writes
  ``results.json``, ``samples.jsonl`` and ``pass_at_k.png``.
* :mod:`~exploration_trl.eval.results` - ``load_results()`` and the atomic strict-JSON writer, for every module
  that reads or writes those files.
* :mod:`~exploration_trl.eval.plots` / :mod:`~exploration_trl.eval.compare` - overlaid pass@k curves and a
  side-by-side table of several result files.
* :mod:`~exploration_trl.eval.command` - the ``exploration-trl eval`` / ``compare`` subcommands.
* :mod:`~exploration_trl.eval.model_source` - ``check_model_source()``: a model path or Hub id that can be loaded,
  checked before any model loads (``eval``, ``train`` and the model cards use it).

Heavy imports (torch, transformers, matplotlib) happen lazily, so ``import exploration_trl.eval`` is cheap.
"""

from __future__ import annotations


class EvalError(ValueError):
    """Bad user input for the evaluation harness; the message is one line and says what to do."""


_LAZY = {
    "Benchmark": "exploration_trl.eval.benchmarks",
    "load_benchmark": "exploration_trl.eval.benchmarks",
    "BUILTIN_BENCHMARKS": "exploration_trl.eval.benchmarks",
    "PROMPT_FORMATS": "exploration_trl.eval.benchmarks",
    "describe": "exploration_trl.eval.benchmarks",
    "generate": "exploration_trl.eval.generation",
    "Samples": "exploration_trl.eval.generation",
    "run_eval": "exploration_trl.eval.harness",
    "load_results": "exploration_trl.eval.results",
    "plot_pass_at_k": "exploration_trl.eval.plots",
    "compare_results": "exploration_trl.eval.compare",
}

__all__ = ["EvalError", *sorted(_LAZY)]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'exploration_trl.eval' has no attribute {name!r}")
