"""Exploration metrics: pass@k / avg@n / maj@n, token-level support statistics, unsolvable sets and
solution multiplicity, and diversity among solutions.

Pure functions on numpy arrays / torch tensors / Python lists; nothing here imports TRL.
``sentence-transformers`` (for :func:`semantic_cosine`) is imported lazily.
"""

from exploration_trl.metrics import diversity, passk, solutions, support
from exploration_trl.metrics.diversity import (
    EMBEDDING_MODEL_ENV,
    distinct_n,
    diversity_report,
    embedding_model_path,
    load_embedding_model,
    self_bleu,
    semantic_cosine,
)
from exploration_trl.metrics.passk import avg_at_n, default_ks, maj_at_n, pass_at_k, pass_at_k_curve
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

# Each submodule's `__all__` lists what it exports; the package exports all of them.
__all__ = [*passk.__all__, *support.__all__, *solutions.__all__, *diversity.__all__]
