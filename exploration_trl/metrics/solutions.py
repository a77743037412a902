"""Problem-level solution metrics: unsolvable sets (STILL, Sec. 2.1) and solution multiplicity (DS-GRPO, Eq. 2)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "unsolvable_problems",
    "unsolvable_overlap",
    "solution_multiplicity",
    "mean_solution_multiplicity",
    "default_normalize",
    "math_answers_equivalent",
    "answer_classes",
]


def _iter_problems(correct) -> Iterable[tuple[Hashable, Sequence[Any]]]:
    if isinstance(correct, Mapping):
        return correct.items()
    if isinstance(correct, np.ndarray):
        if correct.ndim != 2:
            raise ValueError(f"correct must be 2-D (problems x samples), got shape {correct.shape}")
        return enumerate(correct)
    return enumerate(correct)


def unsolvable_problems(correct, k: int | None = None) -> set:
    """Problems with no correct sample among their first ``k`` samples.

    Args:
        correct: per-problem correctness, either a ``(P, n)`` array / list of lists of 0/1 (problems
            are then identified by their index) or a dict ``{problem_id: [0/1, ...]}`` (identified by id).
        k: how many leading samples to look at; ``None`` = all of them.

    Returns:
        The set of indices (or ids) of unsolved problems.

    Raises:
        ValueError: if ``k < 1`` or a problem has fewer than ``k`` samples.
    """
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out = set()
    for pid, samples in _iter_problems(correct):
        s = np.asarray(samples, dtype=np.float64).ravel()
        if k is not None:
            if s.size < k:
                raise ValueError(f"problem {pid!r} has {s.size} samples, fewer than k={k}")
            s = s[:k]
        if not np.any(s > 0):
            out.add(pid)
    return out


def _sorted_ids(ids: set) -> list:
    try:
        return sorted(ids)
    except TypeError:
        return sorted(ids, key=repr)


def unsolvable_overlap(a: Iterable[Hashable], b: Iterable[Hashable], *, return_ids: bool = False) -> dict:
    """Compare two sets of unsolved problems (e.g. base model vs. RL model, both from :func:`unsolvable_problems`).

    Returns:
        ``dict(only_a, only_b, both, n_a, n_b, jaccard)`` where ``only_a = |A \\ B|``,
        ``only_b = |B \\ A|``, ``both = |A ∩ B|``, ``n_a = |A|``, ``n_b = |B|`` (ints) and
        ``jaccard = |A ∩ B| / |A ∪ B|`` (float; NaN when both sets are empty).  With
        ``return_ids=True`` the keys ``only_a_ids``, ``only_b_ids``, ``both_ids`` hold the sorted ids.
    """
    sa, sb = set(a), set(b)
    inter, union = sa & sb, sa | sb
    out = dict(
        only_a=len(sa - sb),
        only_b=len(sb - sa),
        both=len(inter),
        n_a=len(sa),
        n_b=len(sb),
        jaccard=(len(inter) / len(union)) if union else float("nan"),
    )
    if return_ids:
        out.update(
            only_a_ids=_sorted_ids(sa - sb), only_b_ids=_sorted_ids(sb - sa), both_ids=_sorted_ids(inter)
        )
    return out


def default_normalize(answer: Any) -> Any:
    """Default answer normalisation: strip surrounding whitespace of strings, leave other values as they are."""
    return answer.strip() if isinstance(answer, str) else answer


def math_answers_equivalent(a: Any, b: Any) -> bool:
    """Whether two final math answers are the same value by math-verify (``"1/2"``, ``"\\frac{1}{2}"`` and ``"0.5"``
    are one answer): each is read as ``\\boxed{...}`` and verified against the other, in both directions. Equal
    strings are equivalent without parsing; an answer math-verify cannot parse is equivalent only to itself."""
    if a == b:
        return True
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    from exploration_trl.rewards.math_verifier import math_verify_module  # lazy: math-verify loads sympy

    mv = math_verify_module()
    try:
        pa = mv.parse("\\boxed{" + a + "}", parsing_timeout=None)
        pb = mv.parse("\\boxed{" + b + "}", parsing_timeout=None)
        return bool(pa and pb and (mv.verify(pa, pb, timeout_seconds=None) or mv.verify(pb, pa, timeout_seconds=None)))
    except Exception:  # noqa: BLE001 - an answer the verifier cannot handle counts as its own string
        return False


def answer_classes(values: Sequence[Any], equivalent: Callable[[Any, Any], bool] | None = None) -> list[int | None]:
    """The class of each value, numbered 0, 1, ... in order of first appearance (None for a None value): equal values
    share a class, and with `equivalent` each value joins the first class whose first member it is equivalent to
    (exact duplicates are merged before any comparison, so `equivalent` runs once per distinct value and class)."""
    distinct = list(dict.fromkeys(v for v in values if v is not None))
    reps: list = []
    of: dict = {}
    for v in distinct:
        found = None if equivalent is None else next((i for i, r in enumerate(reps) if equivalent(r, v)), None)
        if found is None:
            found = len(reps)
            reps.append(v)
        of[v] = found
    return [None if v is None else of[v] for v in values]


def _count_classes(values: list, equivalent: Callable[[Any, Any], bool] | None) -> int:
    """Distinct values, or with `equivalent` the number of classes (`answer_classes`)."""
    return len({k for k in answer_classes(values, equivalent) if k is not None})


def solution_multiplicity(
    answers: Sequence[Sequence[Any]],
    correct: Sequence[Sequence[Any]],
    normalize: Callable[[Any], Any] | None = None,
    equivalent: Callable[[Any, Any], bool] | None = None,
) -> list[int]:
    """Number of distinct correct answers per problem (DS-GRPO, Eq. 2).

    Args:
        answers: per problem, the list of extracted answers (or full solutions); ``None`` entries
            are ignored.
        correct: per problem, aligned 0/1 (bool) correctness flags.
        normalize: applied to each answer before de-duplication; default :func:`default_normalize`
            (strip whitespace).  Must return a hashable value.
        equivalent: optional ``(a, b) -> bool``; answers it judges equal count once (e.g.
            :func:`math_answers_equivalent`, so ``"1/2"``, ``"\\frac{1}{2}"`` and ``"0.5"`` are one answer). Default:
            equal normalised values only.

    Returns:
        ``list[int]``, one count per problem (0 for problems without a correct answer).
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answer lists but {len(correct)} correctness lists")
    norm = default_normalize if normalize is None else normalize
    out = []
    for p, (ans, cor) in enumerate(zip(answers, correct)):
        ans, cor = list(ans), list(cor)
        if len(ans) != len(cor):
            raise ValueError(f"problem {p} has {len(ans)} answers but {len(cor)} correctness flags")
        out.append(_count_classes([norm(a) for a, c in zip(ans, cor) if a is not None and bool(c)], equivalent))
    return out


def mean_solution_multiplicity(
    answers: Sequence[Sequence[Any]],
    correct: Sequence[Sequence[Any]],
    normalize: Callable[[Any], Any] | None = None,
    *,
    solved_only: bool = False,
    equivalent: Callable[[Any, Any], bool] | None = None,
) -> float:
    """Mean of :func:`solution_multiplicity` over problems (``equivalent`` as there).

    With ``solved_only=True`` the mean is taken over problems with at least one correct answer.
    Returns NaN when no problem qualifies.
    """
    counts = solution_multiplicity(answers, correct, normalize, equivalent)
    if solved_only:
        counts = [c for c in counts if c > 0]
    if not counts:
        return float("nan")
    return float(np.mean(counts))
