"""Every method under real multi-process engines on CPU: DDP (gloo), DeepSpeed ZeRO-2 and ZeRO-3, PEFT under DDP.

Each engine is launched with `accelerate launch` and the shipped config in `configs/accelerate/`, changing only the
process count and `use_cpu`. One launch trains all methods (tests/mp_driver.py), so each engine starts once per
process count. For every engine × method the tests assert that
- the method's own metrics and the exploration metrics reach the log (the bug this guards: under a wrapper the loss
  hooks silently did nothing and these keys were missing);
- the method is active: after 3 steps its parameters differ from a `grpo` run with the same seed;
- a 2-process run equals a 1-process run on the same global batch of 12 completions (DeepSpeed against DeepSpeed
  with 1 process; DDP against no wrapper), to `EQUAL_TOL`; the measured difference is ~1e-8 (float32 rounding);
- the processes really held prompts and completions of different widths (the collective-mismatch bug).

KL-Cov and Clip-Cov select tokens within each process's micro-batch by default (`cov_selection: local`), as the
official verl code does, so a 2-process run equals a 1-process run only where that selection does not depend on the
split: the driver sets kl_cov_ratio 1 and an unbounded Clip-Cov window (their selection logic itself is tested in one
process, tests/test_core_losses.py). `kl_cov-global` and `clip_cov-global` run `cov_selection: global` with a real
ratio (0.2): the selection spans both processes, and the 2-process run must equal the 1-process run.
FSDP2 is not here: accelerate 1.15 enables FSDP only on accelerator devices; with `use_cpu` it silently runs DDP.

Plus the CLI path with TRL's real `generate` (not the driver's reproducible sampler): ProGRPO's gathered
advantages equal a single-process `core` computation on every step, with prompts of different widths per process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from exploration_trl.core.advantages import group_advantages, progrpo_advantages
from exploration_trl.methods import method_info
from helpers import child_pythonpath, toy_checkpoint
from mp_driver import cases

TESTS = Path(__file__).parent
ROOT = TESTS.parent
#: What a launch trains (mp_driver's cases: every registered method, the compositions and the global selections).
METHODS = cases()
LORA_METHODS = ["casp", "progrpo+casp", "kl_cov"]
#: Method-specific metric keys (the exploration/* keys are checked for every method, and a key under each of a
#: method's registered `metric_prefixes` for every method, a new one included).
METHOD_METRICS = {
    "grpo": [],
    "progrpo": ["progrpo/confidence_mean", "progrpo/prompt_confidence_mean", "progrpo/adjustment_abs_mean"],
    "dsgrpo": ["dsgrpo/bonus_mean", "dsgrpo/penalty_mean"],
    "casp": ["casp/forking_frac", "casp/top1_penalty_frac"],
    "kl_cov": ["kl_cov/selected_tokens", "kl_cov/cov_threshold"],
    "clip_cov": ["clip_cov/selected_tokens", "clip_cov/cov_threshold"],
    "passk": ["passk/k", "passk/adv_correct_mean", "passk/adv_wrong_mean"],
    "pkpo": ["pkpo/k", "pkpo/adv_abs_mean"],
    "unlikely": ["unlikely/factor_correct_mean", "unlikely/adv_change_abs_mean"],
    "kl_cov-global": ["kl_cov/selected_tokens", "kl_cov/cov_threshold"],
    "clip_cov-global": ["clip_cov/selected_tokens", "clip_cov/cov_threshold"],
    "maxrl": ["maxrl/zero_mean_groups", "maxrl/adv_correct_mean"],
    "wreinforce": ["wreinforce/correct_frac", "wreinforce/adv_mean"],
    "qae": ["qae/zero_adv_frac", "qae/positive_adv_frac"],
    "entropy_adv": ["entropy_adv/term_mean", "entropy_adv/capped_frac"],
    "outcome_explore": ["outcome_explore/answered_frac", "outcome_explore/ucb_bonus_mean",
                        "outcome_explore/repeated_answer_frac"],
}
EXPLORATION_METRICS = ["exploration/entropy_correct", "exploration/entropy_wrong", "exploration/lambda_1",
                       "exploration/lambda_sample", "exploration/branching_factor", "exploration/pass_at_G",
                       "exploration/unique_completions_per_group"]
FAILURES = "rewards/counted_reward/failures"  # tests/mp_driver.py's reward counts its short completions
EQUAL_TOL = 1e-6  # max |param difference| between a 2-process and a 1-process run (measured: ~1e-8)
ACTIVE_TOL = 1e-5  # a method counts as active when it moves some parameter this much away from GRPO (100x EQUAL noise)
ENGINES = {  # engine -> (shipped accelerate config, the 1-process reference it is compared with)
    "ddp": ("multi_gpu.yaml", "plain"),
    # ZeRO's two processes against the unwrapped run: the stronger claim, and a launch fewer per engine than a
    # 1-process ZeRO run (~40 s each; the 1-process ZeRO-3 run is the slow test below).
    "zero2": ("zero2.yaml", "plain"),
    "zero3": ("zero3.yaml", "plain"),
    "zero1": ("zero2.yaml", "zero1-1proc"),  # the ZeRO-2 config at stage 1 (DeepSpeed runs both in one optimizer)
}
ZERO_STAGE = {"zero1": 1}  # engines whose stage differs from their config file's
SLOW_ENGINES = {"zero1"}  # kept out of CI (`-m slow`): ZeRO-2 exercises the same DeepSpeed code path

pytestmark = pytest.mark.skipif(
    shutil.which("accelerate") is None and not Path(sys.executable).with_name("accelerate").exists(),
    reason="the accelerate CLI is part of the package's requirements",
)


def _accelerate() -> str:
    return shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": child_pythonpath(TESTS), "OMP_NUM_THREADS": "1"}


def _engine_config(tmp: Path, engine: str, num_processes: int) -> Path:
    name = ENGINES[engine][0]
    config = yaml.safe_load((ROOT / "configs" / "accelerate" / name).read_text())
    # main_process_port 0: accelerate picks a free port (`pytest -n 2` runs two launches side by side)
    config.update(num_processes=num_processes, use_cpu=True, main_process_port=0)
    if engine in ZERO_STAGE:
        config["deepspeed_config"]["zero_stage"] = ZERO_STAGE[engine]
    path = tmp / f"{engine}-{num_processes}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Launch each engine once (lazily), return {run name: output folder}."""
    tmp = tmp_path_factory.mktemp("mp")
    # Tied input/output embeddings, as Qwen2.5-0.5B: the LM head is then shared with the embedding under ZeRO-3.
    ckpt = toy_checkpoint(tmp / "ckpt", tie_word_embeddings=True)

    @cache
    def launch(name: str) -> Path:
        out = tmp / name
        driver = [str(TESTS / "mp_driver.py"), str(out), "--ckpt", ckpt]
        if name in ("plain", "ddp"):
            driver += ["--lora-methods", ",".join(LORA_METHODS)]
        if name == "plain":  # no wrapper at all: one process, no launcher
            cmd = [sys.executable, *driver]
        else:
            engine = name.removesuffix("-1proc")
            config = _engine_config(tmp, engine, 1 if name.endswith("-1proc") else 2)
            cmd = [_accelerate(), "launch", "--config_file", str(config), *driver]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env())
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
        assert "terminate called" not in proc.stderr
        return out

    return launch


