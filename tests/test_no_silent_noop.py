"""A configured method that does not act on a step stops training with one line naming it (never silent GRPO).

This is how the multi-process bug showed: TRL hands the loss the *wrapped* model (DDP, DeepSpeed), the loss hooks
did not recognise it, and CaSP / KL-Cov / Clip-Cov and the exploration metrics silently did nothing. The tests
below reproduce each way a hook can be skipped and check that the guard fires.
"""

import warnings

import pytest

import exploration_trl as et
from exploration_trl.cli import main as cli_main
from exploration_trl.errors import HookDidNotRunError
from exploration_trl.trainers.base import ExplorationGRPOTrainer
from exploration_trl.boundary.capture import LMHead
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


@pytest.fixture
def loss_pass_not_recognised(monkeypatch):
    """Behaves like the bug: the loss pass's model is never taken for the policy."""
    monkeypatch.setattr(LMHead, "is_policy", lambda self, model: False)


class AdvantageOverrideShortCircuited:
    """A mixin that returns TRL's advantages without calling the method's override."""

    def _compute_advantages(self, batch):
        return batch.advantages


def make(cls, ckpt, tmp_path, **overrides):
    args = cls.config_class(**grpo_kwargs(tmp_path, max_steps=1, **overrides))
    return cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())


@pytest.mark.parametrize("method", ["casp", "kl_cov", "clip_cov", "progrpo+casp"])
def test_loss_hook_not_run_stops_training(method, ckpt, tmp_path, loss_pass_not_recognised):
    trainer = make(et.get_trainer_class(method), ckpt, tmp_path, exploration_metrics=False)
    with pytest.raises(HookDidNotRunError) as err:
        trainer.train()
    loss_side = method.split("+")[-1]
    assert str(err.value).startswith(f"{loss_side}: the loss-side hook did not run on this training step")
    assert "\n" not in str(err.value)


def test_rollout_statistics_not_captured_stops_training(ckpt, tmp_path, loss_pass_not_recognised):
    """ProGRPO recomputing its rollout log-probs (not reading them from generation) through a pass it cannot see."""
    trainer = make(et.get_trainer_class("progrpo"), ckpt, tmp_path, exploration_metrics=False, rollout_logps_from_generation=False)
    with pytest.raises(HookDidNotRunError, match=r"^progrpo: the rollout statistics it needs"):
        trainer.train()


def test_exploration_metrics_not_run_stops_training(ckpt, tmp_path, loss_pass_not_recognised):
    cls = ExplorationGRPOTrainer
    trainer = make(cls, ckpt, tmp_path)
    with pytest.raises(HookDidNotRunError, match=r"^exploration metrics: the loss-side hook did not run"):
        trainer.train()
    # With the metrics switched off, plain GRPO has nothing to guard.
    make(cls, ckpt, tmp_path / "off", exploration_metrics=False).train()


@pytest.mark.parametrize("method", ["progrpo", "dsgrpo"])
def test_advantage_hook_not_run_stops_training(method, ckpt, tmp_path):
    base = et.get_trainer_class(method)
    cls = type("Broken", (AdvantageOverrideShortCircuited, base), {"config_class": base.config_class})
    trainer = make(cls, ckpt, tmp_path, exploration_metrics=False)
    with pytest.raises(HookDidNotRunError, match=rf"^{method}: the advantage-side hook did not run"):
        trainer.train()


def test_working_trainers_pass_the_guard(ckpt, tmp_path):
    trainer = make(et.get_trainer_class("progrpo+kl_cov"), ckpt, tmp_path, steps_per_generation=1)
    trainer.train()
    assert trainer.state.global_step == 1


def test_cli_prints_one_line_and_fails(ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(LMHead, "is_policy", lambda self, model: False)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"method: casp\nmodel_name_or_path: {ckpt}\ndataset_name: countdown\nmax_train_samples: 4\n"
        f"reward_funcs: [countdown]\noutput_dir: {tmp_path / 'out'}\nuse_cpu: true\nbf16: false\nmax_steps: 1\n"
        "per_device_train_batch_size: 4\nnum_generations: 4\nmax_completion_length: 4\nreport_to: none\n"
        "save_strategy: 'no'\n"
    )
    assert cli_main(["train", "--config", str(config)]) == 1
    # Progress bars end their lines with carriage returns; the error is the one line that starts with "error:".
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines[-5:]
    assert errors[0].startswith("error: casp and exploration metrics: the loss-side hook did not run on this training")


def format_plus_letter_reward(completions, **kwargs):
    """A graded reward with partial credit everywhere: 0.1 for any completion, plus its fraction of 'a'."""
    return [0.1 + c.count("a") / max(len(c), 1) for c in completions]


def test_progrpo_that_skips_every_group_says_so_once(ckpt, tmp_path):
    """A graded reward at the default threshold (0) makes every completion correct: ProGRPO's skip rule then leaves
    every group as GRPO's. That is one warning (the correctness guard's, with ProGRPO's effect and the key to
    change), not two, and `progrpo/mixed_group_frac` is 0."""
    cls = et.get_trainer_class("progrpo")
    args = cls.config_class(**grpo_kwargs(tmp_path / "graded", progrpo_alpha=1.0))
    trainer = cls(model=ckpt, reward_funcs=format_plus_letter_reward, args=args, train_dataset=toy_dataset())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.train()
    ours = [str(w.message) for w in record if "correct_reward_threshold" in str(w.message)]
    assert len(ours) == 1, ours
    assert "splits no group" in ours[0] and "ProGRPO's skip rule leaves every group as GRPO's" in ours[0]
    assert "correct_reward_threshold=0.0" in ours[0]
    fractions = [h["progrpo/mixed_group_frac"] for h in trainer.state.log_history if "progrpo/mixed_group_frac" in h]
    assert fractions == [0.0, 0.0, 0.0]
