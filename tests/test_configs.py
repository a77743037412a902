"""The shipped configs: every training YAML parses with the CLI's parser (no download), the method recipes carry
the papers' hyperparameters, every launch header names its own file, the accelerate configs are valid, and the
vLLM server launcher passes the flags TRL 1.16's server mode needs."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import builtin_methods

REPO = Path(__file__).resolve().parents[1]
METHOD_DIR = REPO / "configs" / "methods"
ACCEL_DIR = REPO / "configs" / "accelerate"
LAUNCHER = REPO / "scripts" / "launch_vllm_server_mode.sh"
SMOKE = REPO / "scripts" / "gpu_smoke.sh"

METHODS = ("grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov")
SIZES = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-7b": "Qwen/Qwen2.5-7B"}

#: The papers' values (ProGRPO Eq. 4 / Sec. 3.2; DS-GRPO App. B.3; CaSP App. E; Cui et al. 2025 for KL/Clip-Cov): only
#: what a source states (docs/math.md, "Published settings and their sources"); ours and inferred ones are below.
PAPER_VALUES = {
    "grpo": {},
    "progrpo": {"progrpo_alpha": 0.3, "epsilon": 0.2, "epsilon_high": 0.28},  # clip [0.8, 1.28]
    "dsgrpo": {"ds_gamma_p": 0.01, "ds_gamma_n": 0.01, "epsilon_high": 0.25, "ds_logp_granularity": "sequence_sum",
               "temperature": 0.7},  # every math table rolls out at 0.7
    "casp": {"casp_top_n": 3, "casp_alpha": 0.01, "casp_top1_penalty": 1.1, "casp_entropy_quantile": 0.8},
    "kl_cov": {"kl_cov_ratio": 0.002, "kl_cov_coef": 1.0, "epsilon": math.inf, "epsilon_high": math.inf},
    "clip_cov": {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "epsilon": 1.0, "epsilon_high": 1.0},
    "passk": {},
    "pkpo": {"pkpo_estimator": "sloo_minus_one"},  # Eq. 33, the paper's lowest-variance estimator
    "unlikely": {"unlikely_beta": 0.25, "unlikely_logp": "mean", "unlikely_rank_among": "group"},
    "maxrl": {"maxrl_eps": 1e-6, "num_generations": 16, "loss_type": "dapo"},  # Table 6, App. F
    "wreinforce": {"wreinforce_lambda": 0.1, "wreinforce_mode": "weighted", "epsilon": 0.2,
                   "entropy_coef": 1e-4},  # App. C.1: entropy bonus 1e-4, clip 0.2
    "qae": {"qae_k": 0.4, "qae_quantile_method": "inverted_cdf", "epsilon": 0.2, "epsilon_high": 0.28},
    "entropy_adv": {"entropy_adv_alpha": 0.4, "entropy_adv_kappa": 2.0, "epsilon": 0.2, "epsilon_high": 0.28},
    "outcome_explore": {"outcome_ucb_coef": 0.2, "outcome_ucb_baseline": "constant", "outcome_ucb_b0": 0.5},
}
#: Our values where no source gives one (`MethodInfo.chosen`; docs/math.md, "Our values where no source gives one").
OUR_VALUES = {
    "passk": {"passk_k": 4},  # the paper studies several k
    "pkpo": {"pkpo_k": 4, "pkpo_k_final": 1, "pkpo_k_schedule": "step"},  # several k studied; the schedule is ours
    "outcome_explore": {"outcome_batch_coef": 0.2},  # the paper gives no coefficient for the batch penalty
    "qae": {"qae_eps": 1e-4},  # TRL's eps kept; the authors' code has verl's 1e-6
}
#: Values inferred from the set-up a paper's runs start from, which the paper itself does not state.
INFERRED_VALUES = {
    "qae": {"num_generations": 16},  # verl's DAPO recipe, which the authors' README changes in one flag
}
#: The other registered methods ship a 0.5B recipe only (their papers train other models or sizes; no 7B set-up to
#: copy); read from the registry, so a new method is expected to ship one.
SMALL_ONLY_METHODS = tuple(m for m in builtin_methods() if m not in METHODS)
#: Typical GRPO settings every method recipe shares unless its paper's set-up says otherwise (SETUP_VALUES).
COMMON_VALUES = {"learning_rate": 1e-6, "num_generations": 8, "temperature": 1.0, "bf16": True, "use_vllm": True,
                 "beta": 0.0}
#: The papers' training set-ups (docs/methods.md, "Defaults, recipes and papers"): optimizer updates per rollout
#: (steps_per_generation / gradient_accumulation_steps), learning rate, dynamic sampling, base model of the 7B recipe.
SETUP_VALUES = {
    "grpo": {"updates": 1},
    "progrpo": {"updates": 16},  # Table 1: 512 prompts per rollout, mini-batch 32
    "dsgrpo": {"updates": 1},
    "casp": {"updates": 4, "model_7b": "Qwen/Qwen2.5-Math-7B"},  # App. E
    "kl_cov": {"updates": 8, "learning_rate": 5e-7, "dynamic_sampling": True},  # the official 7B script
    "clip_cov": {"updates": 8},
    "passk": {"updates": 1},
    "pkpo": {"updates": 1},
    "unlikely": {"updates": 1},
    "maxrl": {"updates": 1},  # Table 6: fully on-policy
    "wreinforce": {"updates": 4},  # the authors' scripts: 1,024 prompts, mini-batch 256
    "qae": {"updates": 16, "dynamic_sampling": True},  # DAPO's recipe: 512 prompts, mini-batch 32
    "entropy_adv": {"updates": 16},  # Table 4: 512 prompts, mini-batch 32
    "outcome_explore": {"updates": 1},  # not given by the paper: our choice
}

ACCEL_EXPECTED = {
    "single_gpu.yaml": ("NO", None),
    "multi_gpu.yaml": ("MULTI_GPU", None),
    "zero2.yaml": ("DEEPSPEED", 2),
    "zero3.yaml": ("DEEPSPEED", 3),
    "fsdp2.yaml": ("FSDP", None),
}

LAUNCH_RE = re.compile(r"accelerate launch (?:\S+ )*?-m exploration_trl\.cli train --config (\S+)")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def training_yamls() -> list[Path]:
    return sorted(METHOD_DIR.glob("*.yaml")) + sorted((REPO / "configs" / "vllm").glob("*.yaml")) + sorted(
        (REPO / "configs").glob("*.yaml")
    )


def method_yamls() -> list[Path]:
    return sorted(METHOD_DIR.glob("*.yaml"))


@pytest.fixture
def parse(monkeypatch):
    """`parse_train_args` as on a bf16-capable GPU machine (parsing only: no model, no data, no vLLM)."""
    import transformers.training_args

    from exploration_trl.cli import parse_train_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    return lambda path, *extra: parse_train_args(["--config", str(path), *extra])


# ------------------------------------------------------------------------------------------ training YAMLs
#: CaSP Appendix E gives other settings for logic and code tasks; they ship as task recipes beside the math ones.
TASK_RECIPES = {
    "casp_qwen2.5-7b_logic.yaml": {"casp_warmup_steps": 50, "casp_alpha": 0.005, "casp_top1_penalty": 1.05,
                                   "epsilon_high": 0.28, "num_generations": 16, "casp_top_n": 3,
                                   "casp_entropy_quantile": 0.8, "temperature": 1.0, "dynamic_sampling": True},
    "casp_qwen2.5-7b_code.yaml": {"casp_warmup_steps": 0, "casp_alpha": 0.05, "casp_top1_penalty": 1.1,
                                  "temperature": 0.6, "num_generations": 8, "casp_top_n": 3,
                                  "casp_entropy_quantile": 0.8},
}


def test_the_recipe_tables_label_values_as_the_registry_does():
    """A value the method registry calls ours (`MethodInfo.chosen`) is never listed here as a paper's, and a paper's
    value here is the registry's published one wherever the registry has that key."""
    from exploration_trl.methods import method_info
    from exploration_trl.trainers import METHODS as REGISTERED

    for method in REGISTERED:
        info = method_info(method)
        assert not set(info.chosen) & set(PAPER_VALUES.get(method, {})), method
        assert {k: OUR_VALUES.get(method, {}).get(k) for k in info.chosen} == dict(info.chosen), method
        assert not set(info.published) & set(OUR_VALUES.get(method, {})), method
        shared = set(info.published) & set(PAPER_VALUES.get(method, {}))
        assert {k: PAPER_VALUES[method][k] for k in shared} == {k: info.published[k] for k in shared}, method


