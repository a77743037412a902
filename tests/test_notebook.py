"""Execute `notebooks/quickstart_lora.ipynb` for real, offline, on the toy model (a few seconds of training).

The `parameters` cell keeps the Colab defaults; an injected cell right after it swaps in the toy checkpoint, a tiny
local GSM8K-style training file, 2 steps and an eval of 2 problems x 2 samples, with no login or push. The install
cell runs with its default source and `EXPLORATION_TRL_NOTEBOOK_SKIP_PIP=1`: it resolves what pip would install and
stops short of pip (the package under test is installed already). The kernel is this interpreter (`sys.executable`):
a kernelspec is written to a temporary `JUPYTER_PATH`, so the test needs no kernel registered on the machine and
works from a fresh clone. The install cell's choice of source (git URL, PyPI requirement, local wheel) is tested
in-process, with `%pip` recorded instead of run.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import os
import sys
from email.message import Message
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO_ROOT / "notebooks" / "quickstart_lora.ipynb"
SKIP_PIP = "EXPLORATION_TRL_NOTEBOOK_SKIP_PIP"
KERNEL_NAME = "exploration-trl-test"
TIMEOUT_S = 240  # per cell

TRAIN_ROWS = [  # GSM8K-style rows (short, made up for this test), so the toy tokenizer's context is plenty
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 6 pens. How many pens are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"},
    {"question": "Sara had 10 cards and gave away 3. How many are left?", "answer": "10 - 3 = 7\n#### 7"},
    {"question": "Each of 4 kids gets 5 sweets. How many sweets in all?", "answer": "4 * 5 = 20\n#### 20"},
    {"question": "A shop sold 1,200 cups and then 300 more. How many cups?", "answer": "1200+300\n#### 1,500"},
]


def parameter_overrides(tmp_path: Path) -> dict:
    from exploration_trl.toy import make_toy_checkpoint

    toy = make_toy_checkpoint(tmp_path / "toy_model", seed=0)
    data = tmp_path / "gsm8k_tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN_ROWS))
    return {
        "MODEL_ID": str(toy),
        "DATASET": str(data),
        "TRAIN_SAMPLES": 4,
        "STEPS": 2,
        "NUM_GENERATIONS": 2,
        "BATCH_SIZE": 4,
        "MAX_COMPLETION_LENGTH": 8,
        "LEARNING_RATE": 1e-3,
        "LORA_R": 4,
        "EVAL_BENCHMARK": "gsm8k",
        "EVAL_PROBLEMS": 2,
        "EVAL_N": 2,
        "EVAL_MAX_TOKENS": 8,
        "EVAL_BASE_MODEL": True,
        "OUTPUT_DIR": str(tmp_path / "run" / "toy-casp-lora"),
        "LOGIN": False,
        "PUSH_TO_HUB": False,
        "HUB_REPO_ID": None,
    }


def inject_parameters(nb, overrides: dict) -> int:
    """Insert a cell assigning `overrides` right after the `parameters` cell (as papermill does); returns its index."""
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    defaults = nb.cells[index].source
    for name in overrides:
        assert f"\n{name} = " in f"\n{defaults}", f"{name} is not a notebook parameter"
    lines = [f"{k} = {v!r}" for k, v in overrides.items()]
    source = "# Parameters injected by tests/test_notebook.py\n" + "\n".join(lines)
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return index + 1


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec for this interpreter in a private JUPYTER_PATH, and an offline environment for the kernel."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "exploration-trl test",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # never read a real token or cache
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # same path on every CI machine: CPU
    monkeypatch.setenv(SKIP_PIP, "1")  # the install cell resolves its source but does not run pip
    return KERNEL_NAME


def project_url() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    return cfg["metadata"]["url"]


def install_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if "install" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1 and cells[0].cell_type == "code"
    return cells[0]


def test_notebook_structure():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and params[0].cell_type == "code"
    for name in ("PACKAGE_SOURCE", "MODEL_ID", "DATASET", "STEPS", "PUSH_TO_HUB", "INSTALL", "LOGIN", "METHOD", "EVAL_N"):
        assert f"{name} = " in params[0].source
    assert params[0].source.startswith("PACKAGE_SOURCE = None ")  # the git URL, until a PyPI release exists
    assert 'MODEL_ID = "Qwen/Qwen2.5-0.5B-Instruct"' in params[0].source
    assert 'DATASET = "openai/gsm8k"' in params[0].source
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells.index(install_cell()) == code_cells.index(params[0]) + 1  # installs before any import
    code = "\n".join(c.source for c in code_cells)
    for needle in ("%pip install", "notebook_login()", "LoraConfig(", "peft_config=peft_config", "run_eval(",
                   "Image(", "write_model_card(", "push_output_dir(", "if PUSH_TO_HUB", "if INSTALL"):
        assert needle in code, needle
    assert f'PROJECT_URL = "{project_url()}"' in install_cell().source  # the fallback is setup.cfg's url
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "pypi.org" not in markdown  # no link to a PyPI page before a release exists
    assert f"git+{project_url()}" in markdown
    assert all(not c.get("outputs") for c in code_cells), "commit the notebook without outputs"


def run_install_cell(monkeypatch, cwd: Path, **params) -> tuple[list[str], dict]:
    """Run the install cell as IPython would (same magic transform, same `{var}` expansion) with `%pip` recorded
    instead of run. Returns the recorded magic lines and the cell's namespace."""
    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.utils.text import DollarFormatter

    namespace = {"PACKAGE_SOURCE": None, "INSTALL": True, **params}
    calls: list[str] = []

    class RecordingShell:
        def run_line_magic(self, name, line):
            calls.append(f"%{name} " + DollarFormatter().vformat(line, args=[], kwargs=namespace))

    namespace["get_ipython"] = RecordingShell
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(SKIP_PIP, raising=False)
    exec(compile(TransformerManager().transform_cell(install_cell().source), "install-cell", "exec"), namespace)
    return calls, namespace


