"""The GPU checks that need no Hub (issue 35), run here in their tiny CPU forms.

* `exploration_trl.random_model`: Qwen2.5-0.5B's architecture from the shipped config (at random weights) and a
  stand-in tokenizer of its vocabulary size; a checkpoint directory that loads like any other.
* `benchmarks/overhead.py --dry-run`: the device mode's code end to end (every reported number present).
* `scripts/gpu_smoke.sh` with `SMOKE_MODEL=random:toy SMOKE_ALLOW_CPU=1`: a training run and the eval on the shipped
  GSM8K problems, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exploration_trl.random_model import architectures, build_random_model, load_config, resolve

REPO = Path(__file__).resolve().parents[1]


def test_qwen_architecture_matches_the_published_model():
    config = load_config("qwen2.5-0.5b")
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (
        "qwen2", 896, 24, 14, 2, 4864, 151936)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 1e6
    model, tokenizer = build_random_model("qwen2.5-0.5b", device="meta")  # shapes only, no weights
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2.5-0.5B: 0.49B parameters
    assert len(tokenizer) == 151936 and model.dtype == torch.bfloat16
    assert tokenizer.decode(tokenizer("Janet has 3 ducks.\n")["input_ids"]) == "Janet has 3 ducks.\n"
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_random_checkpoint_loads_offline_and_is_deterministic(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve("random:toy", tmp_path, dtype=torch.float32)
    assert path == str(tmp_path / "random-toy") and resolve("some/model", tmp_path) == "some/model"
    loaded = AutoModelForCausalLM.from_pretrained(path)
    assert len(AutoTokenizer.from_pretrained(path)) == loaded.config.vocab_size == 512
    again, _ = build_random_model("toy", dtype=torch.float32)
    for (name, a), b in zip(loaded.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert "qwen2.5-0.5b" in architectures()
    with pytest.raises(ValueError, match="no shipped model config 'qwen9'; choose one of: qwen2.5-0.5b, toy"):
        load_config("qwen9")


def test_overhead_device_mode_dry_run(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, "benchmarks/overhead.py", "--dry-run", "--methods", "casp",
                           "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("device: cpu") and "trl 1.16" in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["trials"]) == {"trl", "casp"} and report["workload"]["model"] == "random:toy"
    for method, modes in report["trials"].items():
        assert set(modes) == {"logging10", "every_step"}
        for r in modes.values():
            assert r["train_only_s"] > 0 and r["generating_s"] > 0 and r["syncs_train_only"] > 0, (method, r)
            assert r["syncs_generating"] > r["syncs_train_only"]
    summary = report["summary"]["casp"]
    assert summary["logging10"]["train_only_x_trl"] > 0 and "meets_goals" in summary
    assert summary["logging10"]["extra_syncs_train_only"] <= 2  # the sync budget, in the benchmark's own run


def test_gpu_smoke_tiny_cpu_form_runs_offline(tmp_path):
    env = {**os.environ, "SMOKE_MODEL": "random:toy", "SMOKE_ALLOW_CPU": "1", "SMOKE_LAUNCHER": "python",
           "SMOKE_METHODS": "casp", "SMOKE_VARIANTS": "full", "SMOKE_MAX_STEPS": "1", "SMOKE_VLLM": "0",
           "SMOKE_MAX_COMPLETION_LENGTH": "8", "SMOKE_OUT": str(tmp_path), "PYTHON": sys.executable,
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    logs = "\n".join(p.read_text()[-1500:] for p in tmp_path.glob("*.log"))
    assert proc.returncode == 0, proc.stdout[-3000:] + logs
    assert "gpu_smoke: all 2 runs passed" in proc.stdout
    assert "model: random:toy at random weights" in proc.stdout
    assert (tmp_path / "casp-full" / "model.safetensors").is_file()
    results = json.loads((tmp_path / "eval-base" / "results.json").read_text())
    assert json.dumps(results).count("gsm8k") >= 1
