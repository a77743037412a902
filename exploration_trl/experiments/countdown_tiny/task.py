"""Countdown-tiny's task and data: the settings, the problems and their train/test split, the prompt format and
the held-out benchmark."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, make_dataclass
from fractions import Fraction
from typing import Any

OPS = ("+", "-", "*", "/")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


# ------------------------------------------------------------------------------------------ settings
#: The held-out evaluation steps of the budget experiment (`research/curves.py`), which the demo shares: step 0 is the
#: warm start, the same for every run.
EVAL_STEPS = (0, 100, 200, 400, 700, 1000, 1500)
QUICK_EVAL_STEPS = (0, 2, 4)
#: Every setting, `section -> {name: (default, quick)}`: `Settings()` holds the defaults and `quick_settings()` the
#: quick values (a few-minute smoke run), side by side so the two presets are read and changed in one place.
#: `data`: the problems (numbers 1..max_num, targets 1..max_target) and their split; `model`: the char-level toy
#: Qwen2 (keywords of `toy.build_toy_model`); `sft`: the warm start (AdamW, linear warm-up, cosine decay to 5%,
#: gradient clipping at 1); `rl`: one RL run of `steps` optimizer steps x `prompts_per_step` prompts x
#: `num_generations` completions, whose `seed` (None: the experiment's seed) seeds the RL run and its evaluation but
#: not the split or the warm start; `eval`: `n_samples` completions for each of the first `num_problems` test problems.
SETTINGS_TABLE: dict[str, dict[str, tuple[Any, Any]]] = {
    "data": dict(max_num=(12, 6), max_target=(100, 30), num_train=(3000, 300), num_test=(200, 24),
                 solutions_per_problem=(4, 3), numbers_per_problem=(3, 3)),
    "model": dict(hidden_size=(96, 64), num_hidden_layers=(3, 2), num_attention_heads=(4, 4), num_key_value_heads=(2, 2),
                  intermediate_size=(256, 128)),
    "sft": dict(steps=(3000, 300), batch_size=(64, 32), learning_rate=(2e-3, 3e-3), weight_decay=(0.01, 0.01),
                warmup_steps=(100, 20)),
    "rl": dict(steps=(200, 4), num_generations=(8, 4), prompts_per_step=(16, 2), learning_rate=(1e-4, 5e-4),
               max_completion_length=(20, 16), temperature=(1.0, 1.0), seed=(None, None)),
    "eval": dict(n_samples=(64, 8), num_problems=(200, 24), temperature=(1.0, 1.0), top_p=(1.0, 1.0),
                 batch_size=(512, 256)),
}


def _section(name: str, class_name: str) -> type:
    """The dataclass of one `SETTINGS_TABLE` section, with the defaults as field defaults."""
    fields = [(key, int | None if default is None else type(default), field(default=default))
              for key, (default, _) in SETTINGS_TABLE[name].items()]
    cls = make_dataclass(class_name, fields)
    cls.__module__ = __name__  # so spawned workers unpickle it
    return cls


DataSettings = _section("data", "DataSettings")
ModelSettings = _section("model", "ModelSettings")
SFTSettings = _section("sft", "SFTSettings")
RLSettings = _section("rl", "RLSettings")
EvalSettings = _section("eval", "EvalSettings")
SECTIONS = {"data": DataSettings, "model": ModelSettings, "sft": SFTSettings, "rl": RLSettings, "eval": EvalSettings}


@dataclass
class Settings:
    seed: int = 0
    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    rl: RLSettings = field(default_factory=RLSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)

    @property
    def rl_seed(self) -> int:
        return self.seed if self.rl.seed is None else self.rl.seed


def quick_settings(seed: int = 0) -> Settings:
    """The quick column of `SETTINGS_TABLE`: small data, a small model, a short SFT, a few RL steps, a small eval."""
    sections = {name: SECTIONS[name](**{k: quick for k, (_, quick) in table.items()})
                for name, table in SETTINGS_TABLE.items()}
    return Settings(seed=seed, **sections)


# ------------------------------------------------------------------------------------------ problems
def _value(expr) -> Fraction | None:
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a, b = _value(left), _value(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def render(expr, full_parens: bool = False) -> str:
    """Infix string: minimal parentheses, or (`full_parens`) every inner operation in parentheses."""
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr

    def child(e, is_right: bool) -> str:
        s = render(e, full_parens)
        if isinstance(e, int):
            return s
        if full_parens:
            return f"({s})"
        cp, pp = _PREC[e[0]], _PREC[op]
        if cp < pp or (is_right and cp == pp and op in "-/"):
            return f"({s})"
        return s

    return f"{child(left, False)}{op}{child(right, True)}"


def _ordered_trees(seq: tuple[int, ...]):
    """Every binary expression tree over the numbers of `seq` in this order (all bracketings and operators)."""
    if len(seq) == 1:
        yield seq[0]
        return
    for i in range(1, len(seq)):
        for left in list(_ordered_trees(seq[:i])):
            for right in list(_ordered_trees(seq[i:])):
                for op in OPS:
                    yield (op, left, right)


def expressions(nums: tuple[int, ...]):
    """Every expression tree using each of the numbers once: all bracketings, orders and operators (3 numbers: the
    original enumeration, kept as it was so the 3-number problems and warm starts do not change)."""
    seen = set()
    if len(nums) != 3:
        for perm in dict.fromkeys(itertools.permutations(nums)):
            for tree in _ordered_trees(perm):
                key = render(tree, full_parens=True)
                if key not in seen:
                    seen.add(key)
                    yield tree
        return
    for a, b, c in itertools.permutations(nums):
        for o1, o2 in itertools.product(OPS, repeat=2):
            for tree in ((o2, (o1, a, b), c), (o1, a, (o2, b, c))):
                key = render(tree, full_parens=True)
                if key not in seen:
                    seen.add(key)
                    yield tree


def _table(nums: tuple[int, ...]) -> list[tuple[Fraction, str, str]]:
    """`(value, minimal form, fully parenthesised form)` of every expression over `nums` (division by 0 skipped)."""
    out = []
    for t in expressions(nums):
        v = _value(t)
        if v is not None:
            out.append((v, render(t), render(t, full_parens=True)))
    return out


def solutions(nums: tuple[int, ...], target: int) -> list[str]:
    """Distinct minimal-parenthesis equations for a problem, sorted."""
    return sorted({m for v, m, _ in _table(tuple(nums)) if v == target})


def make_problems(data: DataSettings, seed: int) -> tuple[list[dict], list[dict]]:
    """`(train, test)` problem lists; every `(sorted numbers, target)` pair belongs to at most one split.

    Each problem: `nums` (list of `numbers_per_problem` ints, shown in a seeded random order), `target`, `solutions` (all distinct
    minimal-parenthesis equations) and `sft_texts` (the `solutions_per_problem` solution strings the warm start
    trains on, in several orders and forms).
    """
    rng = random.Random(seed)
    tables: dict[tuple[int, ...], list] = {}
    keys = []
    for nums in itertools.combinations_with_replacement(range(1, data.max_num + 1), data.numbers_per_problem):
        tables[nums] = _table(nums)
        reachable = {int(v) for v, _, _ in tables[nums] if v.denominator == 1 and 1 <= v <= data.max_target}
        keys.extend((nums, t) for t in sorted(reachable))
    rng.shuffle(keys)
    need = data.num_train + data.num_test
    if len(keys) < need:
        raise ValueError(
            f"only {len(keys)} distinct problems with numbers 1..{data.max_num} and targets 1..{data.max_target}; "
            f"fewer than the {need} train + test problems asked for"
        )
    test_keys, train_keys = keys[: data.num_test], keys[data.num_test : need]
    assert not set(test_keys) & set(train_keys)

    def build(key, with_sft: bool) -> dict:
        nums, target = key
        shown = list(nums)
        rng.shuffle(shown)
        hits = [(m, f) for v, m, f in tables[nums] if v == target]
        rec = {"nums": shown, "target": target, "solutions": sorted({m for m, _ in hits})}
        if with_sft:
            forms = sorted({m for m, _ in hits} | {f for _, f in hits})
            rng.shuffle(forms)
            rec["sft_texts"] = forms[: data.solutions_per_problem]
        return rec

    return [build(k, True) for k in train_keys], [build(k, False) for k in test_keys]


def prompt_text(nums, target) -> str:
    return f"nums: {' '.join(str(n) for n in nums)}\ntarget: {target}\n"


def _key(problem: dict) -> tuple:
    return tuple(sorted(problem["nums"])), int(problem["target"])


def heldout_benchmark(test: list[dict], num_problems: int):
    from ...eval.benchmarks import Benchmark

    records = [{"id": f"cd{i}", "prompt": prompt_text(p["nums"], p["target"]), "nums": list(p["nums"]),
                "target": int(p["target"])} for i, p in enumerate(test[:num_problems])]
    return Benchmark(
        name="countdown_tiny_test", reward="countdown", records=records, gold_columns=("nums", "target"),
        prompt_format="plain text 'nums: a b c\\ntarget: t\\n'; the completion is the bare equation (last line)",
        answer_type="countdown", source="exploration_trl.experiments.countdown_tiny",
    )