def fake_installed(monkeypatch, source_url: str | None):
    """Make `importlib.metadata` see an installed exploration-trl with this Source URL (None: not installed)."""
    real = importlib.metadata.metadata

    def metadata(name):
        if name != "exploration-trl":
            return real(name)
        if source_url is None:
            raise importlib.metadata.PackageNotFoundError(name)
        msg = Message()
        msg["Name"] = "exploration-trl"
        msg["Project-URL"] = f"Source, {source_url}"
        return msg

    monkeypatch.setattr(importlib.metadata, "metadata", metadata)


def test_install_cell_defaults_to_the_git_url_of_setup_cfg(tmp_path, monkeypatch):
    fake_installed(monkeypatch, None)  # a fresh Colab runtime: nothing installed, no clone around
    calls, ns = run_install_cell(monkeypatch, tmp_path)
    assert calls == [f"%pip install -q git+{project_url()}"]
    assert ns["requirement"] == "git+https://github.com/exploration-trl/exploration-trl"


def test_install_cell_default_reads_an_installed_package_then_a_clone(tmp_path, monkeypatch):
    fake_installed(monkeypatch, "https://example.org/installed/exploration-trl")
    calls, _ = run_install_cell(monkeypatch, tmp_path)
    assert calls == ["%pip install -q git+https://example.org/installed/exploration-trl"]

    clone = tmp_path / "clone"
    (clone / "notebooks").mkdir(parents=True)
    (clone / "setup.cfg").write_text("[metadata]\nname = exploration-trl\nurl = https://example.org/fork\n")
    (clone / "notebooks" / "setup.cfg").write_text("[metadata]\nname = another-project\nurl = https://x.org\n")
    calls, _ = run_install_cell(monkeypatch, clone / "notebooks")
    assert calls == ["%pip install -q git+https://example.org/fork"]


@pytest.mark.parametrize("source, expected", [
    ("exploration-trl", "exploration-trl"),
    ("exploration-trl==0.2.0", "exploration-trl==0.2.0"),
    ("exploration_trl[vllm]>=0.2", "'exploration_trl[vllm]>=0.2'"),
    ("exploration-trl @ git+https://example.org/e.git@v0.2.0", "'exploration-trl @ git+https://example.org/e.git@v0.2.0'"),
    ("git+https://github.com/me/exploration-trl@v0.2.0", "git+https://github.com/me/exploration-trl@v0.2.0"),
    ("https://github.com/me/exploration-trl", "git+https://github.com/me/exploration-trl"),
    ("https://example.org/exploration_trl-0.2.0-py3-none-any.whl",
     "https://example.org/exploration_trl-0.2.0-py3-none-any.whl"),
])
def test_install_cell_accepts_git_urls_and_requirements(tmp_path, monkeypatch, source, expected):
    calls, _ = run_install_cell(monkeypatch, tmp_path, PACKAGE_SOURCE=source)
    assert calls == [f"%pip install -q {expected}"]


