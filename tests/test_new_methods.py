"""The 0.8.0 methods in the trainer: maxrl, wreinforce, qae, entropy_adv and outcome_explore.

* The advantages each one hands TRL's loss are its core function of the batch (read back from `debug_rollout_dir`),
  and, on rewards fixed by row, the numbers worked by hand (a wrong sign or normalisation fails them).
* outcome_explore's answer counts: the bonus of a batch uses the counts before it, and the counts grow per prompt.
* entropy_adv changes the loss's advantages for one call only (the rollout's are put back).
* Each one says so, once, when it does nothing on a step; each one-line config error names the key.
* They compose with a method of the other side; they train from `exploration-trl train`.

Equivalence to TRL at zero coefficients (entropy_adv, outcome_explore) is in tests/test_equivalence.py; exact resume,
DDP and the sync budget in tests/test_resume.py, tests/test_multiprocess.py and tests/test_sync_budget.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import exploration_trl as et
from exploration_trl.core import bonuses, estimators
from exploration_trl.errors import NoOutcomeError
from exploration_trl.methods import trainer_name
from exploration_trl.rewards import record_outcomes
from helpers import binary_reward, letter_reward, max_param_diff, toy_checkpoint, train


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def dumps(folder: Path) -> list[dict]:
    return [torch.load(p) for p in sorted(Path(folder).glob("rollout*_rank0.pt"))]


def run(method, ckpt, tmp_path, reward=letter_reward, **kwargs):
    cls = et.get_trainer_class(method)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = train(cls, cls.config_class, ckpt, tmp_path / "out", reward=reward,
                        debug_rollout_dir=str(tmp_path / "rollouts"), **kwargs)
    return trainer, dumps(tmp_path / "rollouts"), [str(w.message) for w in caught]


def half_right(completions, **kwargs):
    """0/1 by the parity of the completion's character codes: right about half the time, so groups mix."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


#: Rewards fixed by the row's place in the batch, groups of 4: one right of four, then three right of four.
PATTERN = (1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0)


def pattern_reward(completions, **kwargs):
    """`PATTERN` by row; the final answers (outcome_explore) are "p", "q", "p" and none in each group of 4."""
    record_outcomes("pattern_reward", [("p", "q", "p", None)[i % 4] for i in range(len(completions))])
    return [PATTERN[i % 8] for i in range(len(completions))]


