"""The built distribution works on its own, not only the editable checkout.

`python -m build` makes the sdist and, from the sdist, the wheel (as a release does); `twine check` validates both and
the wheel must hold every file of the package. The wheel is then installed into a fresh virtual environment that
reuses this environment's packages (torch, TRL, ...) through a `.pth` file, so nothing is downloaded, and from a
temporary directory (never the checkout) the console script shows its help, trains the toy model for 2 steps,
evaluates it on 2 problems of a built-in benchmark and renders its model card from the packaged template.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import exploration_trl

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO_ROOT / "exploration_trl"
VERSION = exploration_trl.__version__

# Data files the wheel must ship, as globs inside the wheel; each must match at least one file. Add a line when a
# feature ships data (e.g. the demo's warm-start checkpoint). Beyond these, every file under exploration_trl/ in the
# checkout must be in the wheel (`test_wheel_holds_every_package_file`).
SHIPPED_DATA = (
    "exploration_trl/data/benchmarks/*_test.jsonl",
    "exploration_trl/data/benchmarks/HumanEval.jsonl.gz",
    "exploration_trl/data/benchmarks/LICENSES.md",
    "exploration_trl/data/benchmarks/SOURCES.md",
    "exploration_trl/data/model_configs/qwen2.5-0.5b.json",
    "exploration_trl/data/model_configs/toy.json",
    "exploration_trl/hub/templates/model_card.md.j2",
    "exploration_trl/data/warm_start/countdown_tiny/model.safetensors",
    "exploration_trl/data/warm_start/countdown_tiny/config.json",
    "exploration_trl/data/warm_start/countdown_tiny/tokenizer.json",
    "exploration_trl/data/warm_start/countdown_tiny/countdown_tiny_sft.json",
)
# Files of the repository the source archive must carry besides the package.
SDIST_EXTRAS = ("README.md", "CHANGELOG.md", "LICENSE", "setup.cfg", "pyproject.toml", "mkdocs.yml",
                "docs/_hooks/table_pipes.py", "docs/methods.md",
                "configs/smoke_toy_countdown.yaml", "notebooks/quickstart_lora.ipynb")

# Top-level entries of the checkout that are build outputs or local state, not sources.
NOT_SOURCES = {".git", ".venv", "build", "dist", "outputs", "runs", ".pytest_cache"}
IGNORED_EVERYWHERE = ("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")


def run(command, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{command} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def package_files() -> list[str]:
    """Every file of the package in the checkout, as a path inside the wheel."""
    files = []
    for path in PACKAGE_DIR.rglob("*"):
        rel = path.relative_to(REPO_ROOT)
        if path.is_file() and not any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in IGNORED_EVERYWHERE):
            files.append(rel.as_posix())
    return sorted(files)


def _ignore(directory, names):
    top = Path(directory).resolve() == REPO_ROOT
    return {n for n in names if (top and (n in NOT_SOURCES or n.startswith(".venv")))
            or any(fnmatch.fnmatch(n, pat) for pat in IGNORED_EVERYWHERE)}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """sdist + wheel built from a copy of the checkout (the build writes nothing into the checkout)."""
    root = tmp_path_factory.mktemp("dists")
    src = root / "src"
    shutil.copytree(REPO_ROOT, src, ignore=_ignore, symlinks=True)
    out = root / "dist"
    # --no-isolation: build with this environment's setuptools (the `test` extra) instead of downloading one.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, src], timeout=300)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert [w.name for w in wheels] == [f"exploration_trl-{VERSION}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"exploration_trl-{VERSION}.tar.gz"]
    return SimpleNamespace(wheel=wheels[0], sdist=sdists[0])


def test_twine_check_passes(dists):
    proc = run([sys.executable, "-m", "twine", "check", "--strict", dists.wheel, dists.sdist], timeout=120)
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_wheel_holds_every_package_file(dists):
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"exploration_trl-{VERSION}.dist-info/METADATA").decode()
    missing = [f for f in package_files() if f not in names]
    assert not missing, f"not in the wheel (declare them in setup.cfg [options.package_data]): {missing}"
    for pattern in SHIPPED_DATA:
        assert fnmatch.filter(names, pattern), f"no file in the wheel matches {pattern}"
    assert {n.split("/")[0] for n in names} == {"exploration_trl", f"exploration_trl-{VERSION}.dist-info"}
    assert f"\nVersion: {VERSION}\n" in metadata
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    assert f"\nProject-URL: Source, {cfg['metadata']['url']}\n" in metadata
    assert exploration_trl.PROJECT_URL == cfg["metadata"]["url"]  # what model cards link to


def test_sdist_holds_the_package_and_the_repository_files(dists):
    prefix = f"exploration_trl-{VERSION}/"
    with tarfile.open(dists.sdist) as tar:
        names = {n[len(prefix):] for n in tar.getnames()}
    missing = [f for f in package_files() + list(SDIST_EXTRAS) if f not in names]
    assert not missing, f"not in the sdist (see MANIFEST.in): {missing}"


def test_changelog_has_a_section_for_this_version():
    headings = [line for line in (REPO_ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    if headings and headings[0] == "## Unreleased":  # Keep a Changelog: changes not yet in a version come first
        headings = headings[1:]
    assert headings and headings[0].split()[1] == VERSION  # the newest released section is the version being built
    assert "## 0.1.0 " in "\n".join(headings)


# ---------------------------------------------------------------------------------------------- installed wheel
IMPORT_CHECK = r"""
import importlib.metadata as md, json
from packaging.requirements import Requirement
import exploration_trl

dist = md.distribution("exploration-trl")
unsatisfied = []
for line in dist.requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an optional extra
    try:
        found = md.version(req.name)
    except md.PackageNotFoundError:
        found = None
    if found is None or not req.specifier.contains(found, prereleases=True):
        unsatisfied.append(f"{line} (found {found})")