def test_every_method_and_size_has_a_recipe():
    expected = {f"{m}_{s}.yaml" for m in METHODS for s in SIZES} | set(TASK_RECIPES)
    expected |= {f"{m}_qwen2.5-0.5b.yaml" for m in SMALL_ONLY_METHODS}
    assert {p.name for p in method_yamls()} == expected


@pytest.mark.parametrize("name", sorted(TASK_RECIPES))
def test_casp_task_recipes(parse, name):
    script_args, args, model_args = parse(METHOD_DIR / name)
    assert script_args.method == "casp" and model_args.model_name_or_path == SIZES["qwen2.5-7b"]
    for key, value in TASK_RECIPES[name].items():
        assert getattr(args, key) == value, f"{name}: {key}={getattr(args, key)!r}, expected {value!r}"
    assert args.steps_per_generation == 4 * args.gradient_accumulation_steps  # App. E: 4 updates per rollout
    assert args.beta == 0.0 and args.use_vllm and args.bf16


@pytest.mark.parametrize("path", training_yamls(), ids=rel)
def test_training_yaml_parses(parse, path):
    from exploration_trl.cli import resolve_reward_funcs
    from exploration_trl.trainers import get_config_class

    script_args, training_args, model_args = parse(path)
    raw = yaml.safe_load(path.read_text())
    assert type(training_args) is get_config_class(raw.get("method", "grpo"))
    assert model_args.model_name_or_path == raw["model_name_or_path"]
    # Reward names and their options resolve without touching the network.
    rewards = resolve_reward_funcs(script_args, ["countdown"])
    assert len(rewards) == len(script_args.reward_funcs or ["countdown"])
    if training_args.reward_weights is not None:
        assert len(training_args.reward_weights) == len(rewards)
    # Every group fits in the generation batch (checked at parse time for one process).
    assert training_args.generation_batch_size % training_args.num_generations == 0


