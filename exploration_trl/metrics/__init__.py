"""Exploration metrics: pass@k / avg@n / maj@n, token-level support statistics, unsolvable sets and
solution multiplicity, and diversity among solutions.

Pure functions on numpy arrays / torch tensors / Python lists; nothing here imports TRL.
``sentence-transformers`` (for :func:`semantic_cosine`) is imported lazily.
"""

from exploration_trl.metrics.diversity import (
    EMBEDDING_MODEL_ENV,
    distinct_n,
    diversity_report,
    embedding_model_path,
    load_embedding_model,
    self_bleu,
    semantic_cosine,
)
from exploration_trl.metrics.passk import avg_at_n, default_ks, maj_at_n, parse_ks, pass_at_k, pass_at_k_curve
from exploration_trl.metrics.solutions import (
    default_normalize,
    mean_solution_multiplicity,
    solution_multiplicity,
    unsolvable_overlap,
    unsolvable_problems,
)
from exploration_trl.metrics.support import (
    branching_factor,
    entropy_by_correctness,
    expected_distinct_tokens,
    lambda_n,
    lambda_sample,
    rank_logprobs,
    token_entropy_stats,
)

__all__ = [
    # passk
    "pass_at_k",
    "pass_at_k_curve",
    "default_ks",
    "parse_ks",
    "avg_at_n",
    "maj_at_n",
    # support
    "token_entropy_stats",
    "entropy_by_correctness",
    "branching_factor",
    "rank_logprobs",
    "lambda_n",
    "lambda_sample",
    "expected_distinct_tokens",
    # solutions
    "unsolvable_problems",
    "unsolvable_overlap",
    "solution_multiplicity",
    "mean_solution_multiplicity",
    "default_normalize",
    # diversity
    "distinct_n",
    "self_bleu",
    "semantic_cosine",
    "load_embedding_model",
    "embedding_model_path",
    "EMBEDDING_MODEL_ENV",
    "diversity_report",
]