print(json.dumps({"file": exploration_trl.__file__, "version": exploration_trl.__version__,
                  "dist_version": dist.version, "dist_dir": str(dist.locate_file("")), "unsatisfied": unsatisfied}))
"""


def reused_site_dirs() -> list[str]:
    """The site directories this interpreter imports from (its venv's, the system's or the user's)."""
    dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    return list(dict.fromkeys(dirs))


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory):
    """A fresh venv with the wheel installed and this environment's packages (torch included) reused, not copied."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # A plain directory line in a .pth file puts that directory on sys.path but runs none of *its* .pth files, so the
    # editable install of the checkout living there stays inactive in the new environment.
    (purelib / "_reuse_test_environment.pth").write_text("\n".join(reused_site_dirs()) + "\n")
    # pip itself comes from the reused packages; it installs into the new environment (its sys.prefix) and leaves
    # the checkout's editable install where it is ("outside environment").
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", dists.wheel],
        timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    work = root / "work"  # the working directory of every command: outside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update({
        "PATH": os.pathsep.join([str(bindir), env.get("PATH", "")]), "VIRTUAL_ENV": str(venv), "PYTHONNOUSERSITE": "1",
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(root / "hf"),
        "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg",
    })
    env.pop("HF_TOKEN", None)
    return SimpleNamespace(venv=venv, python=python, script=bindir / "exploration-trl", purelib=purelib, work=work,
                           env=env, wheel=dists.wheel)


def in_venv(installed, command, timeout=300) -> subprocess.CompletedProcess:
    return run(command, cwd=installed.work, env=installed.env, timeout=timeout)


def test_installed_wheel_is_what_gets_imported(installed):
    info = json.loads(in_venv(installed, [installed.python, "-c", IMPORT_CHECK]).stdout)
    assert Path(info["file"]).resolve().is_relative_to(installed.purelib.resolve())  # the wheel, not the checkout
    assert not Path(info["file"]).resolve().is_relative_to(REPO_ROOT)
    assert Path(info["dist_dir"]).resolve() == installed.purelib.resolve()
    assert info["version"] == info["dist_version"] == VERSION
    assert info["unsatisfied"] == []  # the wheel's requirements are met by the reused packages
    assert not (installed.purelib / "torch").exists()  # torch is reused, not installed again

    help_text = in_venv(installed, [installed.script, "--help"]).stdout
    for command in ("train", "eval", "compare", "push"):
        assert command in help_text


def test_installed_wheel_trains_evaluates_and_writes_a_card(installed):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    config = {
        "method": "casp", "model_name_or_path": "toy", "dataset_name": "countdown", "max_train_samples": 8,
        "reward_funcs": ["countdown"], "use_cpu": True, "max_steps": 2, "per_device_train_batch_size": 4,
        "num_generations": 4, "max_completion_length": 8, "learning_rate": 5.0e-4, "logging_steps": 1,
        "save_strategy": "no", "report_to": "none", "seed": 0, "output_dir": "toy-casp",
    }
    (installed.work / "train.yaml").write_text(yaml.safe_dump(config))
    in_venv(installed, [installed.script, "train", "--config", "train.yaml"], timeout=600)
    out = installed.work / "toy-casp"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()

    # the card comes from the template inside the wheel: its fixed section headings are in the written card
    with zipfile.ZipFile(installed.wheel) as whl:
        template = whl.read("exploration_trl/hub/templates/model_card.md.j2").decode()
    headings = [line for line in template.splitlines() if line.startswith("## ") and "{" not in line]
    assert len(headings) >= 3
    card = ModelCard.load(out / "README.md")
    assert {"exploration-trl", "casp"} <= set(card.data.tags)
    for heading in headings:
        assert heading in card.text, heading

    in_venv(installed, [installed.script, "eval", "--model", "toy-casp", "--benchmark", "countdown3", "--limit", "2",
                        "--n", "2", "--k", "1,2", "--max-tokens", "8", "--no-semantic", "--quiet",
                        "--output-dir", "toy-casp/eval_countdown3"])
    results = json.loads((out / "eval_countdown3" / "results.json").read_text())
    assert results["benchmark"]["num_problems"] == 2 and results["summary"]["n"] == 2
    assert results["settings"]["benchmark"] == "countdown3"  # recognised as the built-in copy ...
    assert Path(results["benchmark"]["source"]).resolve().is_relative_to(installed.purelib.resolve())  # ... shipped
    assert results["versions"]["exploration_trl"] == VERSION

    # refreshing the card picks the results up into the Hub metadata
    in_venv(installed, [installed.python, "-c", "from exploration_trl.hub import write_model_card; "
                                                "write_model_card('toy-casp')"])
    card = ModelCard.load(out / "README.md")
    _, evals = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert {(e.metric_type, e.metric_value) for e in evals} == {
        (f"pass@{k}", round(v, 4)) for k, v in results["summary"]["pass_at_k"].items()
    }


def test_installed_wheel_runs_the_demo_from_its_shipped_warm_start(installed):
    """`exploration-trl demo --quick` from the wheel: the warm start is read from the installed package."""
    in_venv(installed, [installed.script, "demo", "--quick", "--workers", "1", "--output", "demo"], timeout=300)
    summary = json.loads((installed.work / "demo" / "demo_summary.json").read_text())
    warm_start = Path(summary["demo"]["warm_start"]["path"]).resolve()
    assert warm_start.is_relative_to(installed.purelib.resolve())
    from exploration_trl.experiments.demo import DEFAULT_METHOD

    assert {"warm_start", DEFAULT_METHOD, "grpo"} <= set(summary)
    assert summary[DEFAULT_METHOD]["weights_changed"] is True
