"""Benchmark loading: built-in files, prompt formats, gold columns, local files and their errors."""

import json

import pytest

from exploration_trl.eval import EvalError
from exploration_trl.eval.benchmarks import (
    BUILTIN_BENCHMARKS,
    MATH_INSTRUCTION,
    PROMPT_FORMATS,
    describe,
    load_benchmark,
)

EXPECTED = {
    "gsm8k": (1319, "math_accuracy", ("answer",)),
    "math500": (500, "math_accuracy", ("answer",)),
    "aime24": (30, "math_accuracy", ("answer",)),
    "aime25": (30, "math_accuracy", ("answer",)),
    "amc23": (40, "math_accuracy", ("answer",)),
    "countdown3": (256, "countdown", ("nums", "target")),
    "humaneval": (164, "code_execution", ("test", "entry_point")),
}


def test_builtin_names_are_the_expected_ones():
    assert set(BUILTIN_BENCHMARKS) == set(EXPECTED)
    assert set(EXPECTED) <= set(PROMPT_FORMATS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_counts_and_fields(name):
    count, reward, gold = EXPECTED[name]
    bench = load_benchmark(name)
    assert len(bench) == len(bench.records) == count
    assert bench.name == name and bench.reward == reward and bench.gold_columns == gold
    assert bench.prompt_format == describe(name) and bench.prompt_format
    ids = [r["id"] for r in bench.records]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == count
    for rec in bench.records:
        assert set(rec) == {"id", "prompt", *gold}
        if name == "humaneval":
            assert isinstance(rec["prompt"], str) and "def " in rec["prompt"]
        else:
            assert isinstance(rec["prompt"], list) and len(rec["prompt"]) == 1
            assert rec["prompt"][0]["role"] == "user" and rec["prompt"][0]["content"].strip()
        if reward == "math_accuracy":
            assert rec["prompt"][0]["content"].endswith(MATH_INSTRUCTION)
            assert "\\boxed{}" in rec["prompt"][0]["content"]
            assert isinstance(rec["answer"], str) and rec["answer"].strip() == rec["answer"] and rec["answer"]


def test_gsm8k_gold_is_the_final_number_without_commas():
    bench = load_benchmark("gsm8k")
    first = bench.records[0]
    assert first["answer"] == "18" and "Janet" in first["prompt"][0]["content"]
    answers = [r["answer"] for r in bench.records]
    assert not any("," in a or "####" in a for a in answers)
    assert all(a.lstrip("-").replace(".", "", 1).isdigit() for a in answers)
    assert "1450000" in answers  # "1,450,000" in the source


def test_amc23_float_answers_become_integers_and_aime_ids():
    amc = load_benchmark("amc23")
    assert amc.records[0]["answer"] == "27"
    assert all(not a["answer"].endswith(".0") for a in amc.records)
    aime24 = load_benchmark("aime24")
    assert aime24.records[0]["id"] == "60" and aime24.records[0]["answer"] == "204"
    assert "025" in [r["answer"] for r in aime24.records]  # zero-padded strings are kept
    aime25 = load_benchmark("aime25")
    assert aime25.records[0]["answer"] == "70"


def test_aime25_form_feed_records_are_repaired():
    bench = load_benchmark("aime25")
    for i in (18, 27):
        text = bench.records[i]["prompt"][0]["content"]
        assert "\\frac" in text and "\x0c" not in text
    assert not any("\x0c" in r["prompt"][0]["content"] for r in bench.records)
    # the raw file really has the form feeds (so the repair above is doing something)
    from exploration_trl.eval.benchmarks import DATA_DIR

    raw = [json.loads(line)["problem"] for line in (DATA_DIR / "aime25_test.jsonl").read_text().splitlines()]
    assert "\x0c" in raw[18] and "\x0c" in raw[27]


def test_countdown_columns():
    bench = load_benchmark("countdown3")
    rec = bench.records[0]
    assert rec["nums"] == [30, 100, 93] and rec["target"] == 23
    assert all(len(r["nums"]) == 3 and isinstance(r["target"], int) for r in bench.records)
    content = rec["prompt"][0]["content"]
    assert "[30, 100, 93]" in content and "23" in content and "<answer>" in content
    assert bench.answer_type == "countdown"


def test_humaneval_is_completion_style():
    bench = load_benchmark("humaneval", limit=2)
    rec = bench.records[0]
    assert rec["id"] == "HumanEval/0" and rec["entry_point"] == "has_close_elements"
    assert rec["prompt"].startswith("from typing import List") and "def check(candidate)" in rec["test"]
    assert bench.answer_type == "code" and "completion style" in bench.prompt_format


def test_limit_and_aliases():
    assert len(load_benchmark("gsm8k", limit=3)) == 3
    assert load_benchmark("MATH-500", limit=1).name == "math500"
    with pytest.raises(EvalError, match="positive"):
        load_benchmark("gsm8k", limit=0)


def test_unknown_name_and_missing_file():
    with pytest.raises(EvalError, match="unknown benchmark 'nope'.*gsm8k"):
        load_benchmark("nope")
    with pytest.raises(EvalError, match="not found"):
        load_benchmark("/does/not/exist.jsonl")
    with pytest.raises(EvalError, match="only apply to local files"):
        load_benchmark("gsm8k", question_column="q")


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_jsonl_with_custom_columns(tmp_path):
    path = _write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"q": "What is 1+1?", "sol": 2.0, "level": 1},
            {"q": "What is 2+3?", "sol": "#### 5", "level": 2},
        ],
    )
    bench = load_benchmark(str(path), question_column="q", answer_column="sol")
    assert bench.name == "mine" and bench.reward == "math_accuracy" and len(bench) == 2
    assert bench.records[0]["answer"] == "2" and bench.records[1]["answer"] == "5"
    assert bench.records[0]["prompt"][0]["content"] == "What is 1+1?\n" + MATH_INSTRUCTION
    assert bench.records[1]["id"] == "1" and bench.records[1]["level"] == 2
    assert set(bench.gold_columns) == {"answer", "level"}
    # default columns
    path2 = _write_jsonl(tmp_path / "plain.jsonl", [{"question": "Q?", "answer": 3, "id": "a"}])
    b2 = load_benchmark(path2, limit=5)
    assert b2.records == [{"id": "a", "prompt": [{"role": "user", "content": "Q?\n" + MATH_INSTRUCTION}], "answer": "3"}]
    # another reward: the question is sent verbatim
    b3 = load_benchmark(path2, reward="countdown")
    assert b3.reward == "countdown" and b3.records[0]["prompt"][0]["content"] == "Q?"


