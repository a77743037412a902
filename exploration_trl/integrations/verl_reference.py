"""What the verl plugin (`exploration_trl.integrations.verl`) registers and what it cannot, and docs/verl.md's generated
tables. Imports neither verl nor torch: the plugin reads its names from here (also when it fails to import, to say so
under every name), and the main test suite checks the docs against it without verl.

Generated blocks of docs/verl.md, between marker comments:

* `verl-unavailable`: the methods verl's extension points cannot carry, from `UNAVAILABLE`;
* `verl-benchmark`: the estimators' time per batch against verl's `grpo`, from benchmarks/verl_estimators.json
  (written by `benchmarks/verl_estimators.py`);
* `verl-parity`: the largest differences measured between verl's built-ins and the package's core, from
  benchmarks/verl_parity.json (written by `tests/test_verl_integration.py` with `ETRL_VERL_PARITY_JSON` set).

Regenerate from the repository root with `python -m exploration_trl.integrations.verl_reference` (`--check` only
compares and exits 1 when docs/verl.md is out of date).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["REGISTERED", "UNAVAILABLE", "REDIRECTS", "Unavailable", "unavailable_message", "render", "main"]

#: The estimators the plugin registers with verl, in docs/verl.md's order.
REGISTERED = ("etrl_passk", "etrl_pkpo", "etrl_maxrl", "etrl_wreinforce", "etrl_qae", "etrl_position_bonus")


class Unavailable(NamedTuple):
    method: str  #: the package's name of it (the `method:` value, or the shaping's keys)
    display: str
    needs: str  #: what it needs that verl does not pass
    why: str  #: what verl passes instead, at the extension point it would use

_ESTIMATOR_GETS = ("an advantage estimator gets the token-level rewards, the response mask, the uids and the algorithm "
                   "config")
_LOSS_GETS = ("a policy loss gets the old and current log-probs of the sampled tokens, the advantages, the mask, the "
              "aggregation mode and the actor config")

#: `etrl_<method>` names that cannot be registered, each with its one-line reason. The plugin registers each as an
#: estimator that raises this reason, so that `algorithm.adv_estimator=etrl_progrpo` says why instead of verl's
#: "Unknown advantage estimator".
UNAVAILABLE: dict[str, Unavailable] = {
    "etrl_progrpo": Unavailable(
        "progrpo", "ProGRPO (ARM)", "each completion's and each prompt's token log-probs (its confidence terms)",
        f"{_ESTIMATOR_GETS}, no log-probs"),
    "etrl_dsgrpo": Unavailable(
        "dsgrpo", "DS-GRPO", "each completion's log-probs under the rollout policy (its likelihood)",
        f"{_ESTIMATOR_GETS}, no log-probs"),
    "etrl_unlikely": Unavailable(
        "unlikely", "Unlikeliness reward", "each completion's log-probs, to rank a group by likelihood",
        f"{_ESTIMATOR_GETS}, no log-probs"),
    "etrl_ppl_shaping": Unavailable(
        "ppl_shaping_alpha", "STILL's perplexity shaping", "each completion's token log-probs (its perplexity)",
        f"{_ESTIMATOR_GETS}, no log-probs"),
    "etrl_entropy_adv": Unavailable(
        "entropy_adv", "Entropy-based advantage", "the current policy's per-token entropies, inside the loss",
        f"{_LOSS_GETS}: no entropies, no logits"),
    "etrl_casp": Unavailable(
        "casp", "CaSP", "the old policy's top-N candidate tokens and the current policy's logits at them",
        f"{_LOSS_GETS}: no logits, no candidates"),
    "etrl_cov_global": Unavailable(
        "cov_selection: global", "KL-Cov / Clip-Cov with global selection",
        "the covariances of every token of the whole batch, across micro-batches and workers, before any is chosen",
        "a policy loss sees one micro-batch on one worker; verl's kl_cov and clip_cov choose within it (the "
        "package's cov_selection: local)"),
    "etrl_outcome_explore": Unavailable(
        "outcome_explore", "Outcome-based exploration",
        "each completion's final answer, and per-prompt answer counts kept across steps and checkpoints",
        f"{_ESTIMATOR_GETS}: no answers, and no state that verl saves with a checkpoint"),
}

#: `etrl_<method>` names of methods verl has already: registered as estimators that say which of verl's to use.
REDIRECTS: dict[str, str] = {
    "etrl_grpo": "verl's own grpo is the same advantage (docs/verl.md compares them): algorithm.adv_estimator=grpo "
                 "(Dr. GRPO: algorithm.norm_adv_by_std_in_grpo=false)",
    "etrl_kl_cov": "KL-Cov is verl's kl_cov policy loss, not an estimator: "
                   "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
    "etrl_clip_cov": "Clip-Cov is verl's clip_cov policy loss, not an estimator: "
                     "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
    "etrl_still": "STILL's position bonus is etrl_position_bonus; its perplexity shaping cannot run in verl (see "
                  "etrl_ppl_shaping)",
}


def unavailable_message(name: str) -> str:
    """The one-line error for a name in `UNAVAILABLE` or `REDIRECTS`."""
    if name in REDIRECTS:
        return f"{name} is not an estimator of exploration-trl's verl plugin: {REDIRECTS[name]}"
    u = UNAVAILABLE[name]
    return (f"{name}: {u.display} cannot run in verl: it needs {u.needs}, and {u.why} (docs/verl.md, \"What cannot go "
            "in\"). The etrl_* estimators that run: " + ", ".join(REGISTERED))


# ---------------------------------------------------------------------------------------------------------------------
# docs/verl.md's generated blocks

DOC = "docs/verl.md"
BENCHMARK_JSON = "benchmarks/verl_estimators.json"
PARITY_JSON = "benchmarks/verl_parity.json"
COMMAND = "python -m exploration_trl.integrations.verl_reference"


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def unavailable_table() -> str:
    rows = ["| name | method | what it needs | what verl passes instead |", "|---|---|---|---|"]
    for name, u in UNAVAILABLE.items():
        rows.append(f"| `{name}` | {_cell(u.display)} (`{u.method}`) | {_cell(u.needs)} | {_cell(u.why)} |")
    return "\n".join(rows) + "\n"


def _seconds(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def benchmark_table(data: dict) -> str:
    """The benchmark's table and the line saying where it was measured, from its JSON."""
    m = data["machine"]
    b = data["batch"]
    lines = [
        f"{b['prompts']} prompts × {b['rows_per_prompt']} rows ({b['prompts'] * b['rows_per_prompt']} rows, "
        f"{b['response_length']} response tokens each), rows shuffled, called through verl's `compute_advantage` on a "
        f"`DataProto` as the trainer calls it; {data['repeats']} paired repeats (each repeat times every estimator "
        f"once, in turn, so that the load falls on all alike), after {data['warmup']} warm-up calls each. Wall-clock "
        "time, and the process's CPU time (all threads), which counts the work whatever share of the cores it got. "
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, verl {m['verl']}, {data['date']}. {_cell(data['load'])}",
        "",
        "| estimator | options | min | median | median / `grpo`'s | min / `grpo`'s | median CPU time "
        "| CPU / `grpo`'s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        lines.append(f"| `{r['name']}` | {_cell(r['options']) or '—'} | {_seconds(r['min_s'])} | "
                     f"{_seconds(r['median_s'])} | {r['median_ratio']:.2f} | {r['min_ratio']:.2f} | "
                     f"{_seconds(r['cpu_median_s'])} | {r['cpu_median_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def parity_table(data: dict) -> str:
    lines = [f"Measured {data['date']} with verl {data['verl']}, torch {data['torch']}, float32, on {data['cpu']}: "
             "the largest absolute difference each test found on its batches (seeded; `pytest -s` prints them). A "
             "measurement on those batches, not a bound: other batches may differ more.", "",
             "| verl | package | compared, on which batches | largest difference measured |", "|---|---|---|---|"]
    for r in data["results"]:
        lines.append(f"| {_cell(r['verl'])} | {_cell(r['package'])} | {_cell(r['batches'])} | {r['max_diff']:.2g} |")
    return "\n".join(lines) + "\n"


def _fill(text: str, block: str, body: str) -> str:
    start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{DOC}: needs exactly one {start} and one {end} line around the generated text")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}{end}{tail}"


def render(root: Path) -> str:
    """docs/verl.md with its generated blocks filled from the tables above and the two JSON files."""
    text = (root / DOC).read_text(encoding="utf-8")
    text = _fill(text, "verl-unavailable", unavailable_table())
    text = _fill(text, "verl-benchmark", benchmark_table(json.loads((root / BENCHMARK_JSON).read_text("utf-8"))))
    return _fill(text, "verl-parity", parity_table(json.loads((root / PARITY_JSON).read_text("utf-8"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=f"Write {DOC}'s generated tables.")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    parser.add_argument("--check", action="store_true", help=f"only compare; exit 1 when {DOC} is out of date")
    args = parser.parse_args(argv)
    path = args.root / DOC
    text = render(args.root)
    if path.read_text(encoding="utf-8") == text:
        return 0
    if args.check:
        print(f"{DOC} out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
