"""LoRA / PEFT: every method trains only the adapter, saves only the adapter, takes its reference log-probs from the
disabled adapter (TRL's way of getting the base model when `beta > 0`), and the CLI accepts TRL's `ModelConfig`
LoRA flags."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

import exploration_trl as et
from exploration_trl.cli import main
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

METHODS = ("grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov")
TARGETS = ["q_proj", "v_proj"]
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


@pytest.fixture(scope="module")
def base_params(ckpt):
    return {n: p.detach().clone() for n, p in AutoModelForCausalLM.from_pretrained(ckpt).named_parameters()}


def base_name(peft_name: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight` -> `model.layers.0.self_attn.q_proj.weight`."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@torch.no_grad()
def completion_logps(model, out):
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    t = out["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -t - 1:-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("method", METHODS)
def test_lora_training(ckpt, base_params, tmp_path, method):
    cls = et.get_trainer_class(method)
    args = cls.config_class(**grpo_kwargs(tmp_path / "run", max_steps=2, beta=0.1, temperature=TEMPERATURE))
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset(), peft_config=peft_config)
    assert isinstance(trainer.model, PeftModel)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # With a fresh adapter TRL loads no reference model: the reference is the model with the adapter disabled.
    assert trainer.ref_model is None

    trainer.train()
    assert trainer.state.global_step == 2

    # Only the adapter moved; every base weight is bit-identical to the checkpoint.
    changed_lora = 0
    for name, param in trainer.model.named_parameters():
        if "lora_" in name:
            changed_lora += bool(name.endswith("lora_B.default.weight") and param.detach().abs().max() > 0)
        else:
            assert torch.equal(param.detach(), base_params[base_name(name)]), name
    assert changed_lora > 0, "the LoRA B matrices are still zero: the adapter did not train"

    # save_model writes the adapter only, and it reloads onto the base checkpoint.
    out_dir = tmp_path / "saved"
    trainer.save_model(str(out_dir))
    files = {p.name for p in out_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert not any(f.startswith("model") and f.endswith((".safetensors", ".bin")) for f in files), files
    saved = json.loads((out_dir / "adapter_config.json").read_text())
    assert saved["r"] == 4 and set(saved["target_modules"]) == set(TARGETS)
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ckpt), str(out_dir)).eval()

    # beta > 0: TRL's reference log-probs are the base model's (adapter disabled), the policy's are the adapter's,
    # and the methods' rollout statistics come from the policy, not from that reference pass.
    seen = {}
    compute_advantages = trainer._compute_advantages

    def spy(batch):
        seen["logps"] = batch.completion_logps
        return compute_advantages(batch)

    trainer._compute_advantages = spy
    trainer.model.eval()
    out = trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(4)])
    mask = out["completion_mask"].bool()
    base_model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ref, policy = completion_logps(base_model, out), completion_logps(trainer.model, out)
    torch.testing.assert_close(out["ref_per_token_logps"][mask], ref[mask], rtol=1e-4, atol=1e-5)
    assert (ref[mask] - policy[mask]).abs().max() > 1e-4, "adapter too small to tell policy from reference"
    torch.testing.assert_close(completion_logps(reloaded, out)[mask], policy[mask], rtol=1e-4, atol=1e-5)
    assert (seen["logps"] is not None) == (method in ("progrpo", "dsgrpo"))
    if seen["logps"] is not None:  # ProGRPO / DS-GRPO read the rollout policy's log-probs
        torch.testing.assert_close(seen["logps"][mask], policy[mask], rtol=1e-4, atol=1e-5)


def test_cli_lora_flags(tmp_path):
    """`exploration-trl train --use_peft true --lora_r 4 ...` (TRL's ModelConfig flags) trains and saves an adapter."""
    out_dir = tmp_path / "out"
    config = {
        "method": "casp", "model_name_or_path": "toy", "dataset_name": "countdown", "max_train_samples": 8,
        "reward_funcs": ["countdown"], "output_dir": str(out_dir), "use_cpu": True, "bf16": False, "max_steps": 2,
        "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
        "learning_rate": 5.0e-2, "save_strategy": "no", "report_to": "none", "logging_steps": 1, "seed": 0,
        "disable_tqdm": True,
    }
    path = tmp_path / "toy_lora.yaml"
    path.write_text(yaml.safe_dump(config))
    rc = main(["train", "--config", str(path), "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8",
               "--lora_dropout", "0.0", "--lora_target_modules", "q_proj", "v_proj"])
    assert rc == 0
    files = {p.name for p in out_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert "model.safetensors" not in files
    saved = json.loads((out_dir / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8 and set(saved["target_modules"]) == {"q_proj", "v_proj"}
    # The adapter points at the toy base the CLI built, and loads onto it.
    base_dir = out_dir / "toy_base"
    assert (base_dir / "config.json").is_file()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(out_dir))
    assert any("lora_A" in n for n, _ in model.named_parameters())
