"""The paper-fidelity options, through the real trainers, against hand-worked numbers.

- DS-GRPO `ds_logp_granularity` (token | sequence_mean | sequence_sum) reaches `core.dsgrpo_advantages`;
- ProGRPO `progrpo_skip_groups`, `progrpo_keep_sign`, `progrpo/sign_flip_frac`, `progrpo_prompt_tokens: user`;
- the STILL position bonus schedule (step 200 for 100 steps when enabled);
- CaSP `casp_warmup_steps` (plain GRPO first);
- Clip-Cov's recipe clip ratios (1, 1) and its warning when a step selects no token;
- KL-Cov's warning when every rollout feeds a single update, and its 8-updates default.
"""

import math
import warnings

import pytest
import torch

import exploration_trl as et
from exploration_trl.toy import build_toy_tokenizer
from exploration_trl.boundary.prompt_tokens import user_token_mask
from exploration_trl.trainers.base import RolloutBatch
from exploration_trl.trainers.components.still import position_bonus_active
from helpers import distinct_char_reward, grpo_kwargs, letter_reward, max_param_diff, toy_checkpoint, toy_dataset, train

T = torch.tensor


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def make(method, ckpt, tmp_path, **overrides):
    cls = et.get_trainer_class(method)
    args = cls.config_class(**grpo_kwargs(tmp_path, **overrides))
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())
    trainer.model.train()  # as during training: hooks log to the "train" metrics
    return trainer


def batch(**fields):
    """A 4-row rollout (2 groups of 2) in one process, with hand-picked log-probs."""
    base = dict(
        rewards=T([1.0, 0.0, 1.0, 1.0]), rewards_per_func=T([[1.0], [0.0], [1.0], [1.0]]),
        advantages=T([0.02, -0.02, 0.0, 0.0]), num_generations=2, process_slice=slice(0, 4),
        prompt_ids=torch.ones(4, 3, dtype=torch.long), prompt_mask=torch.ones(4, 3, dtype=torch.long),
        completion_ids=torch.ones(4, 3, dtype=torch.long),
        completion_mask=T([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]).long(),
        num_processes=1, global_step=0,
        completion_logps=T([[-1.0, -2.0, 9.0], [-0.5, -0.5, -3.0], [-4.0, 9.0, 9.0], [-1.0, -1.0, 9.0]]),
        completion_entropies=torch.zeros(4, 3),
        prompt_logps=T([[0.0, -1.0, -2.0]] * 4), prompt_logps_mask=T([[0, 1, 1]] * 4).long(),
    )
    base.update(fields)
    return RolloutBatch(**base)


# ------------------------------------------------------------------------------------------ DS-GRPO
@pytest.mark.parametrize("granularity, expected", [
    # token: A_t - 0.5 * logp_t on correct rows, A_t + 0.5 * logp_t on wrong rows, 0 on padding
    ("token", [[0.52, 1.02, 0.0], [-0.27, -0.27, -1.52], [2.0, 0.0, 0.0], [0.5, 0.5, 0.0]]),
    # sequence_mean: row means -1.5, -4/3, -4, -1
    ("sequence_mean", [0.77, -0.02 - 0.5 * 4 / 3, 2.0, 0.5]),
    # sequence_sum: row sums -3, -4, -4, -2
    ("sequence_sum", [1.52, -2.02, 2.0, 1.0]),
])
def test_dsgrpo_granularity_through_the_trainer(granularity, expected, ckpt, tmp_path):
    trainer = make("dsgrpo", ckpt, tmp_path, ds_gamma_p=0.5, ds_gamma_n=0.5, ds_logp_granularity=granularity)
    trainer._ran_hooks = set()
    out = trainer._compute_advantages(batch())
    torch.testing.assert_close(out, T(expected))
    assert "dsgrpo" in trainer._ran_hooks