def _params(folder: Path) -> dict[str, torch.Tensor]:
    f = folder / "model.safetensors"
    params = load_file(str(f if f.exists() else folder / "adapter_model.safetensors"))
    # ZeRO-2's save writes the tied LM head under its own key too; `save_pretrained` writes it once.
    head, embed = params.get("lm_head.weight"), params.get("model.embed_tokens.weight")
    if head is not None and embed is not None and torch.equal(head, embed):
        del params["lm_head.weight"]
    return params


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _run(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW_ENGINES else e
                                    for e in ENGINES])
def test_method_under_engine(engine, method, runs):
    two, one = runs(engine), runs(ENGINES[engine][1])
    info = _run(two / method)
    assert info["num_processes"] == 2
    expected_type = "DistributedType.DEEPSPEED" if engine.startswith("zero") else "DistributedType.MULTI_CPU"
    assert info["distributed_type"] == expected_type
    assert info["wrapped"] == ("DeepSpeedEngine" if engine.startswith("zero") else "DistributedDataParallel")
    assert info["head_zero3_partitioned"] == (engine == "zero3")

    logged = {k for entry in info["log_history"] for k in entry}
    wanted = EXPLORATION_METRICS + [k for part in method.split("+") for k in METHOD_METRICS.get(part, [])]
    assert not [k for k in wanted if k not in logged], f"missing metrics under {engine}"
    prefixes = [p for part in method.removesuffix("-global").split("+") for p in method_info(part).metric_prefixes]
    assert all(any(k.startswith(p) for k in logged) for p in prefixes), (prefixes, f"missing metrics under {engine}")
    # Reward failures are counted per process and summed: the same counts as one process on the same batches.
    failures = [[e[FAILURES] for e in run["log_history"] if FAILURES in e] for run in (info, _run(one / method))]
    assert failures[0] == failures[1] and sum(failures[0]) > 0, failures

    params = _params(two / method)
    if method != "grpo":
        assert _max_diff(params, _params(two / "grpo")) > ACTIVE_TOL, f"{method} did not act under {engine}"
    assert _max_diff(params, _params(one / method)) <= EQUAL_TOL

    # The two processes held prompts and completions of different widths on some step.
    shapes = [json.loads((two / method / f"shapes_rank{r}.json").read_text()) for r in (0, 1)]
    assert any(a["prompt"] != b["prompt"] for a, b in zip(*shapes, strict=True))
    assert any(a["completion"] != b["completion"] for a, b in zip(*shapes, strict=True))

    # CaSP's candidates came from TRL's own LM-head passes on both processes, ZeRO-3's gathered head included
    # (docs/overhead.md, "CaSP at GRPO's cost"); no pass fell back to CaSP's own projection.
    folds = [json.loads((two / method / f"folds_rank{r}.json").read_text()) for r in (0, 1)]
    if "casp" in method:
        assert all(f["folded"] > 0 and f["fell_back"] == 0 for f in folds), folds
    else:
        assert folds == [{"folded": 0, "fell_back": 0}] * 2, folds


