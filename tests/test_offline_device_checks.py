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


def test_overhead_device_mode_keeps_what_it_measured_at_the_cap(tmp_path):
    """With a deadline that has passed nothing starts; SIGTERM mid-run keeps the methods measured so far. Either way
    the report names what was not run."""
    import signal
    import time

    out = tmp_path / "late.json"
    cmd = [sys.executable, "benchmarks/overhead.py", "--dry-run", "--methods", "grpo,casp"]
    proc = subprocess.run([*cmd, "--output", str(out), "--deadline", str(time.time())], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["trials"] == {} and report["not_run"] == ["trl", "grpo", "casp"]
    assert report["stopped"] == "time cap: 6 of 6 trials not started"

    out = tmp_path / "stopped.json"
    proc = subprocess.Popen([*cmd, "--output", str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for line in proc.stdout:
        if line.startswith("[4/6] trl") and "every_step" in line:  # the first pass done, then TRL's second trial
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    report = json.loads(out.read_text())
    assert {m: set(modes) for m, modes in report["trials"].items()} == {
        "trl": {"logging10", "every_step"}, "grpo": {"logging10"}, "casp": {"logging10"}}
    assert report["not_run"] == ["grpo", "casp"] and report["failed"] == {}
    assert report["stopped"] == "SIGTERM: stopped during trial 5 of 6 (grpo, every_step)"
    assert report["summary"]["trl"]["meets_goals"] is True


def test_overhead_device_mode_reports_a_method_that_raises_and_measures_the_others(tmp_path, monkeypatch, capsys):
    """One method's crash is recorded with its traceback, the methods after it are still measured, and the command
    exits 1."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import overhead_device
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    real = overhead_device.trial

    def trial(method, *args, **kwargs):
        if method == "grpo":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(overhead_device, "trial", trial)
    report = overhead_device.run("cpu", True, ["trl", "grpo", "casp"], tmp_path / "o.json")
    assert set(report["trials"]) == {"trl", "casp"} and set(report["trials"]["casp"]) == {"logging10", "every_step"}
    failure = report["failed"]["grpo"]
    assert set(failure) == {"logging10", "every_step"}
    assert failure["logging10"]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert 'raise RuntimeError("CUDA error' in failure["logging10"]["traceback"]
    assert report["not_run"] == [] and report["summary"]["casp"]["logging10"]["train_only_x_trl"] > 0
    assert json.loads((tmp_path / "o.json").read_text())["failed"]["grpo"]["every_step"]["error"].startswith("Runtime")
    assert "FAILED: grpo (logging10): RuntimeError: CUDA error" in capsys.readouterr().out



# Slow: test_gpu_validate_dry_run_writes_a_row_per_method runs the same script's CPU form (the first method's training
# and the eval) in the suite.
@pytest.mark.slow
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


# --------------------------------------------------------------------------------------------- scripts/gpu_validate.sh
def _gpu_validate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_validate", REPO / "scripts" / "gpu_validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("chosen", [pytest.param(None, marks=pytest.mark.slow, id="every-method"),
                                    pytest.param("kl_cov,progrpo+casp", id="two-methods")])
def test_gpu_validate_dry_run_writes_a_row_per_method(tmp_path, chosen):
    """`scripts/gpu_validate.sh --dry-run`: the device mode's stages on CPU (the smoke test of the first method, the
    overhead benchmark of TRL and every registered method, or those of `--methods`), with a JSON and a Markdown
    report. About 70 s for every method (slow: a method's trial is the same code for all, and each method trains in
    the main suite); 15 s for two."""
    import exploration_trl.trainers  # noqa: F401  (registers the methods)
    from exploration_trl.methods import METHODS

    registered = list(METHODS) if chosen is None else chosen.split(",")
    out = tmp_path / "validate"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "not_here")}
    env.pop("GPU_VALIDATE_WHEELS", None)
    proc = subprocess.run(["bash", "scripts/gpu_validate.sh", "--dry-run", "--out", str(out),
                           *(["--methods", chosen] if chosen else [])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[gpu_validate" in proc.stdout and "gpu_validate: everything ran and passed" in proc.stdout  # progress
    assert not (tmp_path / "not_here").exists()  # --out wins over $OUT
    report = json.loads((out / "gpu_validate.json").read_text())
    methods = ["trl", *registered]
    assert report["mode"] == "dry-run" and report["methods"] == registered and not report["stopped_at_cap"]
    assert report["seconds"] < report["cap_s"] and report["error"] is None
    assert set(report["overhead"]["trials"]) == set(methods)
    for method in methods:
        for mode in ("logging10", "every_step"):
            trial = report["overhead"]["trials"][method][mode]
            assert trial["train_only_s"] > 0 and trial["generating_s"] > 0 and trial["loss_finite"] is True
        assert report["overhead"]["summary"][method]["train_only_logging10_amortised_x_trl"] > 0
    assert [(r["run"], r["status"]) for r in report["smoke"]] == [(f"train {registered[0]}-full", "PASS"),
                                                                  ("eval-base", "PASS")]
    import tarfile

    assert sorted(p.name for p in out.iterdir()) == ["gpu_validate.json", "gpu_validate.md", "logs.tar.gz",
                                                      "overhead.json"]  # what a lent machine sends back
    with tarfile.open(out / "logs.tar.gz") as tar:
        logs = set(tar.getnames())
    assert {"logs/probe.log", "logs/build_model.log", "logs/overhead.log"} <= logs
    assert all(r["log"].split(":", 1)[1] in logs for r in report["smoke"]), (report["smoke"], logs)
    table = (out / "gpu_validate.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    for method in methods:
        cells = [c.strip() for c in rows[method].strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[1:8] if c != "–"), cells  # times and ratios: numbers
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and cells[10] == "yes", cells
    assert f"| train {registered[0]}-full | PASS |" in table


def test_gpu_validate_stops_a_stage_at_the_cap_and_reports_what_was_not_run(tmp_path):
    """The cap: a stage in flight is stopped (its whole process group), what was not reached is listed, and the
    report still lists a row per method."""
    import time

    gv = _gpu_validate()
    v = gv.Validation(gv.parse_args(["--dry-run", "--cap", "0.25", "--out", str(tmp_path)]))  # 15 s
    started = time.time()
    rc, lines = v.stream(["bash", "-c", "echo started; sleep 60 & wait"])
    assert rc is None and lines == ["started"] and time.time() - started < 15  # stopped at the cap minus 3 s
    v.report["methods"] = ["grpo", "casp"]
    v.overhead()  # nothing left of the cap: not started
    v.smoke(tmp_path, "unused", "grpo", "full", evaluate="1")
    assert v.report["stopped_at_cap"] and v.report["not_run"] == ["overhead benchmark", "smoke grpo"]
    assert [r["status"] for r in v.report["smoke"]] == ["not run (time cap)"] * 2
    v.write()
    table = (tmp_path / "gpu_validate.md").read_text()
    assert "| trl | not run (time cap) |" in table and "| casp | not run (time cap) |" in table
    assert "stopped at the cap, not run: overhead benchmark; smoke grpo" in table


def test_gpu_validate_exits_1_when_an_overhead_trial_failed(tmp_path):
    """A crash in the overhead stage is a failure (exit 1, named), never "not run (time cap)"; its row says FAILED."""
    gv = _gpu_validate()
    v = gv.Validation(gv.parse_args(["--dry-run", "--out", str(tmp_path)]))
    v.report["methods"] = ["grpo", "casp"]
    v.report["overhead"] = {"trials": {}, "summary": {}, "not_run": [], "exit_status": 1,
                            "failed": {"grpo": {"logging10": "RuntimeError: boom"}}}
    assert gv.outcome(v.report) == (1, "gpu_validate: FAILED: overhead of grpo (logging10)")
    v.write()
    table = (tmp_path / "gpu_validate.md").read_text()
    assert "| grpo | FAILED (logging10: RuntimeError: boom) |" in table and "| casp | not run (time cap) |" in table
    v.report["overhead"] = {"trials": {}, "summary": {}, "not_run": ["trl"], "exit_status": 1, "failed": {}}
    assert gv.outcome(v.report)[0] == 1  # the benchmark died before writing any trial
    v.report["overhead"]["exit_status"] = None  # stopped at the cap: not a failure
    assert gv.outcome(v.report) == (0, "gpu_validate: everything ran and passed")


def test_gpu_validate_refuses_an_unknown_method_before_any_run(tmp_path):
    out = tmp_path / "validate"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("GPU_VALIDATE_WHEELS", None)
    proc = subprocess.run(["bash", "scripts/gpu_validate.sh", "--dry-run", "--out", str(out), "--methods",
                           "casp,progrpo+ppo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "gpu_validate: error: --methods: unknown method 'progrpo+ppo'; choose from grpo, progrpo," in proc.stderr
    report = json.loads((out / "gpu_validate.json").read_text())
    assert report["overhead"] is None and report["smoke"] == [], report


def test_gpu_validate_arguments_and_carried_pins(tmp_path, monkeypatch, capsys):
    gv = _gpu_validate()
    monkeypatch.delenv("GPU_VALIDATE_WHEELS", raising=False)
    monkeypatch.setenv("OUT", str(tmp_path / "from_env"))
    args = gv.parse_args([])
    assert args.cap == 8 and args.out == tmp_path / "from_env" and not args.dry_run
    monkeypatch.delenv("OUT")
    assert gv.parse_args(["--dry-run"]).out == REPO / "outputs" / "gpu_validate"
    assert gv.parse_args(["--methods", " casp, progrpo+casp,"]).methods == ["casp", "progrpo+casp"]
    for argv, message in [(["--cap", "0"], "--cap is 0 but must be > 0 (minutes)"),
                          (["--methods", " , "], "--methods is empty; name at least one method"),
                          (["--large-only", "--methods", "casp"], "--methods does not apply to --large-only"),
                          (["--wheels", str(tmp_path / "nope")], f"--wheels {tmp_path / 'nope'} is not a folder")]:
        with pytest.raises(SystemExit):
            gv.parse_args(argv)
        assert message in capsys.readouterr().err
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("trl-1.16.0-py3-none-any.whl", "math_verify-0.9.0-py3-none-any.whl",
                 "pandas-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"):  # an older pandas than the pin: not it
        (wheels / name).touch()
    assert gv.carried_pins(wheels) == ["trl==1.16.0", "math-verify==0.9.0"]
    # The documented wheels are the script's: every pin of scripts/gpu_wheels.txt is on the page.
    page = (REPO / "docs" / "gpu_validation.md").read_text()
    pins = [x for x in (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines() if "==" in x]
    assert pins and all(pin in page for pin in pins), [p for p in pins if p not in page]


def test_every_carried_wheel_resolves_for_the_gpu_images_python(tmp_path):
    """The GPU image runs Python 3.12: each line of scripts/gpu_wheels.txt has a cp312 wheel (0.8.0 collected cp311
    wheels, and pip would have installed nothing there). Asks the package index, as the documented command does."""
    import re

    page = (REPO / "docs" / "gpu_validation.md").read_text()
    command = page[page.index("python -m pip download"):].split("\n\n")[0].replace("\\\n", " ")
    assert "--python-version 3.12" in command and "--abi cp312" in command
    args = command.split()[3:]  # after `python -m pip`
    args[args.index("-d") + 1] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "-q"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in tmp_path.glob("*.whl")}
    wanted = {re.sub(r"[-_.]+", "-", re.split(r"[=<>]", line)[0].strip()).lower()
              for line in (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert names == wanted and len(wanted) == 9, (names, wanted)
    assert not [w.name for w in tmp_path.glob("*.whl") if "cp311" in w.name or "py311" in w.name]


def test_overhead_device_large_workload_dry_run(tmp_path):
    """`overhead.py --large` (issue 56): its own workload (longer completions, one group per step), its few methods,
    `logging_steps: 10` only; the dry run keeps it to seconds."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import overhead_device
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert overhead_device.LARGE["completion_length"] == 2048 and overhead_device.LARGE["model"] == "random:qwen2.5-0.5b"
    assert overhead_device.LARGE_METHODS[:3] == ["trl", "casp", "kl_cov"]
    report = overhead_device.run("cpu", True, ["casp"], tmp_path / "o.json", large=True)
    assert report["large"] and report["workload"] == overhead_device.DRY_RUN_LARGE
    assert report["methods"] == ["trl", "casp"] and report["not_run"] == [] and report["failed"] == {}
    assert {m: set(modes) for m, modes in report["trials"].items()} == {m: {"logging10"} for m in report["methods"]}
    assert report["summary"]["casp"]["logging10"]["train_only_x_trl"] > 0
    assert json.loads((tmp_path / "o.json").read_text())["large"] is True


def test_gpu_validate_large_only_runs_the_large_overhead_alone(tmp_path, monkeypatch):
    """`--large-only`: the overhead stage with `--large` and no method list (overhead_device picks its few), no model
    build and no smoke runs; the table lists the large workload's methods."""
    gv = _gpu_validate()
    v = gv.Validation(gv.parse_args(["--dry-run", "--large-only", "--out", str(tmp_path)]))
    assert v.report["large_only"] is True
    calls = []

    def stream(cmd, env=None, log=None):
        calls.append(cmd)
        if "overhead.py" in cmd[1]:
            out = Path(cmd[cmd.index("--output") + 1])
            out.write_text(json.dumps({"workload": {"completion_length": 48}, "methods": ["trl", "casp"],
                                       "trials": {}, "summary": {}, "not_run": ["trl", "casp"], "failed": {}}))
        return 0, []

    monkeypatch.setattr(v, "install", lambda: True)
    monkeypatch.setattr(v, "probe", lambda: v.report.update(methods=["grpo", "casp", "kl_cov"]) or True)
    monkeypatch.setattr(v, "stream", stream)
    monkeypatch.setattr(v, "build_model", lambda workdir: pytest.fail("--large-only builds no smoke model"))
    monkeypatch.setattr(v, "smoke", lambda *a, **k: pytest.fail("--large-only runs no smoke test"))
    v.run()
    (cmd,) = calls
    assert "--large" in cmd and "--methods" not in cmd and "--dry-run" in cmd
    rows = [line.split("|")[1].strip() for line in (tmp_path / "gpu_validate.md").read_text().splitlines()
            if line.startswith("| ") and "not run" in line]
    assert rows == ["trl", "casp"]