def test_dsgrpo_default_is_the_trajectory_form_and_bad_value_is_one_line(ckpt, tmp_path):
    assert et.DSGRPOConfig(**grpo_kwargs(tmp_path)).ds_logp_granularity == "sequence_sum"
    # the trainer at its defaults (gamma 0.01): row sums -3, -4, -4, -2 -> 0.02 + 0.03, -0.02 - 0.04, 0 + 0.04, 0.02
    trainer = make("dsgrpo", ckpt, tmp_path)
    torch.testing.assert_close(trainer._compute_advantages(batch()), T([0.05, -0.06, 0.04, 0.02]))
    with pytest.raises(ValueError, match="ds_logp_granularity must be one of token, sequence_mean, sequence_sum"):
        et.DSGRPOConfig(**grpo_kwargs(tmp_path, ds_logp_granularity="mean"))


def test_dsgrpo_warns_once_when_the_shift_outweighs_the_advantages(ckpt, tmp_path):
    """Row sums -3, -4, -4, -2 (2, 3, 1, 2 valid tokens). gamma 0.5: shifts 1.5, 2, 2, 1 on every token of the row,
    mean |shift| = (3 + 6 + 2 + 2) / 8 = 1.625 against mean |A| = (0.04 + 0.06) / 8 = 0.0125: warned once, at the
    next log (the step itself reads nothing from the device), and logged."""
    trainer = make("dsgrpo", ckpt, tmp_path, ds_gamma_p=0.5, ds_gamma_n=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer._compute_advantages(batch())  # nothing is read on the step
    assert "dsgrpo/shift_abs_mean" not in trainer._metrics["train"]
    trainer._flush_device_metrics()
    assert trainer._metrics["train"]["dsgrpo/shift_abs_mean"][-1] == pytest.approx(1.625)
    assert trainer._metrics["train"]["dsgrpo/advantage_abs_mean"][-1] == pytest.approx(0.0125)
    assert trainer._metrics["train"]["dsgrpo/shift_exceeds_advantage_frac"][-1] == 1.0
    with pytest.warns(UserWarning, match=r"DS-GRPO: the smoothing shift outweighed GRPO's advantages on 100% of the "
                      r"generation batches since the last log \(their means: \|gamma \* L\| 1.62 per token, \|A\| "
                      r"0.0125\).*grows with its length"):
        trainer.log({})
    trainer._compute_advantages(batch())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.log({})  # once per run
    # gamma 0.01 with advantages of size 1: mean |shift| (0.06 + 0.12 + 0.04 + 0.04) / 8 = 0.0325 < 1, no warning
    trainer = make("dsgrpo", ckpt, tmp_path / "small")
    trainer._compute_advantages(batch(advantages=T([1.0, -1.0, 1.0, -1.0])))
    trainer._flush_device_metrics()
    assert trainer._metrics["train"]["dsgrpo/shift_abs_mean"][-1] == pytest.approx(0.0325)
    assert trainer._metrics["train"]["dsgrpo/shift_exceeds_advantage_frac"][-1] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.log({})


def test_dsgrpo_token_granularity_trains_with_ppl_shaping(ckpt, tmp_path):
    """Per-token DS-GRPO advantages then STILL perplexity shaping (which scales each row) run end to end."""
    cls = et.get_trainer_class("dsgrpo")
    trainer = train(cls, cls.config_class, ckpt, tmp_path, ds_gamma_p=0.5, ds_gamma_n=0.5, ppl_shaping_alpha=0.5,
                    max_steps=2, ds_logp_granularity="token")
    assert trainer.state.global_step == 2


# ------------------------------------------------------------------------------------------ ProGRPO
def progrpo_batch():
    # completion confidences (fraction 0.2, k = 1 lowest valid logp): exp(-2), exp(-3), exp(-4), exp(-1)
    # prompt confidence: lowest valid prompt logp -2 -> c_ref = exp(-2) for every row
    return batch()


def test_progrpo_skip_groups_and_sign_flips(ckpt, tmp_path):
    c = [math.exp(-2), math.exp(-3), math.exp(-4), math.exp(-1)]
    ref = math.exp(-2)
    trainer = make("progrpo", ckpt, tmp_path, progrpo_alpha=1.0)
    out = trainer._compute_advantages(progrpo_batch())
    # Algorithm 1 (default): group 2 is all right and keeps A = 0; group 1 mixed: A + (c_ref - c_o)
    torch.testing.assert_close(out, T([0.02 + ref - c[0], -0.02 + ref - c[1], 0.0, 0.0]))
    # row 1 (wrong, A = -0.02) becomes +0.0852: one flip in 4 completions
    trainer._flush_device_metrics()  # the step's metrics wait on the device until the next log
    assert trainer._metrics["train"]["progrpo/sign_flip_frac"][-1] == pytest.approx(0.25)

    trainer = make("progrpo", ckpt, tmp_path / "eq4", progrpo_alpha=1.0, progrpo_skip_groups="all_wrong")
    out = trainer._compute_advantages(progrpo_batch())
    torch.testing.assert_close(out, T([0.02 + ref - c[0], -0.02 + ref - c[1], ref - c[2], ref - c[3]]))

    trainer = make("progrpo", ckpt, tmp_path / "keep", progrpo_alpha=1.0, progrpo_keep_sign=True)
    out = trainer._compute_advantages(progrpo_batch())
    torch.testing.assert_close(out, T([0.02 + ref - c[0], 0.0, 0.0, 0.0]))  # the wrong row is clamped at <= 0
    trainer._flush_device_metrics()  # the step's metrics wait on the device until the next log
    assert trainer._metrics["train"]["progrpo/sign_flip_frac"][-1] == pytest.approx(0.25)  # before clamping


def test_progrpo_skips_by_correctness_under_the_recipe_threshold(ckpt, tmp_path):
    """Graded rewards (accuracy + 0.1 format) with the recipes' threshold 0.5: group 1 [0.1, 0] is all wrong and
    keeps A under both rules; group 2 [1.1, 1.0] is all right: kept by all_equal, shifted by all_wrong (Eq. 4)."""
    c = [math.exp(-2), math.exp(-3), math.exp(-4), math.exp(-1)]
    ref = math.exp(-2)
    graded = batch(rewards=T([0.1, 0.0, 1.1, 1.0]), advantages=T([0.7, -0.7, 0.7, -0.7]))
    trainer = make("progrpo", ckpt, tmp_path, progrpo_alpha=1.0, correct_reward_threshold=0.5)
    torch.testing.assert_close(trainer._compute_advantages(graded), T([0.7, -0.7, 0.7, -0.7]))
    trainer = make("progrpo", ckpt, tmp_path / "eq4", progrpo_alpha=1.0, correct_reward_threshold=0.5,
                   progrpo_skip_groups="all_wrong")
    torch.testing.assert_close(trainer._compute_advantages(graded), T([0.7, -0.7, 0.7 + ref - c[2], -0.7 + ref - c[3]]))
    # threshold 0 counts the format bonus as correct: group 1 looks mixed and is shifted
    trainer = make("progrpo", ckpt, tmp_path / "zero", progrpo_alpha=1.0)
    out = trainer._compute_advantages(graded)
    torch.testing.assert_close(out, T([0.7 + ref - c[0], -0.7 + ref - c[1], 0.7, -0.7]))


def test_progrpo_option_errors(tmp_path):
    with pytest.raises(ValueError, match="progrpo_skip_groups must be one of all_equal, all_wrong; got 'some'"):
        et.ProGRPOConfig(**grpo_kwargs(tmp_path, progrpo_skip_groups="some"))
    with pytest.raises(ValueError, match="progrpo_prompt_tokens must be one of all, user; got 'system'"):
        et.ProGRPOConfig(**grpo_kwargs(tmp_path, progrpo_prompt_tokens="system"))
    defaults = et.ProGRPOConfig(**grpo_kwargs(tmp_path))
    assert (defaults.progrpo_skip_groups, defaults.progrpo_keep_sign, defaults.progrpo_prompt_tokens) == (
        "all_equal", False, "all")


def test_user_token_mask_keeps_only_the_user_message():
    tok = build_toy_tokenizer()
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # left-pad to width len + 2, as TRL lays prompts out
    width = len(ids) + 2
    prompt_ids = torch.tensor([[tok.pad_token_id] * 2 + ids, [tok.pad_token_id] * (width - 3) + ids[-3:]])
    prompt_mask = torch.tensor([[0, 0] + [1] * len(ids), [0] * (width - 3) + [1] * 3])
    mask, fallbacks = user_token_mask([prompt, "plain"], prompt_ids, prompt_mask, tok)
    picked = tok.decode(prompt_ids[0][mask[0]])
    assert picked == "2+2?"
    assert fallbacks == 0
    assert mask[1].tolist() == prompt_mask[1].bool().tolist()  # a plain-text prompt keeps all its tokens
    # A row whose ids do not match the re-rendered template falls back to all of its tokens, and is counted.
    bad = prompt_ids.clone()
    bad[0, -1] = tok.convert_tokens_to_ids("a")
    mask, fallbacks = user_token_mask([prompt, "plain"], bad, prompt_mask, tok)
    assert fallbacks == 1 and mask[0].tolist() == prompt_mask[0].bool().tolist()


def test_progrpo_user_prompt_tokens_in_training(ckpt, tmp_path):
    from datasets import Dataset

    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": p}]}
            for p in ("ab", "ba", "abc", "cab")]
    cls = et.get_trainer_class("progrpo")
    args = cls.config_class(**grpo_kwargs(tmp_path, max_steps=1, progrpo_prompt_tokens="user"))
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=Dataset.from_list(rows))
    seen = {}
    original = trainer._compute_advantages

    def spy(b):
        seen["mask"] = b.prompt_logps_mask.clone()
        seen["ids"] = b.prompt_ids.clone()
        return original(b)

    trainer._compute_advantages = spy
    trainer.train()
    tok = trainer.processing_class
    for ids, m in zip(seen["ids"], seen["mask"], strict=True):
        assert tok.decode(ids[m.bool()]) in ("ab", "ba", "abc", "cab")


