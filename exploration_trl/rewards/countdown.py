"""Countdown: reach ``target`` with ``nums``, each used exactly once, and ``+ - * /``.

The equation is read from the last ``<answer>...</answer>`` block of the completion, or, without
one, from its last non-empty line. A trailing ``= <number>`` is dropped, as are a leading
``Answer:``/``Equation:`` label, surrounding ``$`` and a final period; ``×``/``÷``/``−`` are read
as ``*``/``/``/``-``.

The equation is evaluated by a small interpreter over Python's ``ast``, never ``eval``: only
integer literals, binary ``+ - * /`` and parentheses are accepted (no unary minus, no ``**``, no
names or calls). Arithmetic is exact (:class:`fractions.Fraction`). Inputs are bounded before
parsing (length, parenthesis depth, literal digits) and intermediate values are bounded during
evaluation, so hostile completions like ``9**9**9`` or ``((((...))))`` 1000 deep cost microseconds.

Scores (``make_countdown`` / keyword options of ``countdown``):

* ``correct_score`` (1.0) when the equation uses every number exactly once and equals the target;
* ``format_score`` for a well-formed equation that is wrong (numbers missing, reused or extra,
  or a different value);
* 0.0 when no well-formed equation is found, or when evaluation fails (division by zero, values
  beyond the magnitude bound).

The registered ``countdown`` reward uses ``format_score=0.0`` (1.0 correct / 0.0 otherwise);
``make_countdown()`` defaults to TinyZero-style partial credit, ``format_score=0.1``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from exploration_trl.rewards.base import (
    broadcast_column,
    completion_to_text,
    record_failure,
    record_outcomes,
)

__all__ = ["canonical_equation", "countdown", "distinct_canonical", "evaluate_equation", "extract_equation",
           "make_countdown", "parse_numbers"]

REWARD_NAME = "countdown"

MAX_EQUATION_CHARS = 256
MAX_PAREN_DEPTH = 32
MAX_LITERAL_DIGITS = 12
MAX_MAGNITUDE = 10**40  # bound on |numerator| and denominator of every intermediate value

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ALLOWED_CHARS_RE = re.compile(r"^[0-9+\-*/()\s]+$")
_TRAILING_RESULT_RE = re.compile(r"=\s*[+-]?\d+(?:\.\d+)?\s*$")
_LEADING_LABEL_RE = re.compile(r"^\s*(?:final\s+)?(?:answer|equation|solution)\s*[:：]\s*", re.IGNORECASE)


class EquationError(ValueError):
    """The text is not a well-formed countdown equation."""


class EvaluationError(ArithmeticError):
    """A well-formed equation whose value cannot be computed (division by zero, overflow)."""


def extract_equation(text: str) -> str | None:
    """The candidate equation text (not yet validated), or None if there is none."""
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        candidate = tags[-1]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return None
        candidate = lines[-1]
    candidate = candidate.strip()
    candidate = _LEADING_LABEL_RE.sub("", candidate)
    candidate = candidate.strip(" \t$.")
    if "\\times" in candidate or "\\div" in candidate or "\\cdot" in candidate:
        candidate = candidate.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    candidate = candidate.translate({ord("×"): "*", ord("÷"): "/", ord("−"): "-", ord("–"): "-"})
    candidate = _TRAILING_RESULT_RE.sub("", candidate).strip()
    return candidate or None


def _check_shape(equation: str) -> None:
    if len(equation) > MAX_EQUATION_CHARS:
        raise EquationError("equation too long")
    if not _ALLOWED_CHARS_RE.match(equation):
        raise EquationError("only digits, + - * / and parentheses are allowed")
    depth = 0
    for ch in equation:
        if ch == "(":
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                raise EquationError("parentheses nested too deeply")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise EquationError("unbalanced parentheses")
    if depth:
        raise EquationError("unbalanced parentheses")
    for digits in re.findall(r"\d+", equation):
        if len(digits) > MAX_LITERAL_DIGITS:
            raise EquationError("number literal too large")


_OPS = frozenset({ast.Add, ast.Sub, ast.Mult, ast.Div})


def _bounded(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        raise EvaluationError("intermediate value too large")
    return value


def _eval_node(node: ast.AST, used: list[int], depth: int) -> Fraction:
    if depth > 4 * MAX_PAREN_DEPTH + MAX_EQUATION_CHARS:
        raise EquationError("expression nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _eval_node(node.left, used, depth + 1)
        right = _eval_node(node.right, used, depth + 1)
        op = type(node.op)
        if op is ast.Add:
            return _bounded(left + right)
        if op is ast.Sub:
            return _bounded(left - right)
        if op is ast.Mult:
            return _bounded(left * right)
        if right == 0:
            raise EvaluationError("division by zero")
        return _bounded(left / right)
    raise EquationError(f"{type(node).__name__} is not allowed")


def parse_equation(equation: str) -> ast.expr:
    """Validate ``equation`` and return its expression tree (raises :class:`EquationError`)."""
    _check_shape(equation)
    try:
        tree = ast.parse(equation, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise EquationError(f"not an expression: {exc}") from None
    # Structure check (no evaluation yet): every node must be whitelisted.
    for node in ast.walk(tree.body):
        if isinstance(node, (ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div)):
            if isinstance(node, ast.BinOp) and type(node.op) not in _OPS:
                raise EquationError(f"operator {type(node.op).__name__} is not allowed")
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        raise EquationError(f"{type(node).__name__} is not allowed")
    return tree.body


def evaluate_equation(equation: str) -> tuple[Fraction, list[int]]:
    """``(exact value, number literals used)``.

    Raises :class:`EquationError` if the text is not a well-formed equation and
    :class:`EvaluationError` if its value cannot be computed.
    """
    body = parse_equation(equation)
    used: list[int] = []
    value = _eval_node(body, used, 0)
    return value, used


def _canonical(node: ast.AST) -> str:
    """The canonical string of a parsed equation: chains of ``+`` (and of ``*``) are flattened into one node whose
    operands are sorted, so operands that commute or re-associate give the same string; ``-`` and ``/`` keep their
    order (``5-2`` and ``2-5`` differ)."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    op = type(node.op)
    if op in (ast.Add, ast.Mult):
        operands: list[ast.AST] = []
        stack = [node.left, node.right]
        while stack:
            child = stack.pop()
            if isinstance(child, ast.BinOp) and type(child.op) is op:
                stack += [child.left, child.right]
            else:
                operands.append(child)
        sign = "+" if op is ast.Add else "*"
        return "(" + sign.join(sorted(_canonical(c) for c in operands)) + ")"
    sign = "-" if op is ast.Sub else "/"
    return f"({_canonical(node.left)}{sign}{_canonical(node.right)})"