@pytest.mark.parametrize("path", [p for p in method_yamls() if p.name not in TASK_RECIPES], ids=rel)
def test_method_recipe_values(parse, path):
    method, size = path.stem.split("_qwen")
    size = "qwen" + size
    script_args, args, model_args = parse(path)
    assert method in SETUP_VALUES and method in PAPER_VALUES, (
        f"{path.name}: add {method}'s paper values to PAPER_VALUES and its training set-up to SETUP_VALUES (the "
        "recipe is checked against them)")
    setup = SETUP_VALUES[method]
    assert script_args.method == method
    assert model_args.model_name_or_path == setup.get(f"model_{size[len('qwen2.5-'):]}", SIZES[size])
    assert model_args.dtype == "bfloat16"
    expected = {**COMMON_VALUES, **PAPER_VALUES[method], **OUR_VALUES.get(method, {}),
                **INFERRED_VALUES.get(method, {}),
                **{k: v for k, v in setup.items() if k in ("learning_rate", "dynamic_sampling")}}
    for key, value in expected.items():
        assert getattr(args, key) == value, f"{path.name}: {key}={getattr(args, key)!r}, expected {value!r}"
    assert args.steps_per_generation == setup["updates"] * args.gradient_accumulation_steps, path.name
    assert getattr(args, "dynamic_sampling", False) == setup.get("dynamic_sampling", False), path.name
    assert args.max_completion_length >= 1024
    # GSM8K / MATH from the Hub, scored by math accuracy plus format.
    assert script_args.dataset_name in ("openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval")
    assert script_args.dataset_config in ("main", "default")
    assert script_args.reward_funcs == ["math_accuracy", "format"]
    # A formatted but wrong answer (reward 0.1) must not count as correct (DS-GRPO, metrics).
    assert args.reward_weights[1] < args.correct_reward_threshold < args.reward_weights[0]
    assert args.vllm_importance_sampling_correction is True
    assert args.vllm_mode == ("colocate" if size == "qwen2.5-0.5b" else "server")