@pytest.mark.slow  # the same gathers as the 2-process ZeRO-3 run in the main suite, one launch more (~45 s)
def test_deepspeed_single_process_equals_no_wrapper(runs):
    """ZeRO-3 partitions the (tied) LM head even in one process: CaSP's candidates, the metrics and ProGRPO's prompt
    log-probs gather it, and CaSP's gradient must reach the shards. The result equals the unwrapped run."""
    plain, zero3 = runs("plain"), runs("zero3-1proc")
    assert _run(zero3 / "casp")["head_zero3_partitioned"]
    for method in METHODS:
        assert _max_diff(_params(zero3 / method), _params(plain / method)) <= EQUAL_TOL, method


@pytest.mark.parametrize("method", LORA_METHODS)
def test_lora_under_ddp(method, runs):
    two, one = runs("ddp"), runs("plain")
    adapter = _params(two / f"lora-{method}")
    assert all("lora_" in k for k in adapter)
    assert _max_diff(adapter, _params(one / f"lora-{method}")) <= EQUAL_TOL
    logged = {k for entry in _run(two / f"lora-{method}")["log_history"] for k in entry}
    assert set(EXPLORATION_METRICS) <= logged


def pad_cat(tensors, value=0.0, left=False):
    width = max(t.size(1) for t in tensors)
    pads = [(width - t.size(1), 0) if left else (0, width - t.size(1)) for t in tensors]
    return torch.cat([torch.nn.functional.pad(t, p, value=value) for t, p in zip(tensors, pads, strict=True)])


def test_cli_two_processes_progrpo_every_step(tmp_path):
    """`exploration-trl train` under 2-process DDP with TRL's real generation, 3 generation batches.

    One group of 8 spans both processes, and the prompts have different widths on each process (the case that made
    ProGRPO's gather crash from its second step). On every step both processes saw the same gathered rewards, and
    the final advantages equal a single-process `core` computation on the gathered batch."""
    rows = [{"prompt": "a" * (1 + 5 * i) + " solve", "answer": "1"} for i in range(8)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {
        "method": "progrpo", "progrpo_alpha": 2.0, "correct_reward_threshold": 1.0, "model_name_or_path": "toy",
        "dataset_name": str(tmp_path / "data.jsonl"), "reward_funcs": ["helpers.distinct_char_reward"],
        "use_cpu": True, "bf16": False, "max_steps": 3, "per_device_train_batch_size": 4, "num_generations": 4,
        "max_completion_length": 12, "save_strategy": "no", "report_to": "none", "logging_steps": 1,
        "output_dir": str(tmp_path / "out"), "debug_rollout_dir": str(tmp_path / "dump"),
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    config = _engine_config(tmp_path, "ddp", 2)
    proc = subprocess.run(
        [_accelerate(), "launch", "--config_file", str(config), "-m", "exploration_trl.cli", "train",
         "--config", str(tmp_path / "cfg.yaml")],
        capture_output=True, text=True, timeout=600, env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    widths = []
    for step in (1, 2, 3):
        ranks = [torch.load(tmp_path / "dump" / f"rollout{step:04d}_rank{r}.pt") for r in (0, 1)]
        assert [r["process_index"] for r in ranks] == [0, 1]
        torch.testing.assert_close(ranks[0]["rewards"], ranks[1]["rewards"])
        rewards = ranks[0]["rewards"]
        widths.append([r["prompt_ids"].size(1) for r in ranks])
        grpo = group_advantages(rewards, 4)
        torch.testing.assert_close(torch.cat([r["advantages"] for r in ranks]).float(), grpo, rtol=1e-5, atol=1e-6)
        expected = progrpo_advantages(
            grpo, rewards, 4, pad_cat([r["completion_logps"] for r in ranks]),
            pad_cat([r["completion_mask"] for r in ranks]),
            pad_cat([r["prompt_logps"] for r in ranks], left=True),
            pad_cat([r["prompt_logps_mask"] for r in ranks], left=True), alpha=2.0, correct_threshold=1.0,
        )
        final = torch.cat([r["final_advantages"] for r in ranks])
        torch.testing.assert_close(final, expected, rtol=1e-5, atol=1e-6)
        assert (final - grpo).abs().max() > 1e-4  # the method really acted across the process boundary
    assert any(a != b for a, b in widths), widths
