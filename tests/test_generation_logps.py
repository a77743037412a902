"""On-policy ProGRPO / DS-GRPO read the rollout log-probs from generation instead of a second forward pass.

The values must equal TRL's own recomputation (`_get_per_token_logps_and_entropies` on prompt + completion) up to
the numerics of cached versus full attention, and the prompt log-probs from the prompt-only pass must equal those
read from a full pass's hidden states.
"""

import pytest
import torch

import exploration_trl as et
from exploration_trl.boundary.capture import Capture
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def rollout(method, ckpt, tmp_path, **overrides):
    cls = et.get_trainer_class(method)
    args = cls.config_class(**grpo_kwargs(tmp_path, max_completion_length=12, temperature=0.7, top_p=0.9,
                                          **overrides))
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())
    trainer.model.train()
    passes = []
    original = trainer._rollout_pass
    trainer._rollout_pass = lambda output: passes.append(1) or original(output)
    seen = {}
    compute = trainer._compute_advantages

    def spy(batch):
        seen["batch"] = batch
        return compute(batch)

    trainer._compute_advantages = spy
    out = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4)])
    return trainer, out, seen["batch"], passes


@pytest.mark.parametrize("method", ["progrpo", "dsgrpo"])
def test_generation_logps_equal_a_recomputation(method, ckpt, tmp_path):
    # top_p 0.9 and temperature 0.7: the log-probs are TRL's (full softmax of logits / T), not the truncated ones.
    trainer, out, batch, passes = rollout(method, ckpt, tmp_path)
    assert passes == []  # no added forward pass over the completions
    reference = trainer._rollout_pass(out)
    mask = out["completion_mask"].bool()
    assert mask.sum() > 4
    torch.testing.assert_close(batch.completion_logps[mask], reference.logps[mask], rtol=1e-4, atol=1e-4)
    assert (batch.completion_logps[~mask] == 0).all()
    if method == "progrpo":  # the prompt-only pass gives the same prompt log-probs as the full pass's hidden states
        full_logps, full_mask = trainer.rollout.prompt_logps(reference, out)
        torch.testing.assert_close(batch.prompt_logps[full_mask.bool()], full_logps[full_mask.bool()],
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batch.prompt_logps_mask, full_mask)


def test_switch_off_and_off_policy_use_their_own_passes(ckpt, tmp_path):
    _, _, batch, passes = rollout("progrpo", ckpt, tmp_path / "off", rollout_logps_from_generation=False)
    assert passes == [1] and batch.completion_logps is not None
    # Off-policy TRL computes old log-probs itself: neither generation nor an added pass is used.
    _, out, batch, passes = rollout("dsgrpo", ckpt, tmp_path / "spg", steps_per_generation=2)
    assert passes == [] and batch.completion_logps is out["old_per_token_logps"]


def test_mismatched_lengths_fall_back_to_the_pass(ckpt, tmp_path):
    cls = et.get_trainer_class("dsgrpo")
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=cls.config_class(**grpo_kwargs(tmp_path)),
                  train_dataset=toy_dataset())
    trainer.rollout.generation_logps = [torch.zeros(3)] * 4
    out = {"completion_mask": torch.ones(4, 5, dtype=torch.long), "completion_ids": torch.ones(4, 5, dtype=torch.long)}
    assert trainer._capture_from_generation(out) is None
    trainer.rollout.generation_logps = [torch.full((5,), -1.0)] * 4
    capture = trainer._capture_from_generation(out)
    assert isinstance(capture, Capture) and capture.logps.shape == (4, 5) and capture.hidden is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scaled_logits_are_the_plain_expressions_bits_and_leave_the_logits_alone(dtype, temperature):
    from exploration_trl.boundary.generation_logps import GenerationLogps

    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 1000) * 4).to(dtype)
    before = logits.clone()
    last = logits[:, -1]
    scaled = GenerationLogps(temperature)._scaled(last)
    assert scaled.dtype == torch.float32
    assert torch.equal(scaled, last.float() / temperature)
    assert torch.equal(logits, before)  # float32 logits are never divided in place
    # at temperature 1 a float32 row is used as it is: no (B, V) write at all
    assert (scaled.data_ptr() == last.data_ptr()) == (temperature == 1.0 and dtype == torch.float32)