#: GRPO's (TRL's) advantages of `PATTERN`: Bessel std 0.5 in both groups, eps 1e-4: 0.75 / 0.5001, 0.25 / 0.5001.
GRPO_PATTERN = [0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [0.25 / 0.5001] * 3 + [-0.75 / 0.5001]
#: MaxRL's, (r - mean) / (mean + 1e-6): group means 1/4 and 3/4.
MAXRL_PATTERN = [0.75 / 0.250001] + [-0.25 / 0.250001] * 3 + [0.25 / 0.750001] * 3 + [-0.75 / 0.750001]
#: 1 / (Bessel std 0.5 + 1e-4): QAE's only non-zero magnitude on `PATTERN`.
QAE_UNIT = 1 / 0.5001


# ------------------------------------------------------------------------------- the advantages the loss sees
@pytest.mark.parametrize("method, options, expected", [
    ("maxrl", {}, lambda r, g: estimators.maxrl_advantages(r > 0, g)),
    ("wreinforce", {"wreinforce_lambda": 0.3},
     lambda r, g: estimators.weighted_reinforce_advantages(r > 0, positive_weight=0.3)),
    ("wreinforce", {"wreinforce_mode": "nsr"},
     lambda r, g: estimators.weighted_reinforce_advantages(r > 0, mode="nsr")),
    ("qae", {"qae_k": 0.6}, lambda r, g: estimators.quantile_advantages(r, g, k=0.6)),
])
def test_advantages_are_the_core_function_of_the_batch(method, options, expected, ckpt, tmp_path):
    trainer, batches, _ = run(method, ckpt, tmp_path, reward=half_right, max_steps=3, **options)
    assert len(batches) == 3
    for b in batches:
        assert_close(b["final_advantages"], expected(b["rewards"], b["num_generations"]))
    assert any((b["final_advantages"] != b["advantages"]).any() for b in batches)  # not GRPO's


@pytest.mark.parametrize("method, options, expected", [
    ("maxrl", {}, MAXRL_PATTERN),  # 2.999988, -0.999996; 0.333333, -0.999999
    ("wreinforce", {"wreinforce_lambda": 0.3}, [0.3, -1, -1, -1, 0.3, 0.3, 0.3, -1]),
    ("wreinforce", {"wreinforce_mode": "nsr"}, [0, -1, -1, -1, 0, 0, 0, -1]),
    ("wreinforce", {"wreinforce_mode": "psr"}, [1, 0, 0, 0, 1, 1, 1, 0]),
    # K = 0.4: the 2nd smallest of 4, 0 in [1,0,0,0] (only the right one moves, up) and 1 in [1,1,1,0] (only the wrong
    # one, down); K = 0.8: the 4th smallest, 1 in both.
    ("qae", {}, [QAE_UNIT, 0, 0, 0, 0, 0, 0, -QAE_UNIT]),
    ("qae", {"qae_k": 0.8}, [0, -QAE_UNIT, -QAE_UNIT, -QAE_UNIT, 0, 0, 0, -QAE_UNIT]),
    # qae_eps: the authors' code's 1e-6 instead of TRL's 1e-4 (the default, QAE_UNIT = 1 / 0.5001): 1 / 0.500001.
    ("qae", {"qae_eps": 1e-6}, [1 / 0.500001, 0, 0, 0, 0, 0, 0, -1 / 0.500001]),
])
def test_advantages_match_hand_worked_numbers(method, options, expected, ckpt, tmp_path):
    trainer, batches, _ = run(method, ckpt, tmp_path, reward=pattern_reward, max_steps=2,
                              per_device_train_batch_size=8, **options)
    assert len(batches) == 2
    for b in batches:
        assert b["rewards"].tolist() == list(PATTERN)
        assert_close(b["advantages"], torch.tensor(GRPO_PATTERN), rtol=0, atol=1e-5)  # what TRL computed
        assert_close(b["final_advantages"], torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-5)


def test_maxrl_differs_from_grpo_where_groups_mix(ckpt, tmp_path):
    """[1,0,0,0] -> GRPO (std 0.5): 1.4997, -0.4999; MaxRL: 2.999988, -0.999996 (twice GRPO's, the sign kept). The
    training run moves away from GRPO's."""
    trainer, batches, _ = run("maxrl", ckpt, tmp_path, reward=pattern_reward, max_steps=3,
                              per_device_train_batch_size=8)
    for b in batches:
        assert_close(b["final_advantages"], torch.tensor(MAXRL_PATTERN), rtol=0, atol=1e-5)
    ref = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path / "grpo", reward=pattern_reward,
                max_steps=3, per_device_train_batch_size=8)
    assert max_param_diff(trainer, ref) > 1e-5


def one_scored_reward(completions, **kwargs):
    """Groups of 4: one correct completion and three unscored (None), then [1, 0, 0, 0]."""
    return [(1.0, None, None, None, 1.0, 0.0, 0.0, 0.0)[i % 8] for i in range(len(completions))]


