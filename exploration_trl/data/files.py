"""Local training files (`.jsonl`, `.json`, `.parquet`, `.csv`) and the checks that make a bad one a one-line error.

`datasets.load_dataset` fails on an empty or malformed file deep inside its builder (`StopIteration`,
`DatasetGenerationError`); these checks name the file, the line and what to do instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["LOCAL_SUFFIXES", "check_prompts", "load_local_dataset"]

#: File suffix -> `datasets` builder.
LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _check_jsonl(path: Path) -> None:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset_name '{path}': line {lineno} is not valid JSON ({e.msg}, column {e.colno}); "
                                 "fix or remove that line (one JSON object per line)") from None
            if not isinstance(row, dict):
                raise ValueError(f"dataset_name '{path}': line {lineno} is a JSON {type(row).__name__}, not an object; "
                                 'write one object per line, e.g. {"prompt": "...", "answer": "..."}')


def load_local_dataset(path: str | Path):
    """The rows of a local file as a `datasets.Dataset`; `ValueError` (one line) when it is missing, empty or
    malformed."""
    from datasets import load_dataset

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset_name '{path}': file not found")
    kind = LOCAL_SUFFIXES[path.suffix]
    if path.suffix in (".jsonl", ".json", ".csv") and not path.read_text(encoding="utf-8", errors="replace").strip():
        raise ValueError(f"dataset_name '{path}' is empty; it needs one row per prompt (for .jsonl, one JSON object "
                         'per line such as {"prompt": "..."})')
    if path.suffix == ".jsonl":
        _check_jsonl(path)
    try:
        dataset = load_dataset(kind, data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001 - any reading failure becomes one line, naming the file
        cause = e.__cause__ or e
        text = str(cause).strip().splitlines()
        raise ValueError(f"dataset_name '{path}' could not be read as {path.suffix[1:]}: "
                         f"{text[0] if text else type(cause).__name__}") from None
    if len(dataset) == 0:
        raise ValueError(f"dataset_name '{path}' has no rows; it needs one row per prompt")
    return dataset


def _empty(prompt: Any) -> str | None:
    """Why `prompt` cannot be a prompt (None when it can)."""
    if prompt is None:
        return "null"
    if isinstance(prompt, str):
        return "empty" if not prompt.strip() else None
    if isinstance(prompt, list):
        if not prompt:
            return "an empty list"
        if not all(isinstance(m, dict) and m.get("content") not in (None, "") for m in prompt):
            return "a chat message without content"
        return None
    return f"a {type(prompt).__name__}, not text or chat messages"


def check_prompts(dataset, column: str, name: str) -> None:
    """`ValueError` naming the first row whose prompt (in `column`) is null, empty or not text/chat messages."""
    for i, prompt in enumerate(dataset["prompt"]):
        why = _empty(prompt)
        if why is not None:
            raise ValueError(f"dataset '{name}' row {i} (counting from 0): its '{column}' is {why}; fill it in or "
                             "drop the row")
