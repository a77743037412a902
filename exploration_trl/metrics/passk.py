"""Sample-based accuracy metrics: unbiased pass@k, avg@n and maj@n.

All functions are pure (numpy only) and accept plain Python containers.

``pass_at_k`` implements the unbiased estimator of Chen et al. (2021),

    pass@k = 1 - C(n - c, k) / C(n, k),

for a problem with ``n`` samples of which ``c`` are correct.  The binomial ratio is never formed
from factorials; it is evaluated as a product of at most ``min(c, k)`` factors in log space,

    C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)          (c factors)
                        = prod_{j=0}^{k-1}  (1 - c / (n - j))       (k factors),

i.e. ``1 - exp(sum log1p(-x))`` computed as ``-expm1(sum log1p(-x))``, which keeps full relative
precision both when pass@k is tiny and when it is close to 1 (tested exact to ~1e-12 against
``fractions.Fraction`` for n = 10^4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from exploration_trl.metrics.solutions import answer_classes

__all__ = ["pass_at_k", "pass_at_k_curve", "default_ks", "parse_ks", "avg_at_n", "maj_at_n"]


def _as_int_array(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must contain integers, got {x!r}")
        return arr.astype(np.int64)
    raise ValueError(f"{name} must be an integer or an array of integers, got {x!r}")


def _log_ratio(n: int, c: int, k: int) -> float:
    """log(C(n-c, k) / C(n, k)) for 0 <= c, 1 <= k, n - c >= k (so every factor is > 0)."""
    if c == 0:
        return 0.0
    if c <= k:
        i = np.arange(n - c + 1, n + 1, dtype=np.float64)
        return float(np.sum(np.log1p(-k / i)))
    j = np.arange(k, dtype=np.float64)
    return float(np.sum(np.log1p(-c / (n - j))))


def _pass_at_k_scalar(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    if c == 0:
        return 0.0
    return float(-np.expm1(_log_ratio(n, c, k)))


def pass_at_k(n, c, k):
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021).

    Args:
        n: number of samples per problem (int or integer array).
        c: number of correct samples per problem (int or integer array).
        k: the k in pass@k (int or integer array), ``1 <= k <= n``.

    ``n``, ``c`` and ``k`` broadcast against each other (e.g. arrays of equal shape, or arrays with a
    scalar ``k``).

    Returns:
        A Python ``float`` when all three arguments are scalars, otherwise a float64 ``np.ndarray`` of
        the broadcast shape.  The value is exactly 1.0 when ``n - c < k`` (every k-subset contains a
        correct sample) and 0.0 when ``c == 0``.

    Raises:
        ValueError: if any argument is negative or non-integral, ``k < 1``, ``k > n`` or ``c > n``.
    """
    n_a, c_a, k_a = (_as_int_array(v, name) for v, name in ((n, "n"), (c, "c"), (k, "k")))
    scalar = n_a.ndim == 0 and c_a.ndim == 0 and k_a.ndim == 0
    try:
        n_b, c_b, k_b = np.broadcast_arrays(n_a, c_a, k_a)
    except ValueError as e:
        raise ValueError(
            f"n, c and k must have broadcastable shapes, got {n_a.shape}, {c_a.shape}, {k_a.shape}"
        ) from e
    if np.any(n_b < 0) or np.any(c_b < 0) or np.any(k_b < 0):
        raise ValueError("pass_at_k: n, c and k must be non-negative")
    if np.any(k_b < 1):
        raise ValueError("pass_at_k: k must be >= 1")
    if np.any(c_b > n_b):
        raise ValueError("pass_at_k: the number of correct samples c cannot exceed the number of samples n")
    if np.any(k_b > n_b):
        raise ValueError(
            f"pass_at_k: k cannot exceed the number of samples n (got k={int(k_b.max())}, "
            f"n={int(n_b.min())}); pass@k is only estimable for k <= n"
        )
    if scalar:
        return _pass_at_k_scalar(int(n_b), int(c_b), int(k_b))

    if n_b.size == 0:
        return np.empty(n_b.shape, dtype=np.float64)
    triples = np.stack([n_b.ravel(), c_b.ravel(), k_b.ravel()], axis=1)
    # Problems usually share (n, c, k) triples (n and k fixed, c in 0..n): compute each once.
    uniq, inverse = np.unique(triples, axis=0, return_inverse=True)
    vals = np.array([_pass_at_k_scalar(int(a), int(b), int(d)) for a, b, d in uniq], dtype=np.float64)
    return vals[np.asarray(inverse).ravel()].reshape(n_b.shape)


