"""Exploration and per-method metrics reach TRL's log (and so wandb/trackio/tensorboard via `report_to`)."""

import math

import pytest

import exploration_trl as et
from helpers import distinct_char_reward, grpo_kwargs, toy_checkpoint, train

EXPLORATION_KEYS = [
    "exploration/entropy_correct", "exploration/entropy_wrong", "exploration/lambda_1", "exploration/lambda_2",
    "exploration/lambda_3", "exploration/lambda_sample", "exploration/branching_factor",
    "exploration/unique_completions_per_group", "exploration/pass_at_G", "rewards/distinct_char_reward/failures",
]
METHOD_KEYS = {
    "progrpo": ["progrpo/confidence_mean", "progrpo/prompt_confidence_mean", "progrpo/adjustment_abs_mean"],
    "dsgrpo": ["dsgrpo/bonus_mean", "dsgrpo/penalty_mean"],
    "casp": ["casp/forking_frac", "casp/top1_penalty_frac"],
    "kl_cov": ["kl_cov/selected_tokens", "kl_cov/cov_threshold"],
    "clip_cov": ["clip_cov/selected_tokens", "clip_cov/cov_threshold"],
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def first_log(trainer):
    return next(h for h in trainer.state.log_history if "loss" in h)


def test_exploration_metrics_logged_with_sane_values(ckpt, tmp_path):
    cls = et.get_trainer_class("grpo")
    # correct = reward > 0.5 splits the batch into correct and wrong completions.
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=distinct_char_reward, max_steps=1,
                    correct_reward_threshold=0.5)
    log = first_log(trainer)
    for key in EXPLORATION_KEYS:
        assert key in log, key
    assert log["rewards/distinct_char_reward/failures"] == 0
    assert 0.0 <= log["exploration/pass_at_G"] <= 1.0
    assert 1.0 <= log["exploration/unique_completions_per_group"] <= 4.0
    vocab = trainer.model.config.vocab_size
    assert 1.0 <= log["exploration/branching_factor"] <= vocab
    assert 0 >= log["exploration/lambda_1"] >= log["exploration/lambda_2"] >= log["exploration/lambda_3"]
    assert log["exploration/lambda_sample"] <= log["exploration/lambda_1"]
    # The entropy split is token-weighted; TRL's own `entropy` is their weighted mean, so it lies between them.
    lo, hi = sorted(v for v in (log["exploration/entropy_correct"], log["exploration/entropy_wrong"]) if v is not None)
    assert lo - 1e-4 <= log["entropy"] <= hi + 1e-4
    assert all(math.isfinite(log[k]) for k in EXPLORATION_KEYS if log[k] is not None)


