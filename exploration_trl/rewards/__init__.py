"""Verifiable reward functions with TRL's reward signature.

Every reward is ``func(completions, **columns) -> list[float | None]``, works on plain-text and
conversational completions, ignores the extra keyword arguments TRL passes (``prompts``,
``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``, other dataset columns) and
never raises because of a bad completion: unscorable completions get 0.0 (None when the
reference answer is unusable) and are counted, see :func:`pop_failure_counts`.

Registered rewards (``get_reward(name, **options)``, ``list_rewards()``):

===================== =========================================================================
``math_accuracy``     math-verify equivalence of the last ``\\boxed{}`` / "the answer is" with ``answer``
``countdown``         Countdown equations (``nums``, ``target``); ``format_score`` partial credit
``code_execution``    HumanEval-style ``test``/``entry_point`` run in a sandboxed subprocess
``format``            regex / preset format check (factory: ``pattern``, ``preset``)
``length_penalty``    DAPO soft overlong penalty (factory)
``repetition_penalty`` repeated n-gram penalty (factory)
===================== =========================================================================

A completion is *correct* when its total reward is above a threshold (:func:`is_correct`, the one definition the
trainers and ``exploration-trl eval`` share).
"""

from exploration_trl.rewards.base import (
    DEFAULT_CORRECT_THRESHOLD,
    RewardFunctionError,
    completion_to_text,
    is_correct,
    missing_columns,
    naming_errors,
    peek_failure_counts,
    pop_failure_counts,
    pop_outcomes,
    record_failure,
    record_outcomes,
    reward_factory,
    reward_range,
)
from exploration_trl.rewards.code import (
    code_execution,
    make_code_execution,
    run_in_sandbox,
)
from exploration_trl.rewards.countdown import countdown, make_countdown
from exploration_trl.rewards.format import format_reward, make_format_reward
from exploration_trl.rewards.math import math_accuracy
from exploration_trl.rewards.registry import REWARDS, get_reward, list_rewards, register_reward, resolve_rewards
from exploration_trl.rewards.shaping import make_length_penalty, make_repetition_penalty

__all__ = [
    "DEFAULT_CORRECT_THRESHOLD",
    "REWARDS",
    "RewardFunctionError",
    "code_execution",
    "completion_to_text",
    "countdown",
    "format_reward",
    "get_reward",
    "is_correct",
    "list_rewards",
    "make_code_execution",
    "make_countdown",
    "pop_outcomes",
    "record_outcomes",
    "make_format_reward",
    "make_length_penalty",
    "make_repetition_penalty",
    "math_accuracy",
    "missing_columns",
    "naming_errors",
    "peek_failure_counts",
    "pop_failure_counts",
    "record_failure",
    "register_reward",
    "resolve_rewards",
    "reward_factory",
    "reward_range",
    "run_in_sandbox",
]
