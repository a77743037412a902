"""Dynamic sampling (DAPO Sec. 3.2 / Eq. 11): the selection logic on hand numbers, dropped groups really dropped for
every method, the exhausted-rounds behaviour, and equality with TRL when nothing is dropped."""

from __future__ import annotations

import math

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import exploration_trl as et
from exploration_trl.core.dynamic_sampling import GroupSelector, group_varies, rows_of_groups
from helpers import max_param_diff, toy_checkpoint, toy_dataset, train

NAN = math.nan
#: Prompts of `helpers.toy_dataset` whose reward is constant below: their groups never vary.
CONSTANT_PROMPTS = ("cc", "aa")


def partly_constant_reward(completions, prompts, **kwargs):
    """0 for the CONSTANT_PROMPTS, distinct characters otherwise (varies within a group of the toy model)."""
    return [0.0 if p in CONSTANT_PROMPTS else len(set(c)) / 8 for p, c in zip(prompts, completions, strict=True)]


def diverse_reward(completions, **kwargs):
    return [len(set(c)) / 8 for c in completions]


def constant_reward(completions, **kwargs):
    return [0.5] * len(completions)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


# ---------------------------------------------------------------------- selection logic, hand numbers
def test_group_varies_by_correctness_hand_numbers():
    # G = 3, threshold 0.5: [all wrong (0.1 format bonus differs)], [mixed], [all right], [NaN counts as wrong]
    rewards = torch.tensor([0.1, 0.0, 0.1, 1.1, 0.0, 1.0, 1.0, 1.1, 1.0, NAN, 1.0, NAN])
    assert group_varies(rewards, 3, "correct", 0.5).tolist() == [False, True, False, True]
    # threshold 0 (the package default): 0.1 is then correct, so the first group is mixed
    assert group_varies(rewards, 3, "correct", 0.0).tolist() == [True, True, False, True]


def test_group_varies_by_reward_hand_numbers():
    rewards = torch.tensor([0.1, 0.0, 0.1, 1.0, 1.0, 1.0, 2.0, NAN, 2.0, 3.0, NAN, NAN, 0.5, 0.5, 0.5 + 1e-3])
    # differs; all equal; equal among the finite ones; one finite value; differs by 1e-3 (> REWARD_ATOL)
    assert group_varies(rewards, 3, "reward").tolist() == [True, False, False, False, True]
    assert group_varies(torch.tensor([1.0, 1.0 + 1e-8]), 2, "reward").tolist() == [False]  # float noise is equal
    with pytest.raises(ValueError, match="metric must be one of correct, reward; got 'acc'"):
        group_varies(rewards, 3, "acc")
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_varies(rewards, 4, "reward")


def test_selector_keeps_first_varying_groups_in_round_order():
    sel = GroupSelector(needed=3)
    sel.add_round([True, False, False])
    assert not sel.full
    sel.add_round([False, True, True])  # reaches 3 exactly
    assert sel.full
    out = sel.finish()
    assert out.kept == [(0, 0), (1, 1), (1, 2)] and out.filled == [] and out.dropped == 3 and out.rounds == 2


def test_selector_discards_surplus_and_fills_with_earliest_dropped():
    sel = GroupSelector(needed=2)
    sel.add_round([True, True, True])  # one varying group too many: the surplus (0, 2) is discarded
    assert sel.finish().groups == [(0, 0), (0, 1)]
    sel = GroupSelector(needed=4)
    sel.add_round([False, True, False])
    sel.add_round([False, False, True])
    out = sel.finish()  # rounds ran out with 2 of 4: the two earliest dropped groups fill the batch
    assert out.kept == [(0, 1), (1, 2)] and out.filled == [(0, 0), (0, 2)] and out.dropped == 4
    assert rows_of_groups([(1, 2), (0, 0)], 2) == [(1, 4), (1, 5), (0, 0), (0, 1)]
    with pytest.raises(ValueError, match="needed must be >= 1"):
        GroupSelector(0)


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize("key,value,message", [
    ("dynamic_sampling_metric", "acc", "dynamic_sampling_metric must be one of correct, reward; got 'acc'"),
    ("dynamic_sampling_on_exhausted", "skip", "dynamic_sampling_on_exhausted must be one of fill, error; got 'skip'"),
    ("dynamic_sampling_max_rounds", -1, "dynamic_sampling_max_rounds is -1 but must be an integer >= 0"),
])
def test_bad_config_is_one_line_error(tmp_path, key, value, message):
    with pytest.raises(ValueError, match=message) as err:
        et.ExplorationGRPOConfig(output_dir=str(tmp_path), use_cpu=True, dynamic_sampling=True, **{key: value})
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- training
def _dumps(folder):
    return [torch.load(p) for p in sorted(folder.glob("rollout*_rank0.pt"))]