def test_local_missing_column_names_the_columns(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"problem": "P", "final": "1"}])
    with pytest.raises(EvalError) as err:
        load_benchmark(path)
    msg = str(err.value)
    assert "'question'" in msg and "problem" in msg and "final" in msg and "\n" not in msg
    with pytest.raises(EvalError, match="'answer'.*problem, final"):
        load_benchmark(path, question_column="problem")
    assert load_benchmark(path, question_column="problem", answer_column="final").records[0]["answer"] == "1"


def test_local_json_and_parquet(tmp_path):
    rows = [{"question": "a?", "answer": "1"}, {"question": "b?", "answer": "2"}]
    (tmp_path / "l.json").write_text(json.dumps(rows))
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "c.json").write_text(json.dumps({"question": ["a?", "b?"], "answer": ["1", "2"]}))
    for name in ("l.json", "d.json", "c.json"):
        bench = load_benchmark(tmp_path / name)
        assert [r["answer"] for r in bench.records] == ["1", "2"], name
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    bench = load_benchmark(tmp_path / "t.parquet")
    assert bench.name == "t" and [r["answer"] for r in bench.records] == ["1", "2"]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(EvalError, match="invalid JSON"):
        load_benchmark(tmp_path / "bad.json")
    (tmp_path / "t.csv").write_text("question,answer\n")
    with pytest.raises(EvalError, match="unsupported file type"):
        load_benchmark(tmp_path / "t.csv")


def test_describe_all():
    text = describe()
    for name in EXPECTED:
        assert text.count(f"{name}:") >= 1
    with pytest.raises(EvalError):
        describe("nope")
