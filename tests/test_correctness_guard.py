"""The warning when a method's correct/wrong split never splits a group (`trainers/callbacks/correctness_guard.py`): a
graded reward above `correct_reward_threshold` makes every completion correct, and Pass@k Training then learns
nothing."""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import pytest
import torch

import exploration_trl as et
from exploration_trl.trainers.callbacks.correctness_guard import CorrectnessGuard, group_flags
from helpers import binary_reward, toy_checkpoint, train

KEY = "correct_reward_threshold"


def length_reward(completions, **kwargs):
    """Graded and always far above the default threshold (0): about 48 for the toy's completions."""
    return [40.0 + len(c) for c in completions]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def test_group_flags_hand_numbers():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0,  # mixed: correct and wrong
                      0.5, 0.5, 0.5, 0.5,  # all correct, rewards equal
                      0.2, 0.9, float("nan"), 0.4])  # all correct (the NaN row is left out), rewards differ
    # (mixed, varied, some correct, some wrong)
    assert group_flags(r, r > 0, 4).tolist() == [True, True, True, True]
    assert group_flags(r[4:], r[4:] > 0, 4).tolist() == [False, True, True, False]
    assert group_flags(r[4:8], r[4:8] > 0, 4).tolist() == [False, False, True, False]
    assert group_flags(r[8:], r[8:] > 0.95, 4).tolist() == [False, True, False, True]
    one = torch.tensor([0.3, float("nan")])  # a single scored row cannot vary
    assert group_flags(one, one > 0, 2).tolist() == [False, False, True, False]


def _fake_trainer():
    return SimpleNamespace(is_world_process_zero=lambda: True)


def _event(guard, event="on_log", threshold=0.0, step=1):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(guard, event)(SimpleNamespace(correct_reward_threshold=threshold), SimpleNamespace(global_step=step),
                              None)
    return [str(w.message) for w in caught]


GRADED = torch.tensor([48.0, 47.0, 50.0, 48.0])


def test_all_correct_is_said_at_the_first_logging_step_once():
    guard = CorrectnessGuard(_fake_trainer())
    guard.update(GRADED, GRADED > 0, 4, "passk", "it learns nothing")
    guard.update(GRADED, GRADED > 0, 4, "passk", "it learns nothing")
    assert isinstance(guard.flags, torch.Tensor) and not guard.decided  # still on the device, unread
    messages = _event(guard, step=2)
    assert len(messages) == 1 and "correct_reward_threshold=0.0 splits no group: up to step 2" in messages[0]
    assert "every completion was judged correct" in messages[0] and "it learns nothing" in messages[0]
    assert guard.decided and _event(guard) == [] and _event(guard, "on_train_end") == []  # once


def test_all_wrong_with_varying_rewards_is_said_only_at_the_end():
    """Partial credit below a right threshold (0.5): a hard task's start looks so, so no warning while training."""
    guard = CorrectnessGuard(_fake_trainer())
    formatted = torch.tensor([0.1, 0.0, 0.1, 0.1])
    guard.update(formatted, formatted > 0.5, 4, "passk", "x")
    assert _event(guard, threshold=0.5) == [] and not guard.decided
    messages = _event(guard, "on_train_end", threshold=0.5, step=9)
    assert len(messages) == 1 and "up to step 9 no group mixed correct and wrong" in messages[0]


def test_guard_stays_quiet_once_a_group_mixed_and_while_nothing_varied():
    guard = CorrectnessGuard(_fake_trainer())
    zeros = torch.zeros(4)
    guard.update(zeros, zeros > 0, 4, "passk", "x")  # all wrong on a 0/1 reward: no reward varied, nothing to say
    assert _event(guard) == [] and _event(guard, "on_train_end") == [] and not guard.decided
    binary = torch.tensor([1.0, 0.0, 0.0, 1.0])
    guard.update(binary, binary > 0, 4, "passk", "x")
    assert _event(guard) == [] and guard.decided
    guard.update(GRADED, GRADED > 0, 4, "passk", "x")  # later all-alike batches: the threshold has split groups
    assert _event(guard) == [] and _event(guard, "on_train_end") == []


def test_passk_with_a_graded_reward_warns_once_with_the_key(ckpt, tmp_path, caplog):
    """The issue's run through the Python API: a length reward (~48) makes every completion correct, every
    advantage 0 and the loss 0; training says so, once, in a warning and in the log, naming the key."""
    cls = et.get_trainer_class("passk")
    with caplog.at_level(logging.WARNING, logger="exploration_trl.trainers.callbacks.correctness_guard"), \
            pytest.warns(UserWarning, match=KEY) as record:
        trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=length_reward, passk_k=2)
    ours = [w for w in record if "splits no group" in str(w.message)]
    assert len(ours) == 1 and "Pass@k Training's advantages are all 0" in str(ours[0].message)
    assert sum(KEY in r.getMessage() for r in caplog.records) == 1
    assert all(e["grad_norm"] == 0.0 for e in trainer.state.log_history if "grad_norm" in e)


def test_passk_with_a_binary_reward_does_not_warn(ckpt, tmp_path):
    cls = et.get_trainer_class("passk")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=binary_reward, passk_k=2)
    assert not [w for w in caught if "splits no group" in str(w.message)]
    # Not vacuous: some group did mix right and wrong completions.
    assert min(e["frac_reward_zero_std"] for e in trainer.state.log_history if "frac_reward_zero_std" in e) < 1


@pytest.mark.parametrize("method, extra, effect", [
    ("dsgrpo", {}, "DS-GRPO gives every completion the same side"),
    ("progrpo", {}, "ProGRPO's skip rule leaves every group as GRPO's"),
    ("progrpo", {"progrpo_skip_groups": "all_wrong"}, "shifts every group when all are judged correct"),
    ("unlikely", {"unlikely_rank_among": "correct"}, "the unlikeliness rank among correct completions"),
])
def test_every_method_that_judges_correctness_warns(method, extra, effect, ckpt, tmp_path):
    cls = et.get_trainer_class(method)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cls, cls.config_class, ckpt, tmp_path, reward=length_reward, max_steps=2, **extra)
    ours = [str(w.message) for w in caught if "splits no group" in str(w.message)]
    assert len(ours) == 1 and effect in ours[0] and KEY in ours[0]
