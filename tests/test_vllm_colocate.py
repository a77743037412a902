"""Colocate training through a real vLLM engine on the CPU, the methods in `METHODS` (`-m vllm`; docs/vllm.md).

Each trainer starts its own engine in this process and closes it (`close_vllm`) before the next one starts. For
grpo, progrpo, dsgrpo, casp, kl_cov, clip_cov and progrpo+casp: 3 steps with `use_vllm: true, vllm_mode: colocate`
and TRL's vLLM importance-sampling correction on (its default), on the head_dim-32 toy. Asserted per method:
- the method's own metrics and the exploration metrics are logged, and TRL's importance-sampling metrics too;
- the method is active: its weights differ from a GRPO run's (GRPO run twice gives identical weights, so the
  difference is the method's, not sampling noise);
- `sampling/sampling_logp_difference/mean` < 1e-2 on every step: the weights the trainer updated reached vLLM
  (a control whose engine keeps the step-0 weights logs 0.6 and more once the weights moved).
Plus LoRA (the merged adapter reaches vLLM), and the methods reading vLLM's own log-probs instead of a forward pass
when TRL computes none (importance-sampling correction off).
"""

from __future__ import annotations

import glob
from functools import cache

import pytest
import torch
from helpers import distinct_char_reward, grpo_kwargs, toy_dataset
from vllm_helpers import (
    COLOCATE,
    LOGP_DIFF_TOL,
    logged_steps,
    param_diff,
    params_of,
    vllm_checkpoint,
)

import exploration_trl as et

pytestmark = pytest.mark.vllm

METHODS = ["grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov", "progrpo+casp"]
#: Settings strong enough that 3 toy steps visibly differ from GRPO (as in tests/mp_driver.py).
METHOD_SETTINGS = {
    "grpo": {},
    "progrpo": {"progrpo_alpha": 20.0},
    "dsgrpo": {"ds_gamma_p": 0.5, "ds_gamma_n": 0.5},
    "casp": {"casp_alpha": 0.5, "casp_entropy_quantile": 0.5, "casp_top1_penalty": 2.0},
    # Off-policy by design (their default is 8 optimizer steps per rollout): 2 here, so 3 steps hold 2 rollouts.
    "kl_cov": {"kl_cov_ratio": 0.5, "kl_cov_coef": 1.0, "steps_per_generation": 2},
    "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9, "steps_per_generation": 2},
    "progrpo+casp": {"progrpo_alpha": 20.0, "casp_alpha": 0.5, "casp_entropy_quantile": 0.5, "casp_top1_penalty": 2.0},
}
METHOD_METRICS = {
    "grpo": [],
    "progrpo": ["progrpo/confidence_mean", "progrpo/prompt_confidence_mean", "progrpo/adjustment_abs_mean"],
    "dsgrpo": ["dsgrpo/bonus_mean", "dsgrpo/penalty_mean"],
    "casp": ["casp/forking_frac", "casp/top1_penalty_frac"],
    "kl_cov": ["kl_cov/selected_tokens", "kl_cov/cov_threshold"],
    "clip_cov": ["clip_cov/selected_tokens", "clip_cov/cov_threshold"],
}
EXPLORATION_METRICS = ["exploration/lambda_1", "exploration/lambda_sample", "exploration/branching_factor",
                       "exploration/pass_at_G", "exploration/unique_completions_per_group"]
TRL_IS_METRICS = ["sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean"]
#: distinct_char_reward is 1 when all 8 characters differ and 0.875 or less otherwise: 0.95 makes mixed groups (the
#: only groups ProGRPO changes, and the split DS-GRPO's bonus and penalty need).
CORRECT = {"correct_reward_threshold": 0.95}
ACTIVE_TOL = 1e-4  # a method is active when some parameter ends this far from GRPO's (GRPO vs GRPO: exactly 0)
STEPS = 3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return vllm_checkpoint(tmp_path_factory.mktemp("vllm_toy") / "ckpt")