def canonical_equation(equation: str) -> str | None:
    """One string per equation up to the commutativity and associativity of ``+`` and ``*`` (``3+4`` and ``4+3``,
    ``(1+2)+3`` and ``1+(2+3)``, ``2*3+4`` and ``4+3*2`` are one equation); None when it does not parse. Used to
    count distinct correct answers by their structure rather than their written form."""
    try:
        return _canonical(parse_equation(equation))
    except (EquationError, RecursionError):
        return None


def distinct_canonical(answers: Sequence[Any], correct: Sequence[Any]) -> int:
    """Distinct correct equations of one problem up to :func:`canonical_equation` (written forms that do not parse
    count by their text)."""
    keys = set()
    for answer, ok in zip(answers, correct):
        if ok and answer is not None:
            keys.add(canonical_equation(str(answer)) or f"text:{answer}")
    return len(keys)


def parse_numbers(nums: Any) -> list[int]:
    """``[30, 100, 93]`` from a list of ints/strings or a string ``"30,100,93"`` / ``"[30, 100, 93]"``."""
    if isinstance(nums, str):
        parts = [p for p in re.split(r"[,\s\[\]]+", nums) if p]
    elif isinstance(nums, (list, tuple)):
        parts = list(nums)
    else:
        try:  # numpy arrays and the like
            parts = list(nums)
        except TypeError:
            raise ValueError(f"cannot read numbers from {type(nums).__name__}") from None
    out = []
    for p in parts:
        if isinstance(p, bool):
            raise ValueError("booleans are not numbers")
        if isinstance(p, float):
            if not p.is_integer():
                raise ValueError(f"non-integer number {p!r}")
            p = int(p)
        out.append(int(str(p).strip()) if not isinstance(p, int) else int(p))
    if not out:
        raise ValueError("no numbers")
    return out


