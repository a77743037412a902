"""Evaluation benchmarks: prompts plus the gold columns of the reward that grades them.

A :class:`Benchmark` is a list of records. Every record has an ``id`` (str), a ``prompt`` and the
*gold columns* of the benchmark's reward (see :mod:`exploration_trl.rewards`); the harness calls the
reward exactly as TRL's GRPO trainer would, i.e. ``reward(completions, prompts=..., **gold_columns)``.

Built-in benchmarks (files in ``exploration_trl/data/benchmarks/``; see ``SOURCES.md``/``LICENSES.md``):

==============  =======  =================  ===================================================
name            records  reward             gold columns / prompt
==============  =======  =================  ===================================================
``gsm8k``       1319     ``math_accuracy``  ``answer`` (text after ``####``, commas removed)
``math500``     500      ``math_accuracy``  ``answer`` (LaTeX string as in MATH)
``aime24``      30       ``math_accuracy``  ``answer`` (zero-padded string such as ``"025"``)
``aime25``      30       ``math_accuracy``  ``answer`` (int -> str); ``\\f`` repair of 2 records
``amc23``       40       ``math_accuracy``  ``answer`` (float -> str, ``27.0`` -> ``"27"``)
``countdown3``  256      ``countdown``      ``nums`` (list of 3 ints), ``target`` (int)
``humaneval``   164      ``code_execution`` ``test``, ``entry_point``; prompt = function header
==============  =======  =================  ===================================================

Prompt formats (also in :data:`PROMPT_FORMATS` and :func:`describe`):

* math benchmarks: one user chat message, the problem followed by
  ``"Please reason step by step, and put your final answer within \\boxed{}."`` (the answer field is the
  last ``\\boxed{...}`` of the completion).
* ``countdown3``: one user chat message asking for an equation that uses each number once and reaches the
  target, with the final equation inside ``<answer>...</answer>``.
* ``humaneval``: **completion style** - the prompt is the plain-text function header + docstring (no chat
  template); the model continues the function body and the reward runs ``prompt + completion`` against
  the unit tests (``prompts`` column = the header). This is the format of the original HumanEval paper
  and works for base and instruct models alike.

Local files (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.parquet``): one record per row; the question column
(default ``question``) becomes the user message (with the math instruction when graded with
``math_accuracy``, verbatim otherwise), the answer column (default ``answer``) becomes the gold ``answer``
column, and every other column is passed to the reward unchanged (so e.g. ``--reward countdown`` finds
``nums``/``target``).
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exploration_trl.eval import EvalError

__all__ = [
    "Benchmark",
    "BUILTIN_BENCHMARKS",
    "PROMPT_FORMATS",
    "DATA_DIR",
    "MATH_INSTRUCTION",
    "load_benchmark",
    "describe",
    "math_prompt",
    "countdown_prompt",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "benchmarks"

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

COUNTDOWN_TEMPLATE = (
    "Using the numbers {nums}, write an arithmetic equation whose value is {target}. "
    "You may use +, -, * and / and parentheses, and you must use every number exactly once. "
    "Think it through first, then give only the final equation (without '= {target}') "
    "between <answer> and </answer>, for example <answer>(7 - 3) * 2</answer>."
)


def math_prompt(problem: str) -> list[dict[str, str]]:
    """The chat prompt of the math benchmarks: the problem, then :data:`MATH_INSTRUCTION`."""
    return [{"role": "user", "content": f"{problem.strip()}\n{MATH_INSTRUCTION}"}]


def countdown_prompt(nums: list[int], target: int) -> list[dict[str, str]]:
    """The chat prompt of ``countdown3``."""
    return [{"role": "user", "content": COUNTDOWN_TEMPLATE.format(nums=list(nums), target=target)}]


_MATH_FORMAT = (
    "chat: one user message = problem + '\\n' + \"" + MATH_INSTRUCTION + "\"; answer field: the last "
    "\\boxed{...} in the completion; reward math_accuracy, gold column 'answer'"
)

#: How each built-in benchmark prompts the model and where the answer is read from.
PROMPT_FORMATS: dict[str, str] = {
    "gsm8k": _MATH_FORMAT + " (text after '####' in the GSM8K solution, commas removed)",
    "math500": _MATH_FORMAT + " (the MATH-500 'answer' string)",
    "aime24": _MATH_FORMAT + " (zero-padded string, e.g. '025')",
    "aime25": _MATH_FORMAT + " (integer as a string; '\\f' of records 18 and 27 repaired)",
    "amc23": _MATH_FORMAT + " (float written as an integer when integral, 27.0 -> '27')",
    "countdown3": (
        "chat: one user message = " + repr(COUNTDOWN_TEMPLATE) + "; answer field: the equation inside the last "
        "<answer>...</answer>; reward countdown, gold columns 'nums' (list of 3 ints) and 'target' (int)"
    ),
    "humaneval": (
        "completion style (plain text, no chat template): the prompt is the function signature + docstring "
        "and the model writes the body; reward code_execution runs prompt + completion against the tests; "
        "gold columns 'test', 'entry_point' (the header is passed as 'prompts')"
    ),
    "local": (
        "local .jsonl/.json/.parquet: chat user message = the question column (+ the \\boxed{} instruction when "
        "graded with math_accuracy, verbatim otherwise); gold column 'answer' = the answer column; other "
        "columns are passed to the reward unchanged"
    ),
}


@dataclass
class Benchmark:
    """An evaluation set.

    Attributes:
        name: benchmark name (built-in name or the local file's stem).
        reward: name of the reward in :mod:`exploration_trl.rewards` that grades it.
        records: one dict per problem: ``id`` (str), ``prompt`` (chat messages, or a plain string for
            completion-style benchmarks) and the reward's gold columns.
        gold_columns: the record keys passed to the reward (besides ``prompts``).
        prompt_format: human-readable description of the prompt and the answer field.
        answer_type: ``"math"`` (last ``\\boxed{}``), ``"countdown"`` (``<answer>`` tag) or ``"code"``
            (no single answer; maj@n is not defined) - how the harness extracts answers for maj@n.
        source: the data file.
    """

    name: str
    reward: str
    records: list[dict[str, Any]]
    gold_columns: tuple[str, ...]
    prompt_format: str
    answer_type: str = "math"
    source: str = ""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records)

    def describe(self) -> str:
        return f"{self.name} ({len(self.records)} problems, reward {self.reward}): {self.prompt_format}"


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}:{lineno}: invalid JSON line ({e.msg})") from None
    return rows


def _number_to_str(x: Any) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        return str(int(x))
    return str(x).strip()


def _gsm8k_final(solution: str) -> str:
    return solution.split("####")[-1].strip().replace(",", "")


def _math_records(rows, problem_key, answer_fn, id_fn):
    return [
        {"id": str(id_fn(i, r)), "prompt": math_prompt(r[problem_key]), "answer": answer_fn(r)}
        for i, r in enumerate(rows)
    ]


def _load_gsm8k():
    """GSM8K test (1319): math prompt from `question`; gold `answer` = text after `####`, commas removed."""
    rows = _read_jsonl(DATA_DIR / "gsm8k_test.jsonl")
    return _math_records(rows, "question", lambda r: _gsm8k_final(r["answer"]), lambda i, r: i)


def _load_math500():
    """MATH-500 (500): math prompt from `problem`; gold `answer` = the MATH answer string; id = unique_id."""
    rows = _read_jsonl(DATA_DIR / "math500_test.jsonl")
    return _math_records(rows, "problem", lambda r: str(r["answer"]), lambda i, r: r["unique_id"])


def _load_aime24():
    """AIME 2024 (30): math prompt from `problem`; gold `answer` = zero-padded string (e.g. "025"); id 60-89."""
    rows = _read_jsonl(DATA_DIR / "aime24_test.jsonl")
    return _math_records(rows, "problem", lambda r: str(r["answer"]), lambda i, r: r["id"])


def _load_aime25():
    """AIME 2025 (30): math prompt from `problem` (form feeds of records 18/27 repaired); gold `answer` = int as str."""
    rows = _read_jsonl(DATA_DIR / "aime25_test.jsonl")
    for r in rows:
        # The source JSON writes "\frac" with one backslash in two records, which JSON decodes as a
        # form feed + "rac" (see SOURCES.md).
        r["problem"] = r["problem"].replace("\x0c", "\\f")
    return _math_records(rows, "problem", lambda r: _number_to_str(r["answer"]), lambda i, r: r["id"])


def _load_amc23():
    """AMC 2023 (40): math prompt from `problem`; gold `answer` = float as str, integral values without ".0"."""
    rows = _read_jsonl(DATA_DIR / "amc23_test.jsonl")
    return _math_records(rows, "problem", lambda r: _number_to_str(r["answer"]), lambda i, r: r["id"])


def _load_countdown3():
    """Countdown-3 (256): `input` "30,100,93" -> `nums` [30, 100, 93]; `output` -> `target` int; <answer> prompt."""
    records = []
    for i, r in enumerate(_read_jsonl(DATA_DIR / "countdown_cd3_test.jsonl")):
        nums = [int(x) for x in str(r["input"]).split(",")]
        target = int(r["output"])
        records.append({"id": str(i), "prompt": countdown_prompt(nums, target), "nums": nums, "target": target})
    return records


def _load_humaneval():
    """HumanEval (164): completion-style plain-text `prompt` (header + docstring); gold `test`, `entry_point`."""
    return [
        {"id": r["task_id"], "prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]}
        for r in _read_jsonl(DATA_DIR / "HumanEval.jsonl.gz")
    ]


#: name -> (loader, reward, gold columns, answer_type, data file)
BUILTIN_BENCHMARKS: dict[str, tuple] = {
    "gsm8k": (_load_gsm8k, "math_accuracy", ("answer",), "math", "gsm8k_test.jsonl"),
    "math500": (_load_math500, "math_accuracy", ("answer",), "math", "math500_test.jsonl"),
    "aime24": (_load_aime24, "math_accuracy", ("answer",), "math", "aime24_test.jsonl"),
    "aime25": (_load_aime25, "math_accuracy", ("answer",), "math", "aime25_test.jsonl"),
    "amc23": (_load_amc23, "math_accuracy", ("answer",), "math", "amc23_test.jsonl"),
    "countdown3": (_load_countdown3, "countdown", ("nums", "target"), "countdown", "countdown_cd3_test.jsonl"),
    "humaneval": (_load_humaneval, "code_execution", ("test", "entry_point"), "code", "HumanEval.jsonl.gz"),
}

_ALIASES = {"math-500": "math500", "math_500": "math500", "countdown": "countdown3", "cd3": "countdown3",
            "human_eval": "humaneval", "human-eval": "humaneval", "gsm8k_test": "gsm8k"}

_ANSWER_TYPES = {"math_accuracy": "math", "countdown": "countdown", "code_execution": "code"}

_LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def describe(name: str | None = None) -> str:
    """Prompt format and answer field of one built-in benchmark (or of all of them)."""
    if name is None:
        return "\n".join(f"{k}: {v}" for k, v in PROMPT_FORMATS.items())
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in PROMPT_FORMATS:
        raise EvalError(f"unknown benchmark {name!r}; built-in benchmarks: {', '.join(BUILTIN_BENCHMARKS)}")
    return PROMPT_FORMATS[key]


def _read_local(path: Path) -> list[dict]:
    name = path.name.lower()
    if name.endswith(".jsonl") or name.endswith(".jsonl.gz"):
        rows = _read_jsonl(path)
    elif name.endswith(".json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise EvalError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):
                data = lists[0]  # {"data": [...]} style
            elif lists and all(isinstance(v, list) for v in data.values()) and len({len(v) for v in data.values()}) == 1:
                keys = list(data)  # column-oriented {"question": [...], "answer": [...]}
                data = [dict(zip(keys, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise EvalError(f"{path}: expected a JSON list of objects (one per problem)")
        rows = data
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        raise EvalError(f"{path}: unsupported file type; use one of {', '.join(_LOCAL_SUFFIXES)}")
    if not rows:
        raise EvalError(f"{path}: the file has no records")
    return rows


def _load_local(path: Path, question_column: str | None, answer_column: str | None, reward: str | None):
    rows = _read_local(path)
    qcol = question_column or "question"
    acol = answer_column or "answer"
    reward = reward or "math_accuracy"
    present = list(rows[0].keys())
    for col, flag in ((qcol, "--question-column"), (acol, "--answer-column")):
        missing = [i for i, r in enumerate(rows) if col not in r]
        if missing:
            where = "" if len(missing) == len(rows) else f" in record {missing[0]}"
            raise EvalError(
                f"{path.name}: column {col!r} not found{where}; columns present: {', '.join(map(str, present))} "
                f"(choose with {flag})"
            )
    records = []
    for i, r in enumerate(rows):
        question = r[qcol]
        if not isinstance(question, str):
            raise EvalError(f"{path.name}: record {i}: question column {qcol!r} is not a string")
        answer = r[acol]
        if reward == "math_accuracy":
            prompt = math_prompt(question)
            answer = _number_to_str(answer)
            if "####" in answer:  # a GSM8K-style worked solution
                answer = _gsm8k_final(answer)
        else:
            prompt = [{"role": "user", "content": question}]
        rec = {k: v for k, v in r.items() if k not in (qcol, acol, "prompt", "prompts", "completions", "id")}
        rec.update({"id": str(r.get("id", i)), "prompt": prompt, "answer": answer})
        records.append(rec)
    gold = tuple(k for k in records[0] if k not in ("id", "prompt"))
    name = path.name
    for suffix in _LOCAL_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return Benchmark(
        name=name,
        reward=reward,
        records=records,
        gold_columns=gold,
        prompt_format=PROMPT_FORMATS["local"] + f" (question column {qcol!r}, answer column {acol!r})",
        answer_type=_ANSWER_TYPES.get(reward, "math"),
        source=str(path.resolve()),
    )


def load_benchmark(
    name_or_path: str | Path,
    limit: int | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    reward: str | None = None,
) -> Benchmark:
    """Load a built-in benchmark by name, or a local ``.jsonl``/``.json``/``.parquet`` file.

    Args:
        name_or_path: one of :data:`BUILTIN_BENCHMARKS` (``gsm8k``, ``math500``, ``aime24``, ``aime25``,
            ``amc23``, ``countdown3``, ``humaneval``) or a path to a local file.
        limit: keep only the first ``limit`` problems.
        question_column / answer_column: columns of a local file (defaults ``question`` / ``answer``).
        reward: reward name; for local files the default is ``math_accuracy``; for a built-in benchmark it
            may only name the benchmark's own reward (or another reward taking the same gold columns).

    Raises:
        EvalError: unknown name, unreadable file, missing column (the message lists the columns present).
    """
    if limit is not None and int(limit) < 1:
        raise EvalError(f"limit must be a positive integer, got {limit}")
    key = str(name_or_path)
    builtin = _ALIASES.get(key.lower(), key.lower())
    path = Path(key).expanduser()
    if builtin in BUILTIN_BENCHMARKS and not path.is_file():
        if question_column or answer_column:
            raise EvalError(
                f"--question-column/--answer-column only apply to local files, not to the built-in benchmark {builtin!r}"
            )
        loader, default_reward, gold, answer_type, fname = BUILTIN_BENCHMARKS[builtin]
        bench = Benchmark(
            name=builtin,
            reward=reward or default_reward,
            records=loader(),
            gold_columns=gold,
            prompt_format=PROMPT_FORMATS[builtin],
            answer_type=answer_type if not reward else _ANSWER_TYPES.get(reward, answer_type),
            source=str(DATA_DIR / fname),
        )
    elif path.is_file():
        bench = _load_local(path, question_column, answer_column, reward)
    elif path.suffix or "/" in key or "\\" in key:
        raise EvalError(f"benchmark file not found: {key}")
    else:
        raise EvalError(
            f"unknown benchmark {key!r}: use one of {', '.join(BUILTIN_BENCHMARKS)} or a path to a "
            f"{'/'.join(_LOCAL_SUFFIXES)} file"
        )
    if limit is not None:
        bench.records = bench.records[: int(limit)]
    return bench
