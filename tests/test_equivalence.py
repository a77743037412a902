"""Faithfulness: with no method active (or a method neutralised) training equals TRL's GRPOTrainer exactly."""

import pytest
from trl import GRPOConfig, GRPOTrainer

import exploration_trl as et
from helpers import max_param_diff, params_changed, toy_checkpoint, train


def diverse_reward(completions, **kwargs):
    """Distinct characters per completion: varies within every group, so every step has a gradient."""
    return [len(set(c)) / 8 for c in completions]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


@pytest.fixture(scope="module")
def trl_reference(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("trl")
    return {
        "on": train(GRPOTrainer, GRPOConfig, ckpt, out / "on", reward=diverse_reward, epsilon_high=0.28),
        "off": train(GRPOTrainer, GRPOConfig, ckpt, out / "off", reward=diverse_reward, epsilon_high=0.28,
                     steps_per_generation=2),
    }


def test_reference_actually_trains(trl_reference, ckpt):
    # Guards the tests below against passing vacuously (no update at all).
    assert params_changed(trl_reference["on"], ckpt) > 1e-3
    assert params_changed(trl_reference["off"], ckpt) > 1e-3


NEUTRAL = {
    "grpo": {},
    "progrpo": dict(progrpo_alpha=0.0),
    "dsgrpo": dict(ds_gamma_p=0.0, ds_gamma_n=0.0),
    "casp": dict(casp_alpha=0.0, casp_top1_penalty=1.0),
    "kl_cov": dict(kl_cov_ratio=0.0, steps_per_generation=1, epsilon=0.2),
    "clip_cov": dict(clip_cov_ratio=0.0, clip_cov_lb=1e8, clip_cov_ub=1e9, steps_per_generation=1),
    # PKPO at k = 1 without a baseline leaves the rewards as they are; the unlikeliness reward at beta = 0 too.
    # Pass@k Training's neutral point (k = 1) needs binary rewards: tests/test_passk_methods.py.
    "pkpo": dict(pkpo_k=1, pkpo_estimator="s"),
    "unlikely": dict(unlikely_beta=0.0),
    # The entropy advantage at alpha = 0 and outcome exploration with both bonuses off are GRPO. MaxRL, W-REINFORCE and
    # QAE replace GRPO's normalisation and have no such point (tests/test_new_methods.py checks their advantages).
    "entropy_adv": dict(entropy_adv_alpha=0.0),
    "outcome_explore": dict(outcome_ucb_coef=0.0, outcome_batch_coef=0.0),
}


@pytest.mark.parametrize("method", list(NEUTRAL))
def test_neutralised_method_equals_trl(method, ckpt, trl_reference, tmp_path):
    cls = et.get_trainer_class(method)
    kwargs = {"epsilon_high": 0.28, **NEUTRAL[method]}
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=diverse_reward, **kwargs)
    assert max_param_diff(trl_reference["on"], trainer) <= 1e-6


@pytest.mark.parametrize("method", ["grpo", "casp", "progrpo"])
def test_off_policy_equals_trl(method, ckpt, trl_reference, tmp_path):
    """steps_per_generation=2: TRL computes old log-probs; our capture of that pass must not change training."""
    cls = et.get_trainer_class(method)
    kwargs = {"epsilon_high": 0.28, "steps_per_generation": 2, **NEUTRAL[method]}
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=diverse_reward, **kwargs)
    assert max_param_diff(trl_reference["off"], trainer) <= 1e-6


@pytest.mark.parametrize("method", ["progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov"])
def test_active_method_changes_training(method, ckpt, trl_reference, tmp_path):
    """The counterpart: with paper defaults (strengthened where a toy run is too small to show it) the
    parameters differ from TRL's, so the neutral tests above are not vacuous."""
    cls = et.get_trainer_class(method)
    strong = {"casp": dict(casp_alpha=0.5, casp_entropy_quantile=0.0), "clip_cov": dict(clip_cov_ratio=0.5, clip_cov_lb=-1e9),
              "kl_cov": dict(kl_cov_ratio=0.5), "dsgrpo": dict(ds_gamma_p=0.5, ds_gamma_n=0.5),
              "progrpo": dict(progrpo_alpha=5.0, correct_reward_threshold=0.3)}[method]
    # ProGRPO acts on groups that mix correct and wrong completions only: 0.3 splits this reward's values.
    # KL-Cov's penalty only acts off-policy (see the test below), so compare it on a rollout feeding 2 steps.
    spg = 2 if method == "kl_cov" else 1
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=diverse_reward, epsilon_high=0.28,
                    steps_per_generation=spg, **strong)
    assert max_param_diff(trl_reference["on" if spg == 1 else "off"], trainer) > 1e-5


def test_kl_cov_penalty_acts_only_when_a_rollout_feeds_several_steps(ckpt, tmp_path):
    cls = et.get_trainer_class("kl_cov")

    def run(ratio, spg):
        return train(cls, cls.config_class, ckpt, tmp_path / f"{ratio}_{spg}", reward=diverse_reward,
                     kl_cov_ratio=ratio, kl_cov_coef=1.0, steps_per_generation=spg, max_steps=2)

    # One optimizer step per rollout: old == current, |logp - old| has zero gradient -> identical updates.
    assert max_param_diff(run(0.0, 1), run(0.5, 1)) <= 1e-6
    # Two optimizer steps per rollout: the second step is off-policy and the penalty changes the update.
    assert max_param_diff(run(0.0, 2), run(0.5, 2)) > 1e-5
