"""Registry, failure accounting and completion handling shared by all rewards."""

import functools

import pytest

from exploration_trl import rewards as R
from exploration_trl.rewards import (
    REWARDS,
    completion_to_text,
    get_reward,
    list_rewards,
    pop_failure_counts,
    resolve_rewards,
)

EXPECTED = ["code_execution", "countdown", "format", "length_penalty", "math_accuracy", "repetition_penalty"]


def _trl_name(func):
    # how TRL (trainer/utils.get_callable_name) names a reward function
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def test_registered_names():
    assert list_rewards() == EXPECTED
    assert sorted(REWARDS) == EXPECTED


def test_plain_function_returned_as_is():
    assert get_reward("countdown") is R.countdown
    assert get_reward("math_accuracy") is R.math_accuracy


def test_kwargs_bound_with_partial_and_name_kept():
    reward = get_reward("countdown", format_score=0.1)
    assert isinstance(reward, functools.partial)
    assert reward.__name__ == "countdown" and _trl_name(reward) == "countdown"
    # well-formed but wrong equation gets the bound partial credit
    assert reward(["<answer>30 + 100 - 93</answer>"], nums=["30,100,93"], target=["23"]) == [0.1]
    assert get_reward("countdown")(["<answer>30 + 100 - 93</answer>"], nums=["30,100,93"], target=["23"]) == [0.0]


def test_factories_called_with_kwargs():
    fmt = get_reward("format", preset="boxed")
    assert _trl_name(fmt) == "format"
    assert fmt(["so \\boxed{3}", "no box"]) == [1.0, 0.0]
    lp = get_reward("length_penalty", max_length=10, buffer_length=5)
    assert _trl_name(lp) == "length_penalty"
    assert lp(["a" * 5, "a" * 20]) == [0.0, -1.0]
    rp = get_reward("repetition_penalty")
    assert _trl_name(rp) == "repetition_penalty"


def test_unknown_name_error_lists_known_and_dotted_paths():
    with pytest.raises(ValueError) as info:
        get_reward("foo")
    message = str(info.value)
    assert "\n" not in message
    assert "'foo'" in message
    for name in EXPECTED:
        assert name in message
    assert "dotted path" in message


def test_unknown_option_rejected():
    with pytest.raises(ValueError, match="formt_score"):
        get_reward("countdown", formt_score=0.1)
    with pytest.raises(ValueError, match="max_lenght"):
        get_reward("length_penalty", max_lenght=3)


def test_dotted_path_import_and_bind():
    func = get_reward("exploration_trl.rewards.countdown.make_countdown")
    assert func is R.make_countdown
    reward = get_reward("exploration_trl.rewards.shaping.soft_overlong_penalty")
    assert reward(5, 10, 5) == 0.0
    bound = get_reward("exploration_trl.rewards.shaping.soft_overlong_penalty", max_length=10, buffer_length=5)
    assert bound(20) == -1.0
    assert _trl_name(bound) == "soft_overlong_penalty"
    with pytest.raises(ValueError, match="not_there"):
        get_reward("exploration_trl.rewards.shaping.not_there")
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        get_reward("no_such_module_xyz.func")


def test_resolve_rewards_validates_kwargs_keys():
    funcs = resolve_rewards(["countdown", "format"], {"countdown": {"format_score": 0.2}})
    assert [_trl_name(f) for f in funcs] == ["countdown", "format"]
    assert funcs[0](["<answer>1 + 2</answer>"], nums=[[30, 100, 93]], target=[23]) == [0.2]
    with pytest.raises(ValueError, match="'fromat'"):
        resolve_rewards(["countdown", "format"], {"fromat": {"preset": "boxed"}})
    assert resolve_rewards(["math_accuracy"], None) == [R.math_accuracy]


def test_completion_to_text_forms():
    assert completion_to_text("plain") == "plain"
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "t"}]
    assert completion_to_text(conv) == "a1"
    assert (
        completion_to_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
        )
        == "xy"
    )
    with pytest.raises((TypeError, ValueError)):
        completion_to_text(42)
    with pytest.raises((TypeError, ValueError)):
        completion_to_text([])


def test_failure_counter_increments_and_resets():
    pop_failure_counts()
    fmt = get_reward("format")
    assert fmt([None, 7, "<think>a</think><answer>b</answer>"]) == [0.0, 0.0, 1.0]
    assert R.countdown([123], nums=["1,2"], target=["3"]) == [0.0]
    assert R.countdown(["<answer>1+2</answer>"], nums=["not numbers"], target=["3"]) == [None]
    counts = pop_failure_counts()
    assert counts == {"format": 2, "countdown": 2}
    assert pop_failure_counts() == {}


def test_rewards_accept_trl_kwargs():
    logged = []
    extra = dict(
        prompts=["p"],
        completion_ids=[[1, 2, 3]],
        trainer_state=object(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda name, value: logged.append((name, value)),
        some_other_column=["x"],
    )
    assert R.countdown(["<answer>100 - 93 + 30</answer>"], nums=[[30, 100, 93]], target=[37], **extra) == [1.0]
    assert get_reward("format")(["<think>x</think> <answer>y</answer>"], **extra) == [1.0]
    assert get_reward("length_penalty", max_length=2, buffer_length=1)(["abc"], **extra) == [-1.0]
    assert get_reward("repetition_penalty", ngram_size=1)(["a a a a"], **extra) == [-0.75]
    assert R.math_accuracy(["\\boxed{2}"], answer=["2"], **extra) == [1.0]