# ------------------------------------------------------------------------------------------ STILL
def test_position_bonus_schedule_defaults_to_the_report(ckpt, tmp_path):
    args = et.ExplorationGRPOConfig(**grpo_kwargs(tmp_path, position_bonus_gamma=0.1))
    assert (args.position_bonus_start_step, args.position_bonus_num_steps) == (200, 100)
    trainer = make("grpo", ckpt, tmp_path, position_bonus_gamma=0.1)
    assert [position_bonus_active(trainer.args, s) for s in (0, 199, 200, 299, 300)] == [False, False, True, True, False]
    b = batch(advantages=T([1.0, -1.0, 0.5, 0.0]))
    assert trainer._apply_still_shapers(b.advantages, b).shape == (4,)  # step 0: off
    b = batch(advantages=T([1.0, -1.0, 0.5, 0.0]), global_step=200)
    on = trainer._apply_still_shapers(b.advantages, b)
    assert on.shape == (4, 3) and on[0, 1] > 1.0 and on[1, 2] < -1.0 and on[3].abs().sum() == 0


def test_position_bonus_m_n_d_reach_the_shaper(ckpt, tmp_path):
    """m, n, d of Eq. 8 are config keys; defaults 15, 0.5 (re-centred), 1."""
    args = et.ExplorationGRPOConfig(**grpo_kwargs(tmp_path, position_bonus_gamma=0.1))
    assert (args.position_bonus_scale, args.position_bonus_center, args.position_bonus_direction) == (15.0, 0.5, 1.0)
    # row 1 of the batch has 3 valid tokens, l = [0, 0.5, 1]; A = -1 so A_t = -1 - b_t
    b = batch(advantages=T([1.0, -1.0, 0.5, 0.0]), global_step=0)
    # defaults: b = 0.1 * sigmoid(15 * (l - 0.5)) = [5.53e-5, 0.05, 0.0999447]
    trainer = make("grpo", ckpt, tmp_path, position_bonus_gamma=0.1, position_bonus_start_step=0)
    torch.testing.assert_close(trainer._apply_still_shapers(b.advantages, b)[1], T([-1.0000553, -1.05, -1.0999447]))
    # the report's literal n = -0.5: b = 0.1 * sigmoid(15 * (l + 0.5)) = [0.0999447, 0.1, 0.1], flat
    trainer = make("grpo", ckpt, tmp_path / "lit", position_bonus_gamma=0.1, position_bonus_start_step=0,
                   position_bonus_center=-0.5)
    torch.testing.assert_close(trainer._apply_still_shapers(b.advantages, b)[1], T([-1.0999447, -1.1, -1.1]))
    # d = -1, m = 2, n = 0, gamma 1: b = sigmoid(-2 l) = [0.5, 0.2689414, 0.1192029]
    trainer = make("grpo", ckpt, tmp_path / "d", position_bonus_gamma=1.0, position_bonus_start_step=0,
                   position_bonus_direction=-1.0, position_bonus_scale=2.0, position_bonus_center=0.0)
    torch.testing.assert_close(trainer._apply_still_shapers(b.advantages, b)[1], T([-1.5, -1.2689414, -1.1192029]))
    with pytest.raises(ValueError, match="position_bonus_direction is 0.5 but must be 1 .* or -1"):
        et.ExplorationGRPOConfig(**grpo_kwargs(tmp_path, position_bonus_direction=0.5))