def test_install_cell_accepts_a_local_wheel_or_folder(tmp_path, monkeypatch):
    wheel = tmp_path / "my dist" / "exploration_trl-0.2.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"")
    calls, _ = run_install_cell(monkeypatch, tmp_path, PACKAGE_SOURCE="my dist/" + wheel.name)
    assert calls == [f"%pip install -q '{wheel}'"]  # absolute, and quoted for the shell

    calls, _ = run_install_cell(monkeypatch, wheel.parent, PACKAGE_SOURCE=wheel.name)  # a wheel in the working dir
    assert calls == [f"%pip install -q '{wheel}'"]

    (tmp_path / "exploration-trl").mkdir()
    calls, _ = run_install_cell(monkeypatch, tmp_path, PACKAGE_SOURCE="./exploration-trl")
    assert calls == [f"%pip install -q {tmp_path / 'exploration-trl'}"]


@pytest.mark.parametrize("source, error, text", [
    ("uploads/exploration_trl-0.2.0-py3-none-any.whl", FileNotFoundError, "does not exist; upload the file"),
    ("exploration_trl-0.2.0.tar.gz", FileNotFoundError, "does not exist; upload the file"),
    ("trl", ValueError, "is not a git URL, a local wheel or folder, or an exploration-trl requirement"),
])
def test_install_cell_rejects_a_bad_source_before_pip(tmp_path, monkeypatch, source, error, text):
    with pytest.raises(error, match=f"PACKAGE_SOURCE '{source}' {text}"):
        run_install_cell(monkeypatch, tmp_path, PACKAGE_SOURCE=source)


def test_install_cell_can_be_switched_off(tmp_path, monkeypatch, capsys):
    calls, _ = run_install_cell(monkeypatch, tmp_path, INSTALL=False)
    assert calls == []
    monkeypatch.setenv(SKIP_PIP, "1")
    namespace = {"PACKAGE_SOURCE": "exploration-trl", "INSTALL": True}
    from IPython.core.inputtransformer2 import TransformerManager

    exec(compile(TransformerManager().transform_cell(install_cell().source), "install-cell", "exec"), namespace)
    assert capsys.readouterr().out == f"pip install exploration-trl\nskipped: {SKIP_PIP}=1\n"


def test_notebook_runs_offline_on_the_toy_model(tmp_path, kernel_env):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    overrides = parameter_overrides(tmp_path)
    inject_parameters(nb, overrides)
    workdir = tmp_path / "run"
    workdir.mkdir(exist_ok=True)
    client = nbclient.NotebookClient(
        nb, kernel_name=kernel_env, timeout=TIMEOUT_S, startup_timeout=120, allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()

    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code_cells):
        assert cell.get("execution_count") is not None, f"code cell {i} did not run"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"code cell {i} failed: {errors}"

    out = Path(overrides["OUTPUT_DIR"])
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    results = json.loads((out / "eval_gsm8k" / "results.json").read_text())
    assert results["summary"]["n"] == 2 and results["benchmark"]["num_problems"] == 2
    assert (workdir / "eval_runs" / "base_gsm8k" / "results.json").is_file()
    assert (workdir / "pass_at_k.png").read_bytes().startswith(b"\x89PNG")

    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft"
    assert {"exploration-trl", "casp", "grpo", "rlvr"} <= set(card.data.tags)
    assert not any(t.startswith("base_model:") for t in card.data.tags)  # peft's local-path tag is dropped
    _, evals = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert {(e.metric_type, e.metric_value) for e in evals} == {
        (f"pass@{k}", round(v, 4)) for k, v in results["summary"]["pass_at_k"].items()
    }
    assert "@misc{peng2025casp," in card.text

    # outputs the reader sees inline: the curves and pass@k images, the pass@k lines, the not-pushed note
    images = [o for c in code_cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2
    streams = [o for c in code_cells for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    text = "\n".join(o.get("text", "") for o in streams)
    assert "casp LoRA:" in text and "base model:" in text and "pass@1=" in text
    assert "Not pushed (PUSH_TO_HUB=False)" in text
    assert f"pip install git+{project_url()}\nskipped: {SKIP_PIP}=1" in text  # the default source, pip not run
    assert "trainable params" in text