def _ds_log(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("method", ["grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov", "progrpo+casp"])
def test_constant_groups_are_dropped_for_every_method(method, ckpt, tmp_path):
    """Groups of the constant-reward prompts never reach the advantage hook, TRL's loss, or the logged table; the
    batch keeps its size. steps_per_generation=2: TRL's own old-log-prob pass (and CaSP's rollout candidates) run
    on the final batch, 2 groups per generation batch."""
    cls = et.get_trainer_class(method)
    seen = []

    def reward(completions, prompts, **kwargs):
        seen.extend(prompts)
        return partly_constant_reward(completions, prompts)

    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=reward, max_steps=4, steps_per_generation=2,
                    dynamic_sampling=True, dynamic_sampling_metric="reward", debug_rollout_dir=str(tmp_path / "d"))
    dumps = _dumps(tmp_path / "d")
    assert len(dumps) == 2  # 4 steps, a generation batch every 2
    for d in dumps:
        assert d["rewards"].numel() == 8 and d["completion_ids"].size(0) == 8
        assert group_varies(d["rewards"], 4, "reward").all()  # the hook saw only varying groups
        if d["completion_logps"] is not None:  # ProGRPO / DS-GRPO: the rollout statistics are the kept rows'
            assert d["completion_logps"].shape == d["completion_ids"].shape
    assert set(seen) & set(CONSTANT_PROMPTS), "the test reward never met a constant prompt: nothing to drop"
    assert not set(trainer._logs["prompt"]) & set(CONSTANT_PROMPTS)
    assert sum(_ds_log(trainer, "dynamic_sampling/dropped_groups")) >= 1
    assert max(_ds_log(trainer, "dynamic_sampling/rounds")) >= 2
    assert _ds_log(trainer, "dynamic_sampling/filled_groups") == [0.0, 0.0]


def test_correct_metric_drops_all_wrong_groups_with_varying_format_bonus(ckpt, tmp_path):
    """DAPO's Eq. 11 judges correctness: an all-wrong group whose format bonus differs is dropped under
    `correct` although its total rewards differ."""
    def reward(completions, prompts, **kwargs):
        bonus = [0.1 * (len(c) % 2) for c in completions]  # a format bonus that varies
        return [b + (1.0 if p in ("ab", "ba") and "a" in c else 0.0) for p, c, b in zip(prompts, completions, bonus)]

    trainer = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path, reward=reward,
                    max_steps=2, dynamic_sampling=True, dynamic_sampling_metric="correct", correct_reward_threshold=0.5,
                    dynamic_sampling_max_rounds=6, debug_rollout_dir=str(tmp_path / "d"))
    filled = _ds_log(trainer, "dynamic_sampling/filled_groups")
    dumps = _dumps(tmp_path / "d")
    assert len(dumps) == len(filled) == 2
    for d, n_filled in zip(dumps, filled, strict=True):
        assert group_varies(d["rewards"], 4, "correct", 0.5).sum() == 1 - n_filled  # 1 group per step
    assert sum(_ds_log(trainer, "dynamic_sampling/dropped_groups")) >= 1


def test_exhausted_rounds_fill_and_warn_once(ckpt, tmp_path):
    with pytest.warns(UserWarning, match="the batch was filled with 1 groups that do not") as record:
        trainer = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path, reward=constant_reward,
                        max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    assert sum("dynamic_sampling:" in str(w.message) for w in record) == 1  # warned once over 2 steps
    assert _ds_log(trainer, "dynamic_sampling/rounds") == [3.0, 3.0]  # 1 + 2 extra rounds, every step
    assert _ds_log(trainer, "dynamic_sampling/filled_groups") == [1.0, 1.0]
    assert _ds_log(trainer, "dynamic_sampling/dropped_groups") == [3.0, 3.0]
    assert _ds_log(trainer, "dynamic_sampling/kept_frac") == [0.0, 0.0]