def _parse_target(target: Any) -> Fraction:
    if isinstance(target, bool):
        raise ValueError("boolean target")
    if isinstance(target, (int, float)):
        return Fraction(target)
    if isinstance(target, str) and re.fullmatch(r"\s*[+-]?\d+(?:\.\d+)?\s*", target):
        return Fraction(target.strip())
    try:  # numpy scalars
        return Fraction(int(target))
    except (TypeError, ValueError):
        raise ValueError(f"cannot read target {target!r}") from None


def score_countdown(
    text: str, numbers: Sequence[int], target: Fraction, correct_score: float, format_score: float
) -> float:
    """Score one completion text (never raises for bad text)."""
    equation = extract_equation(text)
    if equation is None:
        return 0.0
    try:
        value, used = evaluate_equation(equation)
    except (EquationError, EvaluationError):
        return 0.0
    if Counter(used) != Counter(numbers):
        return format_score
    return correct_score if value == target else format_score


def _score_batch(
    completions: Sequence[Any], nums: Any, target: Any, format_score: float, correct_score: float, extra: dict
) -> list[float | None]:
    if nums is None and "input" in extra:
        nums = extra["input"]
    if target is None and "output" in extra:
        target = extra["output"]
    if nums is None or target is None:
        raise ValueError("countdown needs `nums` and `target` columns")
    n = len(completions)
    nums_col = [nums] * n if _is_flat_numbers(nums) else broadcast_column(nums, n)
    target_col = broadcast_column(target, n)
    rewards: list[float | None] = []
    answers: list[str | None] = []
    failures = 0
    for completion, row_nums, row_target in zip(completions, nums_col, target_col):
        answers.append(None)
        try:
            numbers = parse_numbers(row_nums)
            goal = _parse_target(row_target)
        except (TypeError, ValueError):
            failures += 1
            rewards.append(None)
            continue
        try:
            text = completion_to_text(completion)
            rewards.append(float(score_countdown(text, numbers, goal, correct_score, format_score)))
            answers[-1] = outcome_of(text)
        except Exception:  # noqa: BLE001 - never raise for a bad completion
            failures += 1
            rewards.append(0.0)
    record_failure(REWARD_NAME, failures)
    record_outcomes(REWARD_NAME, answers)
    return rewards


def outcome_of(text: str) -> str | None:
    """The completion's final answer as `record_outcomes` keeps it: its equation up to :func:`canonical_equation`
    (the key distinct-correct counts); None when it states no equation that parses."""
    equation = extract_equation(text)
    return None if equation is None else canonical_equation(equation)


def _is_flat_numbers(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def countdown(
    completions: Sequence[Any],
    nums: Any = None,
    target: Any = None,
    *,
    format_score: float = 0.0,
    correct_score: float = 1.0,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 for a correct countdown equation, ``format_score`` (0.0 here) for a well-formed wrong one.

    ``nums`` (list of ints or ``"30,100,93"``) and ``target`` (int or string) are dataset columns,
    one per completion (a single problem is broadcast). Datasets with ``input``/``output``
    columns (d1's countdown files) are read too. Rows whose numbers or target cannot be read
    score None (counted as failures).
    """
    return _score_batch(completions, nums, target, format_score, correct_score, kwargs)


#: Columns it reads (`nums`/`target`, or d1's `input`/`output`) and the rewards it gives, for checks before training.
COUNTDOWN_COLUMNS = [("nums", "target"), ("input", "output")]


def _countdown_range(format_score: float = 0.0, correct_score: float = 1.0, **_: Any) -> tuple[float, float]:
    scores = (0.0, format_score, correct_score)
    return min(scores), max(scores)


countdown.reward_columns = COUNTDOWN_COLUMNS  # type: ignore[attr-defined]
countdown.reward_range = _countdown_range  # type: ignore[attr-defined]


def make_countdown(format_score: float = 0.1, correct_score: float = 1.0):
    """Countdown reward with TinyZero-style partial credit ``format_score`` for well-formed wrong
    equations. The returned function is named ``countdown`` (TRL logs it under that name)."""

    def countdown(completions, nums=None, target=None, **kwargs):
        return _score_batch(completions, nums, target, format_score, correct_score, kwargs)

    countdown.__doc__ = f"Countdown reward (correct: {correct_score}, well-formed but wrong: {format_score})."
    countdown.reward_columns = COUNTDOWN_COLUMNS
    countdown.reward_range = _countdown_range(format_score, correct_score)
    return countdown
