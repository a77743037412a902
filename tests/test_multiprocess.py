"""`accelerate launch` with 2 CPU processes (gloo): the advantage hook sees globally gathered data, and the
advantages it returns match a single-process computation on the same batch."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from exploration_trl.core.advantages import group_advantages, progrpo_advantages

CONFIG = {
    "method": "progrpo",
    "progrpo_alpha": 2.0,  # large, so the confidence term visibly moves the advantages
    "model_name_or_path": "toy",
    "dataset_name": "countdown",
    "max_train_samples": 8,
    "reward_funcs": ["helpers.distinct_char_reward"],
    "use_cpu": True,
    "max_steps": 1,
    "per_device_train_batch_size": 4,
    "num_generations": 8,  # one group of 8 spans both processes (4 rows each)
    "max_completion_length": 6,
    "save_strategy": "no",
    "report_to": "none",
}


def pad_cat(tensors, value=0.0):
    width = max(t.size(1) for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.size(1)), value=value) for t in tensors])


@pytest.mark.skipif(shutil.which("accelerate") is None and not Path(sys.executable).with_name("accelerate").exists(),
                    reason="accelerate CLI not installed")
def test_two_process_advantages_match_single_process(tmp_path):
    cfg = {**CONFIG, "output_dir": str(tmp_path / "out"), "debug_rollout_dir": str(tmp_path / "dump")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "1"}
    # `--multi_gpu` selects accelerate's torchrun launcher; with no GPU and `use_cpu: true` it runs on gloo.
    proc = subprocess.run(
        [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", "-m", "exploration_trl.cli", "train", "--config", str(tmp_path / "cfg.yaml")],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / "dump" / f"rollout0001_rank{r}.pt") for r in (0, 1)]
    assert [r["process_index"] for r in ranks] == [0, 1]
    # Both processes saw the same, globally gathered rewards.
    torch.testing.assert_close(ranks[0]["rewards"], ranks[1]["rewards"])
    rewards = ranks[0]["rewards"]
    assert rewards.numel() == 8 and rewards.std() > 0

    grpo = group_advantages(rewards, 8)
    torch.testing.assert_close(torch.cat([r["advantages"] for r in ranks]).float(), grpo, rtol=1e-5, atol=1e-6)

    logps = pad_cat([r["completion_logps"] for r in ranks])
    mask = pad_cat([r["completion_mask"] for r in ranks])
    expected = progrpo_advantages(
        grpo, rewards, 8, logps, mask,
        pad_cat([r["prompt_logps"] for r in ranks]), pad_cat([r["prompt_logps_mask"] for r in ranks]), alpha=2.0,
    )
    final = torch.cat([r["final_advantages"] for r in ranks])
    torch.testing.assert_close(final, expected, rtol=1e-5, atol=1e-6)
    assert (final - grpo).abs().max() > 1e-4  # the method really acted across the process boundary