def test_reward_failures_are_logged_per_generation_batch(ckpt, tmp_path):
    """`rewards/<name>/failures` is the number of completions the reward could not score, one value per generation
    batch (kept on the device until the log), so each step's log holds its own batch's count."""
    from exploration_trl.rewards import record_failure

    counts = []

    def flaky_reward(completions, **kwargs):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        failed = [len(t) % 2 == 0 for t in texts]  # varies from batch to batch for the untrained toy model
        record_failure("flaky_reward", sum(failed))
        counts.append(sum(failed))
        return [None if f else len(set(t)) / 8 for t, f in zip(texts, failed, strict=True)]

    cls = et.get_trainer_class("grpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=flaky_reward, max_steps=4)
    logged = [h["rewards/flaky_reward/failures"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [float(c) for c in counts] and len(counts) == 4
    assert len(set(counts)) > 1, "the check needs batches with different counts"


def test_per_response_sum_hand_worked():
    """CaSP Eq. 2: mean over each response's tokens, then over responses. Values [-1, -3 | -4] in rows 0, 0, 1 (row 2
    has none): response means -2 and -4, so (sum -6, 2 responses) -> -3, where the token average is -8/3."""
    import torch

    from exploration_trl.trainers.components.metrics_logging import per_response_sum

    assert per_response_sum(torch.tensor([-1.0, -3.0, -4.0]), torch.tensor([0, 0, 1]), 3) == (-6.0, 2.0)
    assert per_response_sum(torch.tensor([2.0]), torch.tensor([1]), 2) == (2.0, 1.0)


def test_lambda_per_response_uses_every_token_and_averages_per_response(ckpt, tmp_path, monkeypatch):
    import torch

    from exploration_trl.trainers.components import metrics_logging

    seen = []
    real = metrics_logging.per_response_sum

    def spy(values, rows, num_rows):
        seen.append((values.clone(), rows.clone()))
        return real(values, rows, num_rows)

    monkeypatch.setattr(metrics_logging, "per_response_sum", spy)
    cls = et.get_trainer_class("grpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=distinct_char_reward, max_steps=1,
                    exploration_metrics_lambda="per_response", exploration_metrics_max_tokens=1)
    log = first_log(trainer)
    values, rows = seen[0]  # Λ(1): the first of the five averaged statistics
    assert len(seen) == 5 and values.numel() > 1  # every valid token, not exploration_metrics_max_tokens = 1
    means = [values[rows == r].mean().item() for r in rows.unique()]
    assert log["exploration/lambda_1"] == pytest.approx(sum(means) / len(means), rel=1e-5)
    assert 0 >= log["exploration/lambda_1"] >= log["exploration/lambda_2"] >= log["exploration/lambda_3"]
    with pytest.raises(ValueError, match="exploration_metrics_lambda must be one of sampled_tokens, per_response"):
        cls.config_class(**grpo_kwargs(tmp_path, exploration_metrics_lambda="tokens"))


def test_exploration_metrics_switch_off(ckpt, tmp_path):
    cls = et.get_trainer_class("grpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=distinct_char_reward, max_steps=1,
                    exploration_metrics=False)
    log = first_log(trainer)
    assert not [k for k in log if k.startswith("exploration/")]


@pytest.mark.parametrize("method", list(METHOD_KEYS))
def test_method_metrics_logged(ckpt, tmp_path, method):
    cls = et.get_trainer_class(method)
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=distinct_char_reward, max_steps=1,
                    correct_reward_threshold=0.5, steps_per_generation=1)
    log = first_log(trainer)
    for key in METHOD_KEYS[method]:
        if key.endswith("/cov_threshold") and log[key.replace("cov_threshold", "selected_tokens")] == 0:
            assert key not in log  # no token selected: the threshold is undefined and left out (it was NaN)
            continue
        assert key in log, key
    if method == "casp":
        assert 0.0 < log["casp/forking_frac"] < 0.5  # top 20% entropy per response, strict
    if method == "dsgrpo":
        # Correct rows get A - gamma_p*lbar with lbar < 0 (a bonus > 0); wrong rows A + gamma_n*lbar (< 0).
        assert log["dsgrpo/bonus_mean"] > 0 and log["dsgrpo/penalty_mean"] < 0


def test_a_later_batch_that_no_reward_scores_is_logged_and_warned_once(ckpt, tmp_path):
    """After the first scored batch, an unscored one does not stop training (the first batch does: see
    `test_everyday_errors`); it is logged as `rewards/unscored_batch_frac` and warned about once, at the log."""
    calls = []

    def fading_reward(completions, **kwargs):
        calls.append(len(calls))
        return [1.0 if len(calls) == 1 and i % 2 else (0.0 if len(calls) == 1 else None)
                for i in range(len(completions))]

    cls = et.get_trainer_class("grpo")
    with pytest.warns(UserWarning, match=r"no reward scored any completion of 1 of the 1 generation batches of the "
                                         r"logging window ending at step 2 \(every reward of fading_reward returned None\)") as record:
        trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=fading_reward, max_steps=3)
    logged = [h["rewards/unscored_batch_frac"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [0.0, 1.0, 1.0]
    assert sum("no reward scored any completion" in str(w.message) for w in record) == 1
