"""The two-sided entropy controller (`entropy_band: [low, high]`, trainers/callbacks/entropy_band.py)."""

from __future__ import annotations

import warnings

import pytest

import exploration_trl as et
from exploration_trl.trainers.callbacks.entropy_band import entropy_band_update
from helpers import toy_checkpoint, train


def test_update_rule_hand_numbers():
    step = dict(low=1.0, high=2.0, direction=1, rate=0.1, lo=1e-4, hi=1.0)
    assert entropy_band_update(0.1, 0.5, **step) == pytest.approx(0.11)  # below: raise the entropy-raising knob
    assert entropy_band_update(0.1, 3.0, **step) == pytest.approx(0.1 / 1.1)  # above: lower it
    assert entropy_band_update(0.1, 1.5, **step) == 0.1  # inside: unchanged
    assert entropy_band_update(0.95, 0.5, **step) == 1.0  # 1.045 clipped to the max
    assert entropy_band_update(0.0, 0.5, **step) == pytest.approx(1.1e-4)  # 0 is first raised to the min
    assert entropy_band_update(1e-4, 3.0, **step) == 1e-4  # and never goes below it
    assert entropy_band_update(0.1, 0.5, **{**step, "direction": -1}) == pytest.approx(0.1 / 1.1)
    assert entropy_band_update(0.1, float("nan"), **step) == 0.1


@pytest.mark.parametrize("value, entropy, direction, expected", [
    (0.0, 3.0, 1, 0.0),  # above the band, entropy-raising knob off: it stays off (it used to jump to the min)
    (5e-5, 3.0, 1, 5e-5),  # under the min and must fall: not raised to the min
    (0.0, 0.5, -1, 0.0),  # below the band, entropy-lowering knob off: it stays off
    (5e-5, 0.5, -1, 5e-5),
    (2.0, 0.5, 1, 2.0),  # above the max and must rise: not lowered to the max
    (2.0, 3.0, -1, 2.0),
    (0.0, 0.5, 1, 1.1e-4),  # must rise from 0: from the min
    (0.0, 3.0, -1, 1.1e-4),
    (2.0, 3.0, 1, 1.0),  # must fall from above the max: down to the max
])
def test_update_never_moves_a_knob_the_wrong_way(value, entropy, direction, expected):
    step = dict(low=1.0, high=2.0, direction=direction, rate=0.1, lo=1e-4, hi=1.0)
    assert entropy_band_update(value, entropy, **step) == pytest.approx(expected, abs=0.0, rel=1e-12)


@pytest.mark.parametrize("method, kwargs, text", [
    ("grpo", dict(entropy_band=[2.0, 1.0]), "entropy_band is \\[2.0, 1.0\\] but must be \\[low, high\\]"),
    ("grpo", dict(entropy_band=[1.0, 2.0], entropy_band_knob="temperature"), "entropy_band_knob is 'temperature'"),
    ("grpo", dict(entropy_band=[1.0, 2.0], entropy_band_knob="kl_cov_coef"), "this method's config has no such key"),
    ("grpo", dict(entropy_band=[1.0, 2.0], use_adaptive_entropy=True), "set use_adaptive_entropy: false"),
    ("kl_cov", dict(entropy_band=[1.0, 2.0], entropy_band_knob="kl_cov_coef", entropy_band_rate=0.0),
     "entropy_band_rate is 0.0"),
])
def test_config_errors(method, kwargs, text, tmp_path):
    with pytest.raises(ValueError, match=text):
        et.get_config_class(method)(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                                    report_to=[], **kwargs)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def _logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def test_entropy_below_the_band_raises_trl_entropy_bonus_and_warns_once(ckpt, tmp_path):
    # The untrained toy's entropy is ~4.5 nats, far below [20, 30]: the coefficient must rise every step.
    cls = et.get_trainer_class("grpo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = train(cls, cls.config_class, ckpt, tmp_path, entropy_band=[20.0, 30.0], entropy_band_rate=0.5,
                        entropy_band_min=0.01, entropy_band_patience=2, max_steps=4)
    values = _logged(trainer, "entropy_band/entropy_coef")
    assert values == pytest.approx([0.015, 0.0225, 0.03375, 0.050625])
    # TRL applied and logged the coefficient of each step: the one set at the end of the previous step.
    assert _logged(trainer, "entropy_coef")[1:] == pytest.approx(values[:-1])
    ours = [w for w in caught if "entropy_band:" in str(w.message)]
    assert len(ours) == 1 and "below the band [20.0, 30.0] for 2 steps" in str(ours[0].message)


def test_entropy_above_the_band_lowers_kl_cov_coef(ckpt, tmp_path):
    cls = et.get_trainer_class("kl_cov")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, entropy_band=[0.0, 0.5], entropy_band_knob="kl_cov_coef",
                    kl_cov_coef=1.0, entropy_band_rate=0.25, max_steps=3)
    assert _logged(trainer, "entropy_band/kl_cov_coef") == pytest.approx([0.8, 0.64, 0.512])
    assert trainer.args.kl_cov_coef == pytest.approx(0.512)


def test_entropy_above_the_band_leaves_a_knob_at_zero_off(ckpt, tmp_path):
    # The toy's entropy (~4.5 nats) is above [0, 0.5]: KL-Cov's penalty, switched off, must stay off.
    cls = et.get_trainer_class("kl_cov")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, entropy_band=[0.0, 0.5], entropy_band_knob="kl_cov_coef",
                    kl_cov_coef=0.0, entropy_band_min=0.01, max_steps=2)
    assert _logged(trainer, "entropy_band/kl_cov_coef") == [0.0, 0.0]
    assert trainer.args.kl_cov_coef == 0.0
