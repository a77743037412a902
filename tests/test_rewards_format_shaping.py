"""format, length_penalty and repetition_penalty."""

import re

import pytest

from exploration_trl.rewards import get_reward, make_format_reward, pop_failure_counts
from exploration_trl.rewards.shaping import (
    make_length_penalty,
    make_repetition_penalty,
    soft_overlong_penalty,
)


def conv(text):
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_think_answer_format():
    fmt = get_reward("format")
    good = "<think>\nsome reasoning\n</think>\n<answer>42</answer>"
    cases = [
        good,
        conv(good),
        "<answer>42</answer>",  # no think
        "<think>x</think>",  # no answer
        "preamble <think>x</think><answer>1</answer>",  # text before
        "<think>x</think><answer>1</answer> trailing text",  # text after
        "<answer>1</answer><think>x</think>",  # wrong order
    ]
    assert fmt(cases) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_boxed_preset_exactly_one_balanced():
    fmt = make_format_reward(preset="boxed")
    assert fmt(
        ["so \\boxed{\\frac{1}{2}}.", "\\boxed{1} or \\boxed{2}", "no box", "\\boxed{unbalanced", conv("\\boxed{3}")]
    ) == [
        1.0,
        0.0,
        0.0,
        0.0,
        1.0,
    ]


def test_format_and_accuracy_read_one_box_syntax():
    """`\\fbox{3}` is graded (math_accuracy reads \\boxed and \\fbox) and passes the boxed format check; a completion
    with one box passes the format check exactly when the grader reads its answer from that box."""
    from exploration_trl.rewards import math_accuracy
    from exploration_trl.rewards.math import extract_final_answer

    fmt = make_format_reward(preset="boxed")
    assert math_accuracy(["so \\fbox{3}."], answer=["3"]) == [1.0]
    assert fmt(["so \\fbox{3}.", "so \\fbox {3}.", "\\fbox{3} and \\boxed{3}", "\\fbox 3", "\\fbox{3"]) == [
        1.0, 1.0, 0.0, 0.0, 0.0]
    texts = ["\\boxed{1}", "\\fbox{1}", "\\boxed {1}", "\\boxed 1", "\\fbox 1", "\\mbox{1}", "\\boxed{\\frac{1}{2}}",
             "\\framebox{1}", "the answer is 1"]
    read = [(extract_final_answer(t) or ("none",))[0] == "boxed" for t in texts]
    assert read == [True, True, True, False, False, False, True, False, False]
    assert fmt(texts) == [float(r) for r in read]


def test_custom_pattern_and_errors():
    fmt = make_format_reward(pattern=r"ANSWER: \d+", flags=0)
    assert fmt(["ANSWER: 12", "answer: 12", "ANSWER: 12\nmore"]) == [1.0, 0.0, 0.0]
    fmt_i = make_format_reward(pattern=r"answer: \d+", flags=re.IGNORECASE)
    assert fmt_i(["ANSWER: 7"]) == [1.0]
    with pytest.raises(ValueError, match="preset"):
        make_format_reward(preset="nope")
    with pytest.raises(ValueError):
        make_format_reward(pattern="x", preset="boxed")


def test_format_malformed_counted():
    pop_failure_counts()
    assert get_reward("format")([None, {"bad": 1}, 3.5]) == [0.0, 0.0, 0.0]
    assert pop_failure_counts() == {"format": 2}  # a dict without content reads as empty text


def test_soft_overlong_penalty_values():
    # L_max = 100, buffer 20: free up to 80, linear to -1 at 100, then -1
    assert soft_overlong_penalty(80, 100, 20) == 0.0
    assert soft_overlong_penalty(90, 100, 20) == pytest.approx(-0.5)
    assert soft_overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert soft_overlong_penalty(500, 100, 20, penalty=0.5) == pytest.approx(-0.5)


def test_length_penalty_chars_and_tokens():
    lp = make_length_penalty(max_length=10, buffer_length=4)
    assert lp(["a" * 6, "a" * 8, "a" * 30, conv("a" * 6)]) == pytest.approx([0.0, -0.5, -1.0, 0.0])
    # tokens win when TRL passes completion_ids
    assert lp(["short"], completion_ids=[list(range(12))]) == [-1.0]
    assert make_length_penalty(max_length=10, buffer_length=4, unit="chars")(
        ["short"], completion_ids=[list(range(12))]
    ) == [0.0]
    with pytest.raises(ValueError):
        make_length_penalty(max_length=10, unit="tokens")(["x"])
    with pytest.raises(ValueError):
        make_length_penalty(max_length=10, buffer_length=20)
    pop_failure_counts()
    assert lp([None]) == [0.0]
    assert pop_failure_counts() == {"length_penalty": 1}


def test_repetition_penalty():
    rp = make_repetition_penalty(ngram_size=2, max_penalty=-1.0)
    distinct = "the quick brown fox jumps"
    looped = "go on go on go on go on"  # 7 bigrams, 2 distinct
    assert rp([distinct, looped, "one", conv(looped)]) == pytest.approx([0.0, -5 / 7, 0.0, -5 / 7])
    assert make_repetition_penalty(ngram_size=2, max_penalty=-0.5)([looped]) == pytest.approx([-2.5 / 7])
    tok = make_repetition_penalty(ngram_size=1, unit="tokens")
    assert tok(["ignored"], completion_ids=[[1, 1, 1, 1]]) == pytest.approx([-0.75])
    with pytest.raises(ValueError):
        make_repetition_penalty(max_penalty=0.5)
    pop_failure_counts()
    assert rp([12]) == [0.0]
    assert pop_failure_counts() == {"repetition_penalty": 1}
