"""The worked example of `docs/writing_a_method.md` runs as written and behaves as the guide says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from trl import GRPOConfig, GRPOTrainer

from helpers import max_param_diff, toy_checkpoint, train

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing_a_method.md"


def diverse_reward(completions, **kwargs):
    return [len(set(c)) / 8 for c in completions]


@pytest.fixture(scope="module")
def example():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    namespace: dict = {}
    exec(compile(blocks[0], str(GUIDE), "exec"), namespace)  # the first block is the whole method
    return namespace["WeightedPositiveTrainer"], namespace["WeightedPositiveConfig"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def test_guide_example_is_grpo_at_weight_one_and_acts_below(example, ckpt, tmp_path):
    trainer_cls, config_cls = example
    reference = train(GRPOTrainer, GRPOConfig, ckpt, tmp_path / "trl", reward=diverse_reward, epsilon_high=0.28)
    neutral = train(trainer_cls, config_cls, ckpt, tmp_path / "one", reward=diverse_reward, positive_weight=1.0,
                    epsilon_high=0.28, exploration_metrics=False)
    assert max_param_diff(reference, neutral) == 0.0
    acting = train(trainer_cls, config_cls, ckpt, tmp_path / "tenth", reward=diverse_reward, positive_weight=0.1,
                   epsilon_high=0.28, exploration_metrics=False)
    assert max_param_diff(reference, acting) > 1e-5
    logged = [h["weighted_positive/positive_frac"] for h in acting.state.log_history
              if "weighted_positive/positive_frac" in h]
    assert len(logged) == 3 and all(0.0 < v < 1.0 for v in logged)


def test_guide_example_rejects_a_negative_weight(example, tmp_path):
    with pytest.raises(ValueError, match="positive_weight is -1"):
        example[1](output_dir=str(tmp_path), positive_weight=-1.0)
