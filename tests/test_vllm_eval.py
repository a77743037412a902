"""`exploration-trl eval --backend vllm` on a CPU, and clean exits of vLLM runs (`-m vllm`, except the first test).

- The CPU memory share is chosen from the host (unit-tested here without vLLM, in the main suite too).
- The vLLM and transformers backends agree on pass@1 within sampling noise, problem by problem.
- `eval --backend vllm` and `train` with `use_vllm: true` exit 0 with no traceback and no "Exception ignored".
- When vLLM cannot start, the user gets one `error:` line naming the cause and the option that changes it.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import CLI_BASE, child_pythonpath, toy_checkpoint
from vllm_helpers import CPU_MEMORY_SHARE, child_env, vllm_checkpoint

from exploration_trl.eval.generation import CPU_KV_CACHE_BYTES, cpu_memory_utilization

GiB = 1024**3
TESTS = Path(__file__).parent


def test_cpu_memory_share_fits_the_host():
    """This process's memory plus a KV cache of min(4 GiB, free / 4), as a share of the RAM, rounded up."""
    assert cpu_memory_utilization(total=32 * GiB, available=20 * GiB, resident=2 * GiB) == 0.19  # (2 + 4) / 32
    assert cpu_memory_utilization(total=16 * GiB, available=12 * GiB, resident=2 * GiB) == 0.32  # (2 + 3) / 16
    assert cpu_memory_utilization(total=16 * GiB, available=4 * GiB, resident=1 * GiB) == 0.13  # (1 + 1) / 16 = .125
    assert cpu_memory_utilization(total=8 * GiB, available=8 * GiB, resident=7 * GiB) == 0.95  # capped
    # What vLLM's CPU worker then requires holds: the share fits in the free RAM, and leaves a KV cache.
    total, available, resident = 16 * GiB, 12 * GiB, 2 * GiB
    share = cpu_memory_utilization(total=total, available=available, resident=resident)
    assert resident < share * total <= resident + CPU_KV_CACHE_BYTES + 0.01 * total <= available


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return vllm_checkpoint(tmp_path_factory.mktemp("vllm_eval") / "ckpt")


def _cli(args, tmp_path, timeout=600):
    env = child_env(PYTHONPATH=child_pythonpath(TESTS), OMP_NUM_THREADS="2")
    cmd = [sys.executable, "-c", "import sys; from exploration_trl.cli import main; sys.exit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)


def _assert_clean(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    for bad in ("Traceback", "Exception ignored", "Invalid process group"):
        assert bad not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.vllm
def test_eval_vllm_on_cpu_exits_clean(ckpt, tmp_path):
    out = tmp_path / "eval"
    proc = _cli(["eval", "--backend", "vllm", "--model", ckpt, "--benchmark", "countdown3", "--limit", "2", "--n", "2",
                 "--max-tokens", "8", "--no-diversity", "--quiet", "--output-dir", str(out)], tmp_path)
    _assert_clean(proc)
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["resolved_backend"] == "vllm"
    assert [p["n"] for p in results["problems"]] == [2, 2]


@pytest.mark.vllm
@pytest.mark.parametrize("case", ["head_dim", "memory"])
def test_eval_vllm_start_failure_is_one_line(tmp_path, case):
    if case == "head_dim":  # the toy of the other tests: head_dim 16, which vLLM's CPU attention refuses
        model, extra = toy_checkpoint(tmp_path / "hd16"), []
        start, fix = "error: vLLM cannot run this model on the CPU: ", "this model's is 16 (hidden_size"
    else:  # more of the host's RAM than is free
        model, extra = vllm_checkpoint(tmp_path / "ckpt"), ["--vllm-memory-utilization", "0.99"]
        start, fix = "error: vLLM could not start (ValueError: Available memory", "pass --vllm-memory-utilization"
    proc = _cli(["eval", "--backend", "vllm", "--model", model, "--benchmark", "countdown3", "--limit", "1", "--n", "1",
                 "--quiet", "--output-dir", str(tmp_path / "out"), *extra], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(start) and fix in errors[0], errors[0]
    if case == "head_dim":
        assert errors[0].endswith("; use --backend transformers")


@pytest.mark.vllm
def test_train_with_vllm_exits_clean(ckpt, tmp_path):
    """The CLI's end-of-training teardown and vLLM's own no longer both destroy the process group."""
    cfg = {**CLI_BASE, "model_name_or_path": ckpt, "output_dir": str(tmp_path / "out"), "max_steps": 2,
           "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": CPU_MEMORY_SHARE}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _cli(["train", "--config", str(path)], tmp_path)
    _assert_clean(proc)
    assert (tmp_path / "out" / "model.safetensors").exists()


#: pass@1 of the two backends may differ by this many standard errors of the difference of two independent
#: estimates, sqrt(2 * sum_i p_i (1 - p_i) / n) / P with p_i the pooled per-problem rate (4 SE: a false alarm about
#: once in 16,000 runs if both sample the same distributions). Measured: 0.94 SE.
PASS1_SE_TOL = 4.0


@pytest.mark.vllm
def test_vllm_and_transformers_backends_agree(tmp_path):
    """Same model, problems and sampling settings (temperature 0.6, top-p 0.95): pass@1 agrees within sampling noise,
    and the per-problem rates track each other (the peaked toy's rates differ from prompt to prompt). The vLLM
    engine runs the float32 checkpoint in bfloat16 (its CPU default), a small systematic difference inside the
    tolerance."""
    import numpy as np

    from exploration_trl.eval.harness import run_eval

    model = vllm_checkpoint(tmp_path / "peaked", head_scale=20.0)
    rng = random.Random(0)
    rows = [{"question": "".join(rng.choice("abcdefxyz0123 ") for _ in range(rng.randint(3, 12))), "answer": "1"}
            for _ in range(32)]
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps(r) for r in rows))
    n = 16
    rates = {}
    for backend in ("transformers", "vllm"):
        res = run_eval(model, str(bench), n=n, max_tokens=4, backend=backend, reward="vllm_helpers.first_char_reward",
                       output_dir=tmp_path / backend, diversity=False, semantic=False, plot=False, progress=False)
        assert res["settings"]["resolved_backend"] == backend
        rates[backend] = np.array([p["c"] / p["n"] for p in res["problems"]])
        assert res["summary"]["pass_at_k"]["1"] == pytest.approx(rates[backend].mean())
    a, b = rates["transformers"], rates["vllm"]
    pooled = (a + b) / 2
    se = math.sqrt(2 * float((pooled * (1 - pooled)).sum()) / n) / len(a)
    assert 0.1 < a.mean() < 0.9  # neither trivially 0 nor 1
    assert abs(a.mean() - b.mean()) <= PASS1_SE_TOL * se, (a.mean(), b.mean(), se)
    assert float(np.corrcoef(a, b)[0, 1]) > 0.8, (a, b)


@pytest.mark.vllm
def test_train_with_an_unsupported_head_size_is_one_line(tmp_path):
    """The demo-sized toy (head_dim 16) with `use_vllm: true` on a CPU: one error line before any vLLM engine starts."""
    cfg = {**CLI_BASE, "model_name_or_path": toy_checkpoint(tmp_path / "hd16"), "output_dir": str(tmp_path / "out"),
           "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": CPU_MEMORY_SHARE}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _cli(["train", "--config", str(path)], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Initializing a V1 LLM engine" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: use_vllm: vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, 160, 192, "
                      "224, 256, 512, and this model's is 16 (hidden_size / num_attention_heads); set use_vllm: false "
                      "to generate with transformers"], proc.stderr[-3000:]
