"""``summarize``: the summary metrics of an eval's finished problems (pass@k, maj@n, token entropy, diversity).

Kept apart from the harness that samples and grades, because training reads it too: the held-out eval that runs
inside training (`trainers/components/heldout_eval.py`) summarises its rows with the same function, so a number in a
training log and in `results.json` is computed one way.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from exploration_trl.eval import EvalError
from exploration_trl.eval.results import clean_json

__all__ = ["summarize", "mean_of"]

logger = logging.getLogger(__name__)


def mean_of(values) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(sum(vals) / len(vals)) if vals else None


def _weighted_entropy(rows, select=None) -> float | None:
    num = den = 0.0
    for r in rows:
        for j, (e, t) in enumerate(zip(r.get("entropies") or [], r.get("num_tokens") or [])):
            if e is None or not t or (select is not None and bool(r["correct"][j]) != select):
                continue
            num += e * t
            den += t
    return num / den if den else None


def summarize(
    rows: list[dict],
    ks: list[int] | None = None,
    answer_type: str = "math",
    diversity: bool = True,
    semantic: bool = True,
) -> dict[str, Any]:
    """Summary metrics of finished problems (``samples.jsonl`` rows).

    Returns ``dict(num_problems, n, pass_at_k{k: mean unbiased pass@k}, avg_at_n, maj_at_n, token_entropy
    (token-weighted mean entropy, nats), token_entropy_correct / _wrong, mean_completion_tokens,
    truncated_fraction, solution_multiplicity{mean, mean_solved}, diversity_correct{distinct_1, distinct_2,
    self_bleu, semantic_cosine, num_problems})``. Diversity is averaged over problems with >= 2 correct
    completions; maj@n and solution multiplicity are ``None`` for code benchmarks.
    """
    from exploration_trl.metrics import (
        avg_at_n,
        diversity_report,
        maj_at_n,
        mean_solution_multiplicity,
        parse_ks,
        pass_at_k_curve,
    )
    from exploration_trl.metrics.solutions import math_answers_equivalent

    if not rows:
        raise EvalError("no finished problems to summarise")
    ns = [len(r["correct"]) for r in rows]
    cs = [int(sum(bool(x) for x in r["correct"])) for r in rows]
    n_min = min(ns)
    ks = parse_ks(ks, n_min, error=EvalError)  # None: 1, 2, 4, ..., n
    correct = [[bool(x) for x in r["correct"]] for r in rows]
    summary: dict[str, Any] = {
        "num_problems": len(rows),
        "n": n_min if len(set(ns)) == 1 else ns,
        "pass_at_k": {str(k): v for k, v in pass_at_k_curve(ns, cs, ks).items()},
        "avg_at_n": avg_at_n(correct),
    }
    has_answers = answer_type != "code" and any(a is not None for r in rows for a in r.get("answers") or [])
    answers = [list(r.get("answers") or [None] * len(r["correct"])) for r in rows]
    # Math answers count once per value up to math-verify equivalence ("1/2", "\\frac{1}{2}", "0.5"), as the reward
    # grades them: for the majority vote, and for the distinct solutions of DS-GRPO Eq. 2. Countdown equations are
    # distinct as strings.
    same = math_answers_equivalent if answer_type == "math" else None
    summary["maj_at_n"] = maj_at_n(answers, correct, equivalent=same) if answer_type != "code" else None
    summary["token_entropy"] = _weighted_entropy(rows)
    summary["token_entropy_correct"] = _weighted_entropy(rows, True)
    summary["token_entropy_wrong"] = _weighted_entropy(rows, False)
    tokens = [t for r in rows for t in (r.get("num_tokens") or [])]
    summary["mean_completion_tokens"] = mean_of(tokens)
    reasons = [f for r in rows for f in (r.get("finish_reasons") or [])]
    summary["truncated_fraction"] = (sum(f == "length" for f in reasons) / len(reasons)) if reasons else None
    summary["solution_multiplicity"] = (
        {
            "mean": mean_solution_multiplicity(answers, correct, equivalent=same),
            "mean_solved": mean_solution_multiplicity(answers, correct, solved_only=True, equivalent=same),
        }
        if has_answers
        else None
    )
    if diversity:
        summary["diversity_correct"] = _diversity(rows, semantic, diversity_report)
    return clean_json(summary)


def _diversity(rows, semantic: bool, diversity_report) -> dict[str, Any]:
    keys = ["distinct_1", "distinct_2", "self_bleu"] + (["semantic_cosine"] if semantic else [])
    per_problem: list[dict] = []
    model = None
    if semantic and any(sum(map(bool, r["correct"])) >= 2 for r in rows):
        try:
            from exploration_trl.metrics import load_embedding_model

            model = load_embedding_model()
        except (ImportError, OSError) as e:
            logger.warning("semantic diversity skipped: %s", e)
            semantic = False
            keys.remove("semantic_cosine")
    for r in rows:
        if sum(map(bool, r["correct"])) < 2:
            continue
        rep = diversity_report(r["completions"], semantic=semantic, correct=r["correct"], model=model)
        per_problem.append(rep)
    out: dict[str, Any] = {k: mean_of(p.get(k) for p in per_problem) for k in keys}
    out["num_problems"] = len(per_problem)
    return out
