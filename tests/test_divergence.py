"""A diverging run is said so (`trainers/callbacks/divergence.py`): the rule on hand-made histories, one warning and a
card note from a run that truly diverges (the plain entropy bonus at a huge coefficient from the countdown warm
start)."""

from __future__ import annotations

import warnings

import pytest

from exploration_trl.hub.outcome import outcome_notes
from exploration_trl.trainers.callbacks.divergence import DivergenceWarning, detect_divergence


def hist(entropy=None, reward=None):
    n = len(entropy or reward)
    out = []
    for i in range(n):
        e = {"step": i + 1}
        if entropy:
            e["entropy"] = entropy[i]
        if reward:
            e["reward"] = reward[i]
        out.append(e)
    return out


def test_entropy_rule_on_hand_made_histories():
    # first window (2 entries) 0.5, last 1.6 > 3 x 0.5 and above the window before (1.0): diverging
    note = detect_divergence(hist(entropy=[0.5, 0.5, 1.0, 1.0, 1.6, 1.6]), window_steps=2)
    assert note is not None and "token entropy climbed from 0.5 to 1.6 nats by step 6" in note
    # 3x but no longer rising (plateau at the previous window's level): not flagged
    assert detect_divergence(hist(entropy=[0.5, 0.5, 1.6, 1.6, 1.6, 1.6]), window_steps=2) is None
    # rising but below 3x: an entropy bonus holding entropy up is not flagged
    assert detect_divergence(hist(entropy=[0.5, 0.5, 1.0, 1.0, 1.4, 1.4]), window_steps=2) is None
    # a collapsing run (entropy falling) is not flagged; too short a history neither
    assert detect_divergence(hist(entropy=[0.5, 0.4, 0.3, 0.2, 0.1, 0.1]), window_steps=2) is None
    assert detect_divergence(hist(entropy=[0.5, 5.0, 9.0]), window_steps=2) is None
    # the factor is an option
    assert detect_divergence(hist(entropy=[0.5, 0.5, 1.0, 1.0, 1.4, 1.4]), window_steps=2, entropy_factor=2.5)


def test_reward_rule_on_hand_made_histories():
    note = detect_divergence(hist(reward=[0.2, 0.4, 0.1, 0.0, 0.0, 0.0]), window_steps=3)
    assert note is not None and "mean reward fell to 0 over the last 3 logged steps after reaching 0.233" in note
    # never above 0: a hard task, not a collapse
    assert detect_divergence(hist(reward=[0.0] * 8), window_steps=3) is None
    # one positive reward in the last window: not fallen to 0
    assert detect_divergence(hist(reward=[0.2, 0.4, 0.1, 0.0, 0.01, 0.0]), window_steps=3) is None
    # eval entries are skipped; logging every 10 steps makes a 20-step window 2 entries
    h = hist(reward=[0.3, 0.3, 0.0, 0.0]) + [{"eval_pass@1": 0.0, "step": 5}]
    assert detect_divergence(h, window_steps=20, logging_steps=10) is not None
    assert detect_divergence(h, window_steps=0) is None  # switched off


def test_outcome_note():
    assert outcome_notes({"diverged": "The run diverged: x."}) == ["The run diverged: x."]
    assert outcome_notes({"diverged": None}) == []


def test_a_truly_diverging_run_warns_once_and_notes_it_in_the_card(tmp_path):
    from exploration_trl.experiments import countdown_tiny as ct
    from exploration_trl.experiments import demo

    s = demo.demo_settings(quick=False)
    s.rl.steps, s.rl.prompts_per_step, s.rl.num_generations, s.rl.learning_rate = 10, 4, 4, 3e-3
    train, _ = ct.make_problems(s.data, s.seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = ct.build_rl_trainer("grpo", s, demo.warm_start_dir(), train[:100], tmp_path / "run",
                                         {"entropy_coef": 1.0, "logging_steps": 1, "divergence_window": 3})
        trainer.train()
    ours = [w for w in caught if issubclass(w.category, DivergenceWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert trainer.divergence == str(ours[0].message) and "diverged" in trainer.divergence
    entropies = [e["entropy"] for e in trainer.state.log_history if "entropy" in e]
    assert entropies[-1] > 3 * entropies[0]  # it really diverged
    trainer.save_model(str(tmp_path / "model"))
    card = (tmp_path / "model" / "README.md").read_text()
    assert trainer.divergence in card


@pytest.mark.parametrize("bad", [{"divergence_window": -1}, {"divergence_entropy_factor": 1.0}])
def test_config_errors(tmp_path, bad):
    from exploration_trl.trainers.config import ExplorationGRPOConfig

    key = next(iter(bad))
    with pytest.raises(ValueError, match=f"^{key} is"):
        ExplorationGRPOConfig(output_dir=str(tmp_path), **bad)


def test_quiet_experiment_logs_keep_the_divergence_warning():
    from exploration_trl.experiments._common import quiet_training_logs

    restore = quiet_training_logs()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("noise", UserWarning, stacklevel=1)
            warnings.warn("The run diverged: test.", DivergenceWarning, stacklevel=1)
    finally:
        restore()
    assert [str(w.message) for w in caught] == ["The run diverged: test."]
