"""countdown: safe parsing, number usage, exact arithmetic and partial credit."""

import json
import time
from fractions import Fraction
from pathlib import Path

import pytest

from exploration_trl.rewards import countdown, make_countdown, pop_failure_counts
from exploration_trl.rewards.countdown import (
    EquationError,
    EvaluationError,
    evaluate_equation,
    extract_equation,
)

BENCH = Path(__file__).resolve().parents[1] / "exploration_trl" / "data" / "benchmarks"
NUMS, TARGET = "30,100,93", "23"  # first record of countdown_cd3_test.jsonl
partial = make_countdown(format_score=0.1)


def score(text, nums=NUMS, target=TARGET, reward=countdown):
    return reward([text], nums=[nums], target=[target])[0]


def test_correct_plain_and_conversational():
    assert score("<think>try</think><answer>100 - 93 + 30 - 14</answer>", nums=[30, 100, 93, 14], target=23) == 1.0
    assert score("<answer>30 - (100 - 93)</answer>") == 1.0
    assert countdown(
        [[{"role": "assistant", "content": "<answer>30 - (100 - 93)</answer>"}]], nums=[[30, 100, 93]], target=[23]
    ) == [1.0]


def test_wrong_value():
    assert score("<answer>30 + 100 - 93</answer>") == 0.0
    assert score("<answer>30 + 100 - 93</answer>", reward=partial) == pytest.approx(0.1)


def test_number_reused_or_missing_or_extra():
    assert score("<answer>30 - (100 - 93) + 30 - 30</answer>") == 0.0  # 30 used three times
    assert score("<answer>(100 - 93) * 3 + 2</answer>", target="23") == 0.0  # 30 missing, 3 and 2 extra
    assert score("<answer>100 - 93 + 16</answer>") == 0.0  # 30 missing
    # partial credit for a well-formed equation with the wrong numbers
    assert score("<answer>100 - 93 + 16</answer>", reward=partial) == pytest.approx(0.1)


def test_duplicate_numbers_must_each_be_used():
    assert score("<answer>90 - 90 + 43</answer>", nums="90,43,90", target="43") == 1.0
    assert score("<answer>90 - 47</answer>", nums="90,43,90", target="43") == 0.0


def test_exact_fractions():
    assert score("<answer>(1 + 1/3) * 3</answer>", nums=[1, 1, 3, 3], target=4) == 1.0
    assert evaluate_equation("7 / 3")[0] == Fraction(7, 3)


def test_power_and_huge_inputs_rejected_fast():
    start = time.monotonic()
    assert score("<answer>9**9**9</answer>", nums=[9, 9, 9], target=9) == 0.0
    assert score("<answer>9**9**9</answer>", nums=[9, 9, 9], target=9, reward=partial) == 0.0
    assert score("<answer>" + "9" * 5000 + "</answer>", nums=[9], target=9) == 0.0
    assert score("<answer>999999999999 * 999999999999 * 999999999999 * 999999999999</answer>") == 0.0
    assert time.monotonic() - start < 1.0
    with pytest.raises(EquationError):
        evaluate_equation("2 ** 3")


def test_division_by_zero_is_zero():
    pop_failure_counts()
    assert score("<answer>30 / (100 - 100) + 93</answer>", nums="30,100,100,93", target="23") == 0.0
    assert score("<answer>30 / (100 - 100) + 93</answer>", nums="30,100,100,93", target="23", reward=partial) == 0.0
    with pytest.raises(EvaluationError):
        evaluate_equation("1 / (2 - 2)")
    assert pop_failure_counts() == {}


def test_deep_parentheses():
    deep = "(" * 1000 + "30" + ")" * 1000
    start = time.monotonic()
    assert score(f"<answer>{deep} - (100 - 93)</answer>") == 0.0
    assert score(f"<answer>{deep}</answer>", reward=partial) == 0.0
    assert time.monotonic() - start < 1.0
    assert score("<answer>((((30)))) - (100 - 93)</answer>") == 1.0


def test_code_injection_rejected():
    for bad in [
        "__import__('os').system('echo hi')",
        "abs(-23)",
        "[30, 100, 93]",
        "30 if 1 else 2",
        "-(93 - 100) + 30 - 14",
    ]:
        assert score(f"<answer>{bad}</answer>", reward=partial) == 0.0


def test_answer_tag_vs_last_line():
    # the last <answer> block wins over everything else
    text = "<answer>1 + 2</answer> more thinking <answer>30 - (100 - 93)</answer>\n30 + 100 - 93"
    assert extract_equation(text) == "30 - (100 - 93)"
    assert score(text) == 1.0
    # without a tag: last non-empty line, with a trailing "= target" removed
    text = "Let me think.\n30 - (100 - 93) = 23\n\n"
    assert extract_equation(text) == "30 - (100 - 93)"
    assert score(text) == 1.0
    assert score("30 - (100 - 93) = 23\nSo that is my answer.") == 0.0  # last line is prose
    assert score("Answer: $30 - (100 - 93)$.") == 1.0
    assert score("30 × (100 − 93) ÷ 30 + 16", nums="30,100,93,30,16", target="23") == 1.0


def test_malformed_inputs_never_raise():
    pop_failure_counts()
    out = countdown(
        ["", None, "<answer></answer>", "\n\n", "<answer>30 - (100 - 93)"], nums=[NUMS] * 5, target=[TARGET] * 5
    )
    assert out == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert pop_failure_counts() == {"countdown": 1}  # only the None completion is unscorable
    assert countdown(["<answer>1+2</answer>"], nums=["a,b"], target=["3"]) == [None]
    assert countdown(["<answer>1+2</answer>"], nums=["1,2"], target=["three"]) == [None]
    assert pop_failure_counts() == {"countdown": 2}


def test_shipped_file_formats():
    rows = [json.loads(line) for line in (BENCH / "countdown_cd3_test.jsonl").read_text().splitlines()[:3]]
    # d1 files use input/output columns; solutions worked out by hand for the first three rows
    sols = ["<answer>30 - (100 - 93)</answer>", "<answer>18 - (83 - 75)</answer>", "<answer>41 - (76 - 59)</answer>"]
    inputs, outputs = [r["input"] for r in rows], [r["output"] for r in rows]
    assert countdown(sols, input=inputs, output=outputs) == [1.0, 1.0, 1.0]
    assert countdown(sols[::-1], input=inputs, output=outputs) == [0.0, 1.0, 0.0]
    assert countdown(["<answer>83 - 75 + 18 / 9</answer>"], input=["83,18,75,9"], output=["10"]) == [1.0]