def test_exhausted_rounds_error_when_asked(ckpt, tmp_path):
    with pytest.raises(RuntimeError, match="after 2 generation rounds only 0 of 1 groups had rewards that vary"):
        train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path, reward=constant_reward,
              max_steps=1, dynamic_sampling=True, dynamic_sampling_max_rounds=1, dynamic_sampling_on_exhausted="error")


#: Each method at its neutral values, where it trains exactly as TRL (as tests/test_equivalence.py; off-policy here,
#: so the Cov presets' clip ranges are set back to TRL's).
NEUTRAL = {
    "grpo": {},
    "progrpo": dict(progrpo_alpha=0.0),
    "dsgrpo": dict(ds_gamma_p=0.0, ds_gamma_n=0.0),
    "casp": dict(casp_alpha=0.0, casp_top1_penalty=1.0),
    "kl_cov": dict(kl_cov_ratio=0.0, epsilon=0.2),
    "clip_cov": dict(clip_cov_ratio=0.0, clip_cov_lb=1e8, clip_cov_ub=1e9, epsilon=0.2),
}


@pytest.fixture(scope="module")
def trl_reference(ckpt, tmp_path_factory):
    """TRL's GRPOTrainer, 4 steps, a generation batch every 2 steps (TRL computes old log-probs)."""
    return train(GRPOTrainer, GRPOConfig, ckpt, tmp_path_factory.mktemp("trl"), reward=diverse_reward,
                 epsilon_high=0.28, steps_per_generation=2, max_steps=4)


@pytest.mark.parametrize("method", list(NEUTRAL))
def test_nothing_dropped_equals_trl(method, ckpt, trl_reference, tmp_path):
    """Every group varies: dynamic sampling keeps round 0 as it is, and training equals TRL's GRPOTrainer."""
    cls = et.get_trainer_class(method)
    trainer = train(cls, cls.config_class, ckpt, tmp_path, reward=diverse_reward, epsilon_high=0.28,
                    steps_per_generation=2, max_steps=4, dynamic_sampling=True, dynamic_sampling_metric="reward",
                    **NEUTRAL[method])
    assert _ds_log(trainer, "dynamic_sampling/dropped_groups") == [0.0, 0.0]  # guards against a vacuous pass
    assert max_param_diff(trl_reference, trainer) <= 1e-6


@pytest.mark.parametrize("scale_rewards", ["group", "batch"])
def test_advantages_are_normalised_over_kept_groups_only(scale_rewards, ckpt, tmp_path):
    """TRL's advantages of the final batch, by hand from its rewards: group mean, and the std of the group or of the
    whole kept batch (`scale_rewards`), with TRL's 1e-4. Dropped groups take no part in either."""
    train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path, reward=partly_constant_reward,
          max_steps=4, per_device_train_batch_size=8, scale_rewards=scale_rewards, dynamic_sampling=True,
          dynamic_sampling_metric="reward", debug_rollout_dir=str(tmp_path / "d"))
    dumps = _dumps(tmp_path / "d")
    assert len(dumps) == 4
    for d in dumps:
        r = d["rewards"].view(-1, 4).double()
        assert (r.min(dim=1).values < r.max(dim=1).values).all()
        std = r.std(dim=1, keepdim=True) if scale_rewards == "group" else r.flatten().std()
        expected = ((r - r.mean(dim=1, keepdim=True)) / (std + 1e-4)).flatten()
        assert torch.allclose(d["advantages"].double(), expected, atol=1e-5)


def test_dropping_changes_training(ckpt, tmp_path):
    """The counterpart of the test above: with groups dropped, training differs from dynamic_sampling: false."""
    off = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path / "off",
                reward=partly_constant_reward, max_steps=4)
    on = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path / "on",
               reward=partly_constant_reward, max_steps=4, dynamic_sampling=True, dynamic_sampling_metric="reward")
    assert sum(_ds_log(on, "dynamic_sampling/dropped_groups")) >= 1
    assert max_param_diff(off, on) > 1e-5