def default_ks(n: int) -> list[int]:
    """Powers of two ``1, 2, 4, ...`` up to ``n``, plus ``n`` itself when it is not a power of two."""
    n = int(n)
    if n < 1:
        raise ValueError(f"default_ks: n must be >= 1, got {n}")
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def parse_ks(
    ks: Any,
    n: int | None = None,
    *,
    error: type[Exception] = ValueError,
    not_integers: str = "k values must be integers, got {ks!r}",
    empty: str = "no k values given",
    too_small: str = "k={k} is out of range: pass@k needs 1 <= k <= n={n}",
    too_large: str = "k={k} is out of range: pass@k needs 1 <= k <= n={n}",
) -> list[int] | None:
    """The k values of a pass@k table, the one parser of `eval`, `compare`, the eval CLI's ``--k`` and training's
    ``eval_ks``: sorted, each once.

    Args:
        ks: a comma-separated string (``"1,2,4,64"``; blanks between commas are skipped), an iterable of integers
            (or of integer strings, or of integral floats such as ``8.0``), or one integer. ``None`` gives the default
            1, 2, 4, ..., ``n`` (:func:`default_ks`), or ``None`` when ``n`` is ``None``.
        n: the largest k allowed (the samples per problem); ``None``: no upper bound.
        error: the exception class raised (callers pass their own, e.g. ``EvalError``).
        not_integers, empty, too_small, too_large: the one-line messages of each error, formatted with ``ks`` (the
            value as given), ``k`` (the first k out of range) and ``n``: a value that is not an integer, no value at
            all, a k below 1, a k above ``n``.

    Raises:
        error: with the matching message.
    """
    if ks is None:
        return default_ks(n) if n is not None else None
    given = ks
    if isinstance(ks, str):
        items = [x for x in ks.split(",") if x.strip()]
    else:
        items = [ks] if isinstance(ks, (int, np.integer)) else ks
    out = set()
    try:
        for x in items:
            if isinstance(x, bool) or (isinstance(x, float) and not x.is_integer()):
                raise ValueError(x)
            out.add(int(x))
    except (TypeError, ValueError, OverflowError):
        raise error(not_integers.format(ks=given, k=None, n=n)) from None
    out = sorted(out)
    if not out:
        raise error(empty.format(ks=given, k=None, n=n))
    if out[0] < 1:
        raise error(too_small.format(ks=given, k=out[0], n=n))
    if n is not None and out[-1] > n:
        raise error(too_large.format(ks=given, k=next(k for k in out if k > n), n=n))
    return out


def pass_at_k_curve(n, c, ks: Iterable[int] | None = None) -> dict[int, float]:
    """Mean unbiased pass@k over problems for several k.

    Args:
        n: samples per problem, an int (same for every problem) or a length-P sequence.
        c: correct samples per problem, a length-P sequence (or an int for a single problem).
        ks: the k values; default :func:`default_ks` of ``min(n)`` (1, 2, 4, ..., plus ``min(n)``).

    Returns:
        ``{k: mean_p pass@k(n_p, c_p, k)}`` with Python ints as keys and floats as values,
        in the order of ``ks``.
    """
    c_a = np.atleast_1d(_as_int_array(c, "c"))
    n_a = np.broadcast_to(_as_int_array(n, "n"), c_a.shape)
    if c_a.ndim != 1:
        raise ValueError(f"pass_at_k_curve expects one count per problem, got shape {c_a.shape}")
    if c_a.size == 0:
        raise ValueError("pass_at_k_curve: no problems given")
    if ks is None:
        ks = default_ks(int(n_a.min()))
    return {int(k): float(np.mean(pass_at_k(n_a, c_a, int(k)))) for k in ks}


def _flatten_scores(correct) -> np.ndarray:
    if isinstance(correct, np.ndarray):
        return correct.astype(np.float64).ravel()
    rows = [np.asarray(row, dtype=np.float64).ravel() for row in correct]
    if not rows:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(rows)


def avg_at_n(correct) -> float:
    """avg@n: mean accuracy over all samples of all problems.

    Args:
        correct: ``(P, n)`` array or a list of per-problem lists of 0/1 (or float scores).
            Ragged lists are pooled, i.e. every sample counts once; with an equal number of
            samples per problem this equals the mean of the per-problem accuracies.

    Returns:
        float; NaN when there are no samples.
    """
    flat = _flatten_scores(correct)
    if flat.size == 0:
        return float("nan")
    return float(flat.mean())


def maj_at_n(answers: Sequence[Sequence[Any]], correct: Sequence[Sequence[Any]],
             equivalent: Callable[[Any, Any], bool] | None = None) -> float:
    """maj@n (majority voting) accuracy.

    For each problem the majority answer is the most frequent non-``None`` extracted answer, ties
    broken by first occurrence.  The problem counts as solved when any sample carrying that answer
    is correct.  Answers are compared with ``==``/hashing, or with ``equivalent`` grouped into classes
    (:func:`~exploration_trl.metrics.solutions.answer_classes`; e.g.
    :func:`~exploration_trl.metrics.solutions.math_answers_equivalent`, under which ``"\\frac{1}{2}"``,
    ``"0.5"`` and ``"1/2"`` are one vote-getter) whose votes add up.
    A problem whose answers are all ``None`` counts as unsolved.

    Args:
        answers: per problem, the list of extracted answers (hashable or ``None``).
        correct: per problem, the list of 0/1 (bool) correctness flags, aligned with ``answers``.
        equivalent: optional ``(a, b) -> bool``; answers it judges equal count as one answer.

    Returns:
        Mean over problems (float); NaN when there are no problems.
    """
    if isinstance(answers, Mapping) or isinstance(correct, Mapping):
        raise TypeError("maj_at_n expects per-problem sequences, not mappings")
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_n: {len(answers)} answer lists but {len(correct)} correctness lists")
    if len(answers) == 0:
        return float("nan")
    solved = 0
    for p, (ans, cor) in enumerate(zip(answers, correct)):
        ans = list(ans)
        cor = [bool(x) for x in cor]
        if len(ans) != len(cor):
            raise ValueError(f"maj_at_n: problem {p} has {len(ans)} answers but {len(cor)} correctness flags")
        classes = answer_classes(ans, equivalent)
        counts = Counter(k for k in classes if k is not None)
        if not counts:
            continue
        best = max(counts.values())
        # first answer (in sample order) reaching the top count
        majority = next(k for k in classes if k is not None and counts[k] == best)
        if any(c for k, c in zip(classes, cor) if k == majority):
            solved += 1
    return solved / len(answers)