def test_vllm_configs_cover_both_modes(parse):
    modes = {}
    for path in sorted((REPO / "configs" / "vllm").glob("*.yaml")):
        _, args, _ = parse(path)
        assert args.use_vllm is True
        modes[args.vllm_mode] = path
    assert set(modes) == {"colocate", "server"}


@pytest.mark.parametrize("path", method_yamls() + sorted((REPO / "configs" / "vllm").glob("*.yaml")), ids=rel)
def test_header_launch_command_names_its_own_file(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# "))
    launches = [m for line in header for m in LAUNCH_RE.finditer(line)]
    assert launches, f"{rel(path)}: no `accelerate launch ... -m exploration_trl.cli train --config` line in the header"
    for m in launches:
        assert m.group(1) == rel(path), f"{rel(path)}: header launches {m.group(1)}"
    for line in header:
        for accel in re.findall(r"--config_file (\S+)", line):
            assert (REPO / accel).is_file(), f"{rel(path)}: header names missing {accel}"


# ------------------------------------------------------------------------------------------ accelerate
@pytest.mark.parametrize("name", sorted(ACCEL_EXPECTED))
def test_accelerate_config(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = ACCEL_DIR / name
    raw = yaml.safe_load(path.read_text())
    dist, stage = ACCEL_EXPECTED[name]
    assert raw["distributed_type"] == dist
    if stage is not None:
        assert raw["deepspeed_config"]["zero_stage"] == stage
    if name == "fsdp2.yaml":
        assert raw["fsdp_config"]["fsdp_version"] == 2
    # Precision is the training YAML's (`bf16: true` in the recipes); a bf16 here would override `bf16: false`.
    assert raw["mixed_precision"] == "no"
    # accelerate itself accepts the file (unknown keys raise) and resolves the launcher from it.
    config = load_config_from_file(str(path))
    assert config.distributed_type.value == dist
    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "exploration_trl.cli", "train"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_deepspeed == (dist == "DEEPSPEED")
    assert args.use_fsdp == (dist == "FSDP")
    assert args.multi_gpu == (dist == "MULTI_GPU")
    if stage is not None:
        assert int(args.zero_stage) == stage


def test_accelerate_configs_are_exactly_these():
    assert {p.name for p in ACCEL_DIR.glob("*.yaml")} == set(ACCEL_EXPECTED)


# ------------------------------------------------------------------------------------------ vLLM server launcher
def _dry_run(config, **env):
    full = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "VLLM_GPUS": "7", "TRAIN_GPUS": "0,1,2,3,4,5,6",
            **env}
    out = subprocess.run(["bash", str(LAUNCHER), str(config), "--max_steps", "3"], cwd=REPO, env=full,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    return shlex.split(lines["server"]), lines["health"], shlex.split(lines["train"])


def _flags(tokens: list[str]) -> dict:
    flags, i = {}, 0
    while i < len(tokens):
        if tokens[i].startswith("--") and (i + 1 == len(tokens) or tokens[i + 1].startswith("--")):
            flags[tokens[i]] = True
            i += 1
        elif tokens[i].startswith("--"):
            flags[tokens[i]] = tokens[i + 1]
            i += 2
        else:
            flags.setdefault("_positional", []).append(tokens[i])
            i += 1
    return flags


def test_launcher_server_flags_match_trl_vllm_serve():
    """The plain `vllm serve` command carries exactly what `trl vllm-serve` (TRL 1.16) would pass."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    config = METHOD_DIR / "casp_qwen2.5-7b.yaml"
    server, health, train = _dry_run(config, VLLM_PORT="8123", VLLM_GPU_MEMORY_UTILIZATION="0.85")
    assert server[:3] == ["env", "CUDA_VISIBLE_DEVICES=7", "VLLM_SERVER_DEV_MODE=1"]
    ours = server[server.index("serve"):]
    model = yaml.safe_load(config.read_text())["model_name_or_path"]  # Qwen/Qwen2.5-Math-7B (CaSP App. E)
    trl_cmd = build_command(ScriptArguments(model=model, port=8123, gpu_memory_utilization=0.85,
                                            max_model_len=3072 + 1024))
    theirs = trl_cmd[trl_cmd.index("serve"):]
    assert _flags(ours) == _flags(theirs)
    assert "--weight-transfer-config" in ours and "processed_logprobs" in ours

    assert health == "http://127.0.0.1:8123/health"
    assert train[:2] == ["env", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6"]
    i = train.index("launch")
    assert train[i + 1:i + 5] == ["--config_file", "configs/accelerate/zero3.yaml", "--num_processes", "7"]
    assert train[train.index("--config") + 1] == str(config)
    assert _flags(train)["--vllm_mode"] == "server"
    assert _flags(train)["--vllm_server_base_url"] == "http://127.0.0.1:8123"
    assert train[-2:] == ["--max_steps", "3"]


def test_launcher_trl_variant_parses_with_trl():
    """`VLLM_LAUNCHER=trl` passes only flags TRL's own `vllm-serve` parser knows, giving the same server command."""
    from trl.scripts.vllm_serve import build_command, make_parser

    server, _, _ = _dry_run(REPO / "configs" / "vllm" / "server_qwen2.5-7b.yaml", VLLM_LAUNCHER="trl",
                            VLLM_GPUS="6,7", TRAIN_GPUS="0,1,2,3")
    assert server[3:5] == ["trl", "vllm-serve"]
    script_args, extra = make_parser(prog="trl vllm-serve").parse_args_and_config(
        server[5:], return_remaining_strings=True
    )
    assert extra == []
    assert (script_args.model, script_args.tensor_parallel_size, script_args.max_model_len) == ("Qwen/Qwen2.5-7B", 2, 4096)
    plain, _, _ = _dry_run(REPO / "configs" / "vllm" / "server_qwen2.5-7b.yaml", VLLM_GPUS="6,7", TRAIN_GPUS="0,1,2,3")
    cmd = build_command(script_args)
    assert _flags(cmd[cmd.index("serve"):]) == _flags(plain[plain.index("serve"):])


def test_trl_server_contract():
    """What the launcher relies on: TRL's client waits on GET /health and needs the dev-mode weight-transfer API."""
    import inspect

    from trl.generation.vllm_client import VLLMClient
    from trl.scripts import vllm_serve

    assert 'f"{self.base_url}/health"' in inspect.getsource(VLLMClient.check_server)
    assert "weight_transfer_config" in inspect.getsource(VLLMClient.init_communicator)
    assert 'env["VLLM_SERVER_DEV_MODE"] = "1"' in inspect.getsource(vllm_serve.main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_launcher_waits_for_health_then_trains_then_stops_server(tmp_path):
    """Control flow with stand-ins for `vllm` and `accelerate`: training starts only once /health answers, and the
    server is stopped afterwards."""
    port = _free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(
        "#!/usr/bin/env bash\nsleep 2\n"
        f"exec {shlex.quote(sys.executable)} -c '\n"
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == \"/health\" else 404); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "print(\"dev_mode\", os.environ.get(\"VLLM_SERVER_DEV_MODE\"), \"gpus\", os.environ.get(\"CUDA_VISIBLE_DEVICES\"), flush=True)\n"
        f"http.server.HTTPServer((\"127.0.0.1\", {port}), H).serve_forever()'\n"
    )
    (bin_dir / "accelerate").write_text(
        "#!/usr/bin/env bash\n"
        f"{shlex.quote(sys.executable)} -c 'import urllib.request; "
        f"assert urllib.request.urlopen(\"http://127.0.0.1:{port}/health\").status == 200'\n"
        "echo \"trained on $CUDA_VISIBLE_DEVICES with: $*\"\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "CUDA_VISIBLE_DEVICES": "0,1", "VLLM_PORT": str(port), "VLLM_LOG": str(tmp_path / "server.log")}
    out = subprocess.run(["bash", str(LAUNCHER), "configs/vllm/server_qwen2.5-7b.yaml"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trained on 0 with: launch --config_file configs/accelerate/zero3.yaml --num_processes 1" in out.stdout
    assert "dev_mode 1 gpus 1" in (tmp_path / "server.log").read_text()
    with socket.socket() as s:  # the server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("script", [LAUNCHER, SMOKE], ids=lambda p: p.name)
def test_scripts_are_valid_bash(script):
    assert script.is_file() and os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
