"""Built-in training datasets that need no download, addressable by name from the CLI / YAML."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. Use + - * / and each number exactly once. "
    "Give the equation inside <answer></answer>."
)


def _reachable(values: tuple[Fraction, ...]) -> set[Fraction]:
    """Every value reachable by repeatedly combining two of `values` with + - * / (so each is used once)."""
    if len(values) == 1:
        return set(values)
    out: set[Fraction] = set()
    for i, j in itertools.combinations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = tuple(v for k, v in enumerate(values) if k not in (i, j))
        for c in {a + b, a - b, b - a, a * b} | ({a / b} if b else set()) | ({b / a} if a else set()):
            out |= _reachable(rest + (c,))
    return out


def countdown_problems(n: int, num_count: int = 3, max_num: int = 20, seed: int = 0) -> list[dict]:
    """`n` distinct Countdown problems with a positive integer target reachable using each number once."""
    rng = random.Random(seed)
    seen, problems = set(), []
    while len(problems) < n:
        nums = [rng.randint(1, max_num) for _ in range(num_count)]
        targets = sorted(int(v) for v in _reachable(tuple(map(Fraction, nums))) if v.denominator == 1 and 0 < v <= 100)
        if not targets:
            continue
        target = rng.choice(targets)
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        problems.append({"nums": nums, "target": target})
    return problems


def countdown_dataset(n: int = 256, seed: int = 0, conversational: bool = True):
    """Synthetic Countdown-3 training set (reward: `countdown`, columns `nums`, `target`)."""
    from datasets import Dataset

    rows = countdown_problems(n, seed=seed)
    for row in rows:
        text = COUNTDOWN_PROMPT.format(nums=", ".join(map(str, row["nums"])), target=row["target"])
        row["prompt"] = [{"role": "user", "content": text}] if conversational else text
    return Dataset.from_list(rows)


#: name -> (builder, default reward functions)
BUILTIN_DATASETS = {
    "countdown": (countdown_dataset, ["countdown"]),
}