# ------------------------------------------------------------------------------------------ CaSP
def test_casp_warmup_is_plain_grpo(ckpt, tmp_path):
    grpo_cls = et.get_trainer_class("grpo")
    casp_cls = et.get_trainer_class("casp")
    strong = dict(casp_alpha=0.5, casp_entropy_quantile=0.0, casp_top1_penalty=2.0, epsilon_high=0.28)
    # A reward that varies within every group, so both steps have a gradient for CaSP to change.
    grpo = train(grpo_cls, grpo_cls.config_class, ckpt, tmp_path / "grpo", reward=distinct_char_reward, max_steps=2,
                 epsilon_high=0.28)
    warm = train(casp_cls, casp_cls.config_class, ckpt, tmp_path / "warm", reward=distinct_char_reward, max_steps=2,
                 casp_warmup_steps=5, **strong)
    assert max_param_diff(grpo, warm) <= 1e-6
    assert [e["casp/active"] for e in warm.state.log_history if "casp/active" in e] == [0.0, 0.0]
    after = train(casp_cls, casp_cls.config_class, ckpt, tmp_path / "after", reward=distinct_char_reward, max_steps=2,
                  casp_warmup_steps=1, **strong)
    assert [e["casp/active"] for e in after.state.log_history if "casp/active" in e] == [0.0, 1.0]
    assert max_param_diff(grpo, after) > 1e-5