def make_trainer(ckpt, out, method, peft_config=None, **overrides):
    cls = et.get_trainer_class(method)
    kwargs = grpo_kwargs(out, **{"temperature": 0.7, "max_steps": STEPS, **COLOCATE, **CORRECT,
                                 "exploration_metrics": True, **METHOD_SETTINGS[method], **overrides})
    return cls(model=ckpt, reward_funcs=distinct_char_reward, args=cls.config_class(**kwargs),
               train_dataset=toy_dataset(), peft_config=peft_config)


def run(ckpt, out, method, before_train=None, **overrides) -> dict:
    """Train `method` for 3 steps through vLLM; return its logs, parameters and trainer facts; close the engine."""
    trainer = make_trainer(ckpt, out, method, **overrides)
    try:
        generation = type(trainer.vllm_generation).__name__
        extra = before_train(trainer) if before_train else None
        trainer.train()
        return {"logs": logged_steps(trainer), "params": params_of(trainer), "generation": generation,
                "extra": extra, "trainer": trainer}
    finally:
        trainer.close_vllm()


@pytest.fixture(scope="module")
def runs(ckpt, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_runs")

    @cache
    def get(method: str) -> dict:
        return run(ckpt, tmp / method.replace("+", "_"), method)

    return get


def test_vllm_runs_on_the_cpu_with_the_reload_sync(runs):
    from exploration_trl.boundary.vllm_support import vllm_runs_on_cpu

    assert vllm_runs_on_cpu()
    assert runs("grpo")["generation"] == "CPUVLLMGeneration"


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_through_vllm_colocate(runs, method):
    result = runs(method)
    logs = result["logs"]
    assert len(logs) == STEPS
    wanted = EXPLORATION_METRICS + TRL_IS_METRICS + [k for part in method.split("+") for k in METHOD_METRICS[part]]
    missing = [k for k in wanted if not any(k in entry for entry in logs)]
    assert not missing, missing
    # Every step that generated (all 3; KL-Cov/Clip-Cov: steps 0 and 2) logs TRL's vLLM log-prob difference.
    rollouts = [entry for entry in logs if "completions/mean_length" in entry]
    assert len(rollouts) >= 2
    for step, entry in enumerate(rollouts):
        assert not [k for k in TRL_IS_METRICS if k not in entry], (step, entry)
        assert entry["sampling/sampling_logp_difference/mean"] < LOGP_DIFF_TOL, (step, entry)
    assert any(entry["grad_norm"] > 0 for entry in logs)
    if method != "grpo":
        assert param_diff(result["params"], runs("grpo")["params"]) > ACTIVE_TOL


def test_grpo_through_vllm_is_reproducible(ckpt, runs, tmp_path):
    """A second GRPO run equals the first exactly: the methods' distance from GRPO is theirs, not sampling noise."""
    again = run(ckpt, tmp_path / "grpo2", "grpo")
    assert param_diff(again["params"], runs("grpo")["params"]) == 0.0


def test_stale_engine_is_detected(ckpt, runs, tmp_path):
    """Control: with the sync after step 0 switched off, vLLM samples from old weights and TRL's log-prob difference
    grows far past the tolerance, so the < 1e-2 above really means the weights reached vLLM."""

    def sync_once(trainer):
        generation, calls = trainer.vllm_generation, []
        original = generation.sync_weights

        def sync_weights():
            if not calls:
                original()
            calls.append(1)

        generation.sync_weights = sync_weights
        return calls

    stale = run(ckpt, tmp_path / "stale", "grpo", before_train=sync_once)
    assert len(stale["extra"]) == STEPS  # TRL asked for a sync on every step
    diffs = [e["sampling/sampling_logp_difference/mean"] for e in stale["logs"]]
    assert diffs[0] < LOGP_DIFF_TOL and min(diffs[1:]) > 10 * LOGP_DIFF_TOL, diffs
    synced = [e["sampling/sampling_logp_difference/mean"] for e in runs("grpo")["logs"]]
    assert max(synced) < LOGP_DIFF_TOL


def test_lora_adapter_is_merged_into_vllm(ckpt, tmp_path):
    """LoRA: TRL merges the adapter for the sync and unmerges it; vLLM then samples from base + adapter."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    result = run(ckpt, tmp_path / "lora", "casp", peft_config=lora, learning_rate=0.2)
    trainer = result["trainer"]
    diffs = [e["sampling/sampling_logp_difference/mean"] for e in result["logs"]]
    assert max(diffs) < LOGP_DIFF_TOL, diffs
    # The adapter changed the model's log-probs far more than that difference: vLLM saw the merged weights.
    model = trainer.model
    assert not any(getattr(m, "merged", False) for m in model.modules())  # unmerged after every sync
    ids = torch.tensor([trainer.processing_class("abcabc")["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(ckpt)
    with torch.no_grad():
        tuned = torch.log_softmax(model(input_ids=ids).logits / 0.7, -1)
        plain = torch.log_softmax(base(input_ids=ids).logits / 0.7, -1)
    assert (tuned - plain).abs().mean().item() > 10 * max(diffs)
    assert all(n.startswith("base_model") for n, _ in model.named_parameters())  # still a PEFT model


def _count_nograd_passes(trainer):
    calls = []
    original = trainer._get_per_token_logps_and_entropies

    def counting(*args, **kwargs):
        if not torch.is_grad_enabled():
            calls.append(args[1].shape)
        return original(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    return calls


@pytest.mark.parametrize("method", ["dsgrpo", "progrpo"])
def test_methods_read_vllm_logprobs_without_a_forward(ckpt, tmp_path, method):
    """Importance-sampling correction off, on-policy: TRL computes no old log-probs, and DS-GRPO / ProGRPO take
    vLLM's (completions; ProGRPO's prompt tokens from vLLM's `prompt_logprobs` at temperature 1) instead of running
    a forward pass. The values are the step's policy's: they match the checkpoint's own on the first rollout."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / method
    result = run(ckpt, out, method, before_train=_count_nograd_passes, vllm_importance_sampling_correction=False,
                 temperature=1.0, debug_rollout_dir=str(out / "rollouts"))
    assert result["extra"] == []  # no no-grad forward at all: neither TRL's nor an added one
    for entry in result["logs"]:
        assert entry["vllm/rollout_logps_from_vllm"] == 1.0
        if method == "progrpo":
            assert entry["vllm/prompt_logps_from_vllm"] == 1.0
        assert "sampling/sampling_logp_difference/mean" not in entry  # TRL's correction really was off
    first = torch.load(sorted(glob.glob(str(out / "rollouts" / "*.pt")))[0])
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    ids = torch.cat([first["prompt_ids"], first["completion_ids"]], 1)
    mask = torch.cat([first["prompt_mask"], first["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    own = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # temperature 1
    width = first["completion_ids"].size(1)
    completion = first["completion_mask"].bool()
    gap = (first["completion_logps"] - own[:, -width:])[completion].abs()
    assert gap.mean() < LOGP_DIFF_TOL and gap.max() < 5 * LOGP_DIFF_TOL, gap
    if method == "progrpo":
        prompt_mask = first["prompt_logps_mask"].bool()
        assert prompt_mask.any()
        plen = first["prompt_ids"].size(1)
        gap = (first["prompt_logps"][:, 1:] - own[:, : plen - 1])[prompt_mask[:, 1:]].abs()
        assert gap.mean() < LOGP_DIFF_TOL, gap


def test_truncated_sampling_falls_back_to_the_trainers_pass(ckpt, tmp_path):
    """With top_p < 1 vLLM's processed log-probs are of the truncated distribution, not TRL's log_softmax(z / T): the
    rollout statistics then come from one no-grad pass of the trainer's model per step, as before."""
    result = run(ckpt, tmp_path / "topp", "dsgrpo", before_train=_count_nograd_passes,
                 vllm_importance_sampling_correction=False, top_p=0.9)
    assert len(result["extra"]) == STEPS
    assert all("vllm/rollout_logps_from_vllm" not in entry for entry in result["logs"])
