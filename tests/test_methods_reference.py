"""The methods table (README.md, docs/methods.md) and the API reference's methods section are generated from the
method registry (`exploration_trl/cli/methods_reference.py`): the committed files are the generator's output, and a
method registered in its own module appears in both without an edit to them or to the generator."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exploration_trl.cli import methods_reference
from exploration_trl.methods import MethodInfo, arxiv_paper, register_method, unregister
from exploration_trl.trainers import ExplorationGRPOConfig, ExplorationGRPOTrainer
from exploration_trl.trainers.strategy import AdvantageStrategy

ROOT = Path(__file__).resolve().parent.parent


def test_committed_files_are_the_generators_output():
    proc = subprocess.run([sys.executable, "-m", "exploration_trl.cli.methods_reference", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.strip()


def test_check_names_the_stale_file_and_the_command(tmp_path, capsys):
    for rel in methods_reference.FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text(encoding="utf-8").replace("| `casp` |", "| `cas` |"),
                                    encoding="utf-8")
    assert methods_reference.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"README.md, docs/methods.md out of date: run `{methods_reference.COMMAND}`\n"
    assert methods_reference.main(["--root", str(tmp_path)]) == 0
    assert methods_reference.main(["--check", "--root", str(tmp_path)]) == 0


@pytest.fixture
def shifted():
    @dataclass
    class ShiftedConfig(ExplorationGRPOConfig):
        shifted_by: float = field(default=0.5, metadata={"help": "Added to every advantage."})
        epsilon_high: float | None = 0.3

    @register_method(MethodInfo(
        name="shifted", side="advantage", display="Shifted", summary="a constant added to every advantage",
        description="Adds a constant.", paper=arxiv_paper("doe2099", "A Shift", "Doe, 2099", ["Jane Doe"], 2099,
                                                            "9999.00001"),
        config_prefixes=("shifted_",), where="Eq. 1", changes="`A + c`"))
    class Shifted(AdvantageStrategy):
        config_class = ShiftedConfig

    class ShiftedTrainer(ExplorationGRPOTrainer):
        method = "shifted"

    yield ShiftedTrainer
    unregister("shifted")


def test_a_registered_method_gets_its_row_and_its_api_section(shifted):
    rows = methods_reference.table().splitlines()
    assert ("| `shifted` | Shifted: [Doe, 2099](https://arxiv.org/abs/9999.00001), Eq. 1 | `A + c` | "
            "`shifted_by=0.5`, `epsilon_high=0.3` |") in rows
    assert rows[-1].startswith("| any config | STILL")  # shapings after the methods
    api = methods_reference.api()
    assert f"::: {shifted.__module__}.{shifted.__qualname__}\n" in api and "### Shifted\n" in api
    assert f"::: {shifted.config_class.__module__}.{shifted.config_class.__qualname__}\n" in api


def test_markers_are_required(tmp_path):
    with pytest.raises(ValueError, match="needs exactly one <!-- methods-table:start --> and one"):
        methods_reference.fill("no markers", methods_reference.TABLE_START, methods_reference.TABLE_END, "x", "f.md")