def test_maxrl_one_scored_completion_gets_zero(ckpt, tmp_path):
    # A group whose only scored completion is correct: r_hat = 1, r - r_hat = 0 (the authors' code would give a group
    # of one r / 1e-6 = 1e6). The unscored rows get 0; the mixed group beside it is unchanged.
    trainer, batches, _ = run("maxrl", ckpt, tmp_path, reward=one_scored_reward, max_steps=2,
                              per_device_train_batch_size=8)
    for b in batches:
        assert_close(b["final_advantages"], torch.tensor([0.0] * 4 + MAXRL_PATTERN[:4]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("options, text", [
    ({"loss_type": "grpo"}, "maxrl: loss_type 'grpo' divides each completion's loss by its own length"),
    ({"loss_type": "sapo"}, "maxrl: loss_type 'sapo' divides each completion's loss by its own length"),
    ({"loss_type": "bnpo", "gradient_accumulation_steps": 2},
     "maxrl: loss_type 'bnpo' divides each micro-batch's loss by that micro-batch's own token count"),
    ({"steps_per_generation": 2}, "maxrl: each rollout feeds 2 optimizer updates"),
    ({"num_iterations": 3}, "maxrl: each rollout feeds 3 optimizer updates"),
])
def test_maxrl_warns_once_where_the_paper_s_unbiasedness_does_not_hold(options, text, ckpt, tmp_path):
    _, _, messages = run("maxrl", ckpt, tmp_path, reward=pattern_reward, max_steps=2, **options)
    assert sum(text in m for m in messages) == 1, messages
    assert sum(m.startswith("maxrl: ") for m in messages) == 1, messages  # that one only


@pytest.mark.parametrize("options", [{}, {"loss_type": "dr_grpo"}, {"loss_type": "bnpo"},
                                     {"gradient_accumulation_steps": 2}])
def test_maxrl_is_quiet_on_policy_with_equal_weights(options, ckpt, tmp_path):
    # dapo (the default), dr_grpo; bnpo over a single micro-batch per step; accumulation alone is still one update.
    _, _, messages = run("maxrl", ckpt, tmp_path, reward=pattern_reward, max_steps=2, **options)
    assert not [m for m in messages if m.startswith("maxrl: ")], messages


def boundary_reward(completions, **kwargs):
    """Groups of 32: 10 correct, 15 wrong, 7 unscored (None), so 25 scored rewards."""
    return [1.0 if i % 32 < 10 else (0.0 if i % 32 < 25 else None) for i in range(len(completions))]


def test_qae_boundary_group(ckpt, tmp_path):
    # n = 25 scored, K = 0.6: ceil(15) = the 15th smallest = 0 (15 wrong), so the 10 correct completions get
    # 1 / (std + 1e-4) with std = sqrt(25/24 * 0.24) = 0.5 and the wrong ones 0. A float32 rank (0.6 * 25 > 15) took
    # the 16th, 1: the correct ones 0 and the wrong ones -2.
    trainer, batches, _ = run("qae", ckpt, tmp_path, reward=boundary_reward, max_steps=1,
                              per_device_train_batch_size=32, num_generations=32, qae_k=0.6)
    (b,) = batches
    assert_close(b["final_advantages"], torch.tensor([QAE_UNIT] * 10 + [0.0] * 22), rtol=0, atol=1e-5)


def test_qae_logs_the_share_of_zero_advantages(ckpt, tmp_path):
    # On PATTERN (K = 0.4) three of each group of four get 0 (see test_advantages_match_hand_worked_numbers): 6 of 8,
    # and one of 8 is positive.
    trainer, batches, _ = run("qae", ckpt, tmp_path, reward=pattern_reward, max_steps=3,
                              per_device_train_batch_size=8)
    logs = [e for e in trainer.state.log_history if "qae/zero_adv_frac" in e]
    assert [e["qae/zero_adv_frac"] for e in logs] == [0.75] * 3
    assert [e["qae/positive_adv_frac"] for e in logs] == [0.125] * 3
    assert [float((b["final_advantages"] == 0).float().mean()) for b in batches] == [0.75] * 3


# ----------------------------------------------------------------------------------------- outcome_explore
def same_answer_reward(completions, **kwargs):
    """Every completion answers "x" and scores its letter_reward: the bonus is then known in advance."""
    record_outcomes("same_answer_reward", ["x"] * len(completions))
    return [c.count("a") / max(len(c), 1) for c in completions]


def test_outcome_bonus_uses_the_counts_before_each_batch(ckpt, tmp_path):
    # One prompt per generation batch (batch 4 = one group of 4); the toy dataset's 8 prompts, each seen once in 8
    # batches, then again. A first visit: every answer is new (N = 0: b = 1, UCB-Con b - 0.5 = 0.5) and all four
    # share it (penalty -3/4): bonus 0.2 * 0.5 + 0.2 * -0.75 = -0.05. The second visit of a prompt: N = 4, b = 0.5,
    # b - 0.5 = 0: bonus 0.2 * -0.75 = -0.15.
    trainer, batches, _ = run("outcome_explore", ckpt, tmp_path, reward=same_answer_reward, max_steps=10)
    bonus = [(b["final_advantages"] - b["advantages"]) for b in batches]
    assert_close(torch.stack(bonus[:8]), torch.full((8, 4), -0.05))
    assert_close(torch.stack(bonus[8:]), torch.full((2, 4), -0.15))
    counts = trainer._strategy("advantage")._outcome_counts
    assert sorted(sum(a.values()) for a in counts.values()) == [4] * 6 + [8] * 2 and len(counts) == 8


def two_alike_reward(completions, **kwargs):
    """Answers "p", "q", "p" and none in each group of 4 (rows in order), scored by letter_reward."""
    record_outcomes("two_alike_reward", [("p", "q", "p", None)[i % 4] for i in range(len(completions))])
    return [c.count("a") / max(len(c), 1) for c in completions]


def test_outcome_explore_hand_worked_group(ckpt, tmp_path):
    # Each batch is one group of a new prompt: N = 0 for every answer, so UCB (no baseline) gives b = 1 to the three
    # rows with an answer; "p" twice: penalty -1/4 for each "p". Bonus 0.2 * [1, 1, 1, 0] + 0.5 * [-1/4, 0, -1/4, 0].
    trainer, batches, _ = run("outcome_explore", ckpt, tmp_path, reward=two_alike_reward, max_steps=2,
                              outcome_ucb_baseline="none", outcome_batch_coef=0.5)
    for b in batches:
        assert_close(b["final_advantages"] - b["advantages"], torch.tensor([0.075, 0.2, 0.075, 0.0]))


def test_outcome_explore_needs_answers_and_says_which_reward(ckpt, tmp_path):
    with pytest.raises(NoOutcomeError, match="outcome_explore needs each completion's final answer from its reward: "
                                             "no reward recorded any"):
        run("outcome_explore", ckpt, tmp_path, reward=binary_reward, max_steps=1)
    with pytest.raises(NoOutcomeError, match="outcome_answer_reward is 'math_accuracy' but that reward recorded no "
                                             "final answers for this batch \\(rewards that did: letter_reward\\)"):
        run("outcome_explore", ckpt, tmp_path / "2", max_steps=1, outcome_answer_reward="math_accuracy")


def no_answer_reward(completions, **kwargs):
    record_outcomes("no_answer_reward", [None] * len(completions))
    return [c.count("a") / max(len(c), 1) for c in completions]


# ------------------------------------------------------------------------------------------------ entropy_adv
def test_entropy_adv_shapes_the_loss_and_restores_the_rollout_advantages(ckpt, tmp_path):
    seen = []

    class Spy(et.get_trainer_class("entropy_adv")):
        def _transform_policy_logps(self, logps, capture, inputs, state):
            before = inputs["advantages"].clone()
            out = super()._transform_policy_logps(logps, capture, inputs, state)
            expected = bonuses.entropy_shaped_advantages(before, capture.entropies, self._loss_mask(inputs))
            seen.append((before, inputs["advantages"].clone(), expected, inputs))
            return out

    trainer = train(Spy, Spy.config_class, ckpt, tmp_path, reward=letter_reward, max_steps=4, num_iterations=2)
    assert len(seen) == 4  # 2 rollouts x 2 updates each
    for before, handed, expected, inputs in seen:
        assert handed.dim() == 2 and before.dim() == 1
        assert_close(handed, expected)
        assert inputs["advantages"].dim() == 1  # the rollout's advantages are back for the next update
    # The second update of a rollout starts from the same (unshaped) advantages, shaped with that update's entropies.
    assert_close(seen[0][0], seen[1][0])
    assert any((s[1] != s[0][:, None]).any() for s in seen)
    logged = [e for e in trainer.state.log_history if "entropy_adv/term_mean" in e]
    assert logged and any(e["entropy_adv/term_mean"] > 0 for e in logged)


# ------------------------------------------------------------------------------- no silent no-op: one warning
def always_right(completions, **kwargs):
    record_outcomes("always_right", [None] * len(completions))
    return [1.0] * len(completions)


def always_wrong(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize("method, reward, options, text", [
    ("maxrl", always_right, {}, "maxrl: every group of 100% of the generation batches since the last log was all "
                                "correct or all wrong"),
    ("wreinforce", always_wrong, {"wreinforce_mode": "psr"},
     "wreinforce: 100% of the generation batches since the last log had no correct completion"),
    ("qae", always_wrong, {}, "qae: every group of 100% of the generation batches since the last log had equal "
                              "rewards"),
    ("entropy_adv", always_wrong, {}, "entropy_adv: on 100% of the micro-batches since the last log the entropy "
                                      "term added nothing to any token"),
    ("outcome_explore", no_answer_reward, {}, "outcome_explore: in 100% of the generation batches since the last "
                                              "log no completion stated a final answer"),
])
def test_a_method_that_did_nothing_says_so_once(method, reward, options, text, ckpt, tmp_path):
    _, _, messages = run(method, ckpt, tmp_path, reward=reward, max_steps=3, **options)
    assert sum(text in m for m in messages) == 1, messages


@pytest.mark.parametrize("method", ["maxrl", "wreinforce", "qae", "entropy_adv", "outcome_explore"])
def test_a_method_that_acts_is_quiet(method, ckpt, tmp_path):
    reward = letter_reward if method == "outcome_explore" else half_right
    # 4 groups per batch: a batch whose every group is all right or all wrong is then rare (and absent here).
    _, _, messages = run(method, ckpt, tmp_path, reward=reward, max_steps=2, per_device_train_batch_size=16)
    assert not [m for m in messages if m.startswith(f"{method}:")]


# ------------------------------------------------------------------------------------------ one-line errors
@pytest.mark.parametrize("method, options, text", [
    ("maxrl", {"maxrl_eps": -1.0}, "maxrl_eps is -1.0 but must be >= 0"),
    ("wreinforce", {"wreinforce_mode": "both"}, "wreinforce_mode must be one of weighted, psr, nsr; got 'both'"),
    ("qae", {"qae_k": 1.5}, r"qae_k is 1.5 but must lie in \(0, 1\)"),
    ("qae", {"qae_eps": -1e-6}, "qae_eps is -1e-06 but must be >= 0"),
    ("entropy_adv", {"entropy_adv_kappa": 1.0}, "entropy_adv_kappa is 1.0 but must be > 1"),
    ("outcome_explore", {"outcome_ucb_baseline": "max"},
     "outcome_ucb_baseline must be one of none, constant, mean, mean_batch, mean_loo; got 'max'"),
    ("maxrl", {"multi_objective_aggregation": "normalize_then_sum"},
     "multi_objective_aggregation is 'normalize_then_sum' but method maxrl recomputes advantages"),
])
def test_config_errors_name_the_key(method, options, text):
    cls = et.get_config_class(method)
    with pytest.raises(ValueError, match=text):
        cls(output_dir="unused", use_cpu=True, report_to=[], **options)


# --------------------------------------------------------------------------------------------- composition
#: Each composition's advantages on `PATTERN` (the advantage side's, worked by hand) and a metric of the loss side that
#: is positive only when it acted. outcome_explore: every answer new (UCB-Con 0.2 * (1 - 0.5)), "p" twice in each
#: group (penalty 0.2 * -1/4): bonus 0.05, 0.1, 0.05, 0 on GRPO's advantages.
COMPOSITIONS = {
    "maxrl+casp": (MAXRL_PATTERN, "casp/forking_frac", {}),
    "qae+entropy_adv": ([QAE_UNIT, 0, 0, 0, 0, 0, 0, -QAE_UNIT], "entropy_adv/term_mean", {}),
    "outcome_explore+kl_cov": ([a + d for a, d in zip(GRPO_PATTERN, [0.05, 0.1, 0.05, 0.0] * 2)],
                               "kl_cov/selected_tokens", {}),
    "wreinforce+clip_cov": ([0.1, -1, -1, -1, 0.1, 0.1, 0.1, -1], "clip_cov/selected_tokens",
                            {"clip_cov_ratio": 0.2, "clip_cov_lb": -1e9}),
}


@pytest.mark.parametrize("method", list(COMPOSITIONS))
def test_composes_with_the_other_side(method, ckpt, tmp_path):
    adv, loss = method.split("+")
    expected, acted, options = COMPOSITIONS[method]
    kwargs = dict(reward=pattern_reward, max_steps=2, steps_per_generation=2, per_device_train_batch_size=8)
    trainer, batches, _ = run(method, ckpt, tmp_path, **kwargs, **options)
    assert type(trainer).__name__ == trainer_name(method)
    (b,) = batches  # one rollout of 16 rows (2 updates), the pattern twice
    assert_close(b["final_advantages"], torch.tensor(expected * 2, dtype=torch.float32), rtol=0, atol=1e-5)
    assert max(e.get(acted, 0.0) for e in trainer.state.log_history) > 0, acted
    # The loss side changed the update: the advantage side alone ends elsewhere.
    alone, _, _ = run(adv, ckpt, tmp_path / "alone", **kwargs)
    assert max_param_diff(trainer, alone) > 1e-6
