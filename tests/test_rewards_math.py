"""math_accuracy: extraction, gold handling, math-verify equivalence, threads and timeouts."""

import json
import threading
import time
from pathlib import Path

import pytest

from exploration_trl.rewards import math_accuracy, pop_failure_counts
from exploration_trl.rewards.math import (
    extract_final_answer,
    last_boxed_content,
    normalize_gold_answer,
)

BENCH = Path(__file__).resolve().parents[1] / "exploration_trl" / "data" / "benchmarks"


def conv(text):
    return [{"role": "assistant", "content": text}]


def test_last_boxed_balanced_braces_and_fbox():
    text = "first \\boxed{1} then \\boxed{\\frac{a}{b}} and \\fbox{\\sqrt{2}} end"
    assert last_boxed_content(text) == "\\sqrt{2}"
    assert last_boxed_content("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed_content("\\boxed{2} and unterminated \\boxed{3") == "2"
    assert last_boxed_content("nothing here") is None


def test_extract_final_answer_order():
    assert extract_final_answer("The answer is 7. Actually \\boxed{8}")[1] == ["\\boxed{8}"]
    kind, cands = extract_final_answer("The answer is 5.\nNo wait, the answer is 6.")
    assert kind == "answer_is" and cands[0] == "6"
    assert extract_final_answer("I computed 42 in the end.") is None


def test_boxed_fraction_vs_decimal_gold():
    assert math_accuracy(["So we get \\boxed{\\frac{1}{2}}."], answer=["0.5"]) == [1.0]
    assert math_accuracy(["So we get \\boxed{\\frac{1}{3}}."], answer=["0.5"]) == [0.0]


def test_plain_and_conversational():
    completions = ["The answer is 42.", conv("The answer is 42."), conv("The answer is 41."), "\\boxed{42}"]
    assert math_accuracy(completions, answer=["42"] * 4) == [1.0, 1.0, 0.0, 1.0]


def test_no_final_answer_scores_zero_even_if_number_present():
    # math-verify would find the 42 in the text; we deliberately don't fall back to that
    assert math_accuracy(["I think it is 42"], answer=["42"]) == [0.0]


def test_gold_forms():
    golds = ["025", 27.0, "\\frac{1}{2}", "Some work here\n#### 1,234", 1234, "\\left( 3, \\frac{\\pi}{2} \\right)"]
    preds = [
        "\\boxed{25}",
        "\\boxed{27}",
        "\\boxed{0.5}",
        "\\boxed{1234}",
        "The answer is 1,234.",
        "\\boxed{(3, \\frac{\\pi}{2})}",
    ]
    assert math_accuracy(preds, answer=golds) == [1.0] * 6
    wrong = [
        "\\boxed{26}",
        "\\boxed{28}",
        "\\boxed{0.25}",
        "\\boxed{1233}",
        "The answer is 1,235.",
        "\\boxed{(3, \\pi)}",
    ]
    assert math_accuracy(wrong, answer=golds) == [0.0] * 6


def test_gsm8k_records():
    rows = [json.loads(line) for line in (BENCH / "gsm8k_test.jsonl").read_text().splitlines()[:5]]
    finals = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
    good = [f"Step by step... so the answer is \\boxed{{{f}}}" for f in finals]
    bad = [f"\\boxed{{{int(f.replace(',', '')) + 1}}}" for f in finals]
    answers = [row["answer"] for row in rows]
    assert math_accuracy(good, answer=answers) == [1.0] * 5
    assert math_accuracy(bad, answer=answers) == [0.0] * 5


def test_unparseable_gold_gives_none():
    pop_failure_counts()
    golds = ["", None, "\\text{}", "#### ", "42"]
    assert math_accuracy(["\\boxed{1}"] * 5, answer=golds) == [None, None, None, None, 0.0]
    assert normalize_gold_answer("#### 1,234") == "$1234$"


def test_malformed_completions_counted_not_raised():
    pop_failure_counts()
    assert math_accuracy([None, 12, [], "\\boxed{3}"], answer=["3"] * 4) == [0.0, 0.0, 0.0, 1.0]
    assert pop_failure_counts() == {"math_accuracy": 3}


def test_other_answer_column():
    sols = ["... so $x = \\boxed{4}$", "#### 9"]
    assert math_accuracy(["\\boxed{4}", "\\boxed{9}"], answer_column="solution", solution=sols) == [1.0, 1.0]


def test_missing_answer_column_is_a_config_error():
    with pytest.raises(ValueError):
        math_accuracy(["\\boxed{1}"])


def test_main_thread_timeout_is_enforced():
    pop_failure_counts()
    start = time.monotonic()
    # sympy works on this for minutes without a time limit
    rewards = math_accuracy(["\\boxed{9^{9^{9}}}", "\\boxed{5}"], answer=["5", "5"], timeout=1.0)
    elapsed = time.monotonic() - start
    assert rewards == [0.0, 1.0]
    assert elapsed < 6.0
    assert pop_failure_counts() == {"math_accuracy": 1}


def test_works_outside_the_main_thread_with_timeout():
    pop_failure_counts()
    out = {}

    def run():
        try:
            start = time.monotonic()
            out["rewards"] = math_accuracy(
                ["\\boxed{\\frac{1}{2}}", conv("The answer is 42"), "\\boxed{7}", "\\boxed{9^{9^{9}}}"],
                answer=["0.5", "#### 42", "8", "5"],
                timeout=1.0,
            )
            out["elapsed"] = time.monotonic() - start
        except BaseException as exc:  # pragma: no cover - reported below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in out, out.get("error")
    assert out["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert out["elapsed"] < 30.0  # worker start-up (sympy import) + one 1 s timeout
    assert pop_failure_counts() == {"math_accuracy": 1}