def test_unsupported_setups_are_one_line_errors(ckpt, tmp_path):
    from datasets import IterableDataset

    stream = IterableDataset.from_generator(lambda: iter({"prompt": p} for p in ["ab", "ba"] * 4))
    args = et.ExplorationGRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4,
                                    num_generations=4, max_steps=1, report_to=[], dynamic_sampling=True)
    with pytest.raises(ValueError, match="dynamic_sampling does not support an IterableDataset yet; set "
                                         "dynamic_sampling: false"):
        et.ExplorationGRPOTrainer(model=ckpt, reward_funcs=diverse_reward, args=args, train_dataset=stream)


def test_eval_batches_are_not_filtered(ckpt, tmp_path):
    """Evaluation scores every prompt: dynamic sampling filters training batches only (DAPO, verl)."""
    trainer = train(et.ExplorationGRPOTrainer, et.ExplorationGRPOConfig, ckpt, tmp_path, reward=constant_reward,
                    max_steps=1, dynamic_sampling=True, dynamic_sampling_max_rounds=0, eval_strategy="no")
    trainer.model.eval()
    out = trainer._generate_and_score_completions(list(toy_dataset(4)))
    assert out["completion_ids"].size(0) == 4
    assert not [k for k in trainer._metrics["eval"] if k.startswith("dynamic_sampling/")]
    assert _ds_log(trainer, "dynamic_sampling/rounds") == [1.0]  # only the training step was filtered


def test_replayed_generation_logps_equal_a_recomputed_pass(ckpt, tmp_path):
    """On-policy ProGRPO reads the rollout log-probs from generation; with dropped groups those of the kept rows
    are replayed. They equal the log-probs an added forward pass recomputes, step by step, and training equals.

    Calibrated on a null and a mutation (2026-11-28): per token the replayed log-probs differ from the recomputed
    ones by <= 2.4e-6 (cached versus full attention in float32); replaying the neighbouring row's log-probs differs by
    0.61. Training is compared under SGD, where a parameter difference is linear in the gradient's: 7.5e-9 (one ulp)
    here and with 1e-6 noise added to the recomputed log-probs, 9.5e-6 for the mutation. Under AdamW at this learning
    rate the 1e-6 noise alone moves parameters by 1.2e-4 (Adam normalises near-zero gradients), so it cannot tell a
    wrong replay (0.1) from float noise at a tight bound."""
    common = dict(reward=partly_constant_reward, max_steps=3, dynamic_sampling=True, dynamic_sampling_metric="reward",
                  progrpo_alpha=5.0, correct_reward_threshold=0.4,  # mixed groups, so ProGRPO shifts advantages
                  optim="sgd")
    base = et.get_trainer_class("progrpo")
    added_passes = []
    logps = {True: [], False: []}

    class Counting(base):
        def _rollout_pass(self, output):
            added_passes.append(self.args.rollout_logps_from_generation)
            return super()._rollout_pass(output)

        def _compute_advantages(self, batch):
            logps[self.args.rollout_logps_from_generation].append(batch.completion_logps.detach().clone())
            return super()._compute_advantages(batch)

    replayed = train(Counting, base.config_class, ckpt, tmp_path / "gen", rollout_logps_from_generation=True, **common)
    assert added_passes == []  # the replayed generation log-probs were used, not an added pass
    recomputed = train(Counting, base.config_class, ckpt, tmp_path / "pass", rollout_logps_from_generation=False,
                       **common)
    assert added_passes == [False] * 3
    assert sum(_ds_log(replayed, "dynamic_sampling/dropped_groups")) >= 1
    assert max(_ds_log(replayed, "progrpo/adjustment_abs_mean")) > 0.01  # the log-probs were used
    assert len(logps[True]) == len(logps[False]) == 3
    for step, (gen, recomputed_logps) in enumerate(zip(logps[True], logps[False], strict=True)):
        assert gen.abs().max() > 0.1, step  # real log-probs, not the zero padding
        torch.testing.assert_close(gen, recomputed_logps, rtol=0, atol=1e-5, msg=f"step {step}")
    assert max_param_diff(replayed, recomputed) <= 1e-7


def test_train_help_lists_the_keys(capsys):
    from exploration_trl.cli import main

    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for key, default in (("dynamic_sampling", "False"), ("dynamic_sampling_metric", "'correct'"),
                         ("dynamic_sampling_max_rounds", "10"), ("dynamic_sampling_on_exhausted", "'fill'")):
        assert f"  {key} = {default}" in out, key
    assert "DAPO's dynamic sampling (Sec. 3.2, Eq. 11): drop groups whose rewards do not" in out