# ------------------------------------------------------------------------------------------ Clip-Cov / KL-Cov
def test_clip_cov_recipe_defaults_and_no_selection_warning(ckpt, tmp_path):
    args = et.ClipCovConfig(**grpo_kwargs(tmp_path))
    assert (args.epsilon, args.epsilon_high) == (1.0, 1.0)
    assert args.steps_per_generation == 8 * args.gradient_accumulation_steps
    cls = et.get_trainer_class("clip_cov")
    with pytest.warns(UserWarning, match=r"clip_cov: no token of a micro-batch had a covariance in \(clip_cov_lb, "
                                         r"clip_cov_ub\) = \(100000000.0, 1000000000.0\)") as record:
        trainer = train(cls, cls.config_class, ckpt, tmp_path / "run", clip_cov_lb=1e8, clip_cov_ub=1e9,
                        steps_per_generation=1, max_steps=2)
    assert sum("clip_cov: no token" in str(w.message) for w in record) == 1  # once
    logged = [e["clip_cov/no_selection_frac"] for e in trainer.state.log_history if "clip_cov/no_selection_frac" in e]
    assert logged == [1.0, 1.0]


def test_kl_cov_warns_when_fully_on_policy(ckpt, tmp_path):
    with pytest.warns(UserWarning, match="kl_cov: every rollout feeds a single optimizer update"):
        make("kl_cov", ckpt, tmp_path, steps_per_generation=1)
    assert et.KLCovConfig(**grpo_kwargs(tmp_path)).steps_per_generation == 8
