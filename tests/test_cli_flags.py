"""The command line's shape: one spelling for an output folder (`--output-dir`), the old one still read, the
`exploration_trl.cli` package's entry points, and `train --help-all` surviving a `%` in a key's help."""

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exploration_trl import cli
from exploration_trl.cli import build_parser, main

CLI_DIR = Path(cli.__file__).parent


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_demo_documents_output_dir_and_still_reads_output(capsys):
    text = _help(capsys, ["demo"])
    assert "--output-dir" in text
    assert not re.search(r"--output(?!-dir)\b", text), "the old spelling --output is listed in demo --help"
    from exploration_trl.experiments.demo import output_folder

    parse = build_parser().parse_args
    assert output_folder(parse(["demo"])) == Path("outputs/demo")
    assert output_folder(parse(["demo", "--quick"])) == Path("outputs/demo_quick")  # never over a full run
    assert parse(["demo", "--output-dir", "a"]).output == parse(["demo", "--output", "a"]).output == "a"


@pytest.mark.parametrize("command", ["eval", "demo", "push"])
def test_commands_that_write_a_folder_take_output_dir(capsys, command):
    assert "--output-dir" in _help(capsys, [command])


def test_entry_points_of_the_package():
    # setup.cfg's console script is `exploration_trl.cli:main`; `python -m exploration_trl.cli` runs `__main__`.
    assert callable(cli.main) and cli.main.__module__ == "exploration_trl.cli.entry_point"
    assert (CLI_DIR / "__main__.py").is_file()
    too_long = {p.name: n for p in CLI_DIR.glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not too_long, f"cli modules over 400 lines: {too_long}"


def test_help_all_survives_a_percent_sign_in_a_key_help(capsys, monkeypatch):
    from exploration_trl.trainers import ExplorationGRPOConfig

    @dataclass
    class PercentConfig(ExplorationGRPOConfig):
        interval_key: float = field(default=0.95, metadata={"help": "a 95% interval (%(default)s)"})

    monkeypatch.setattr("exploration_trl.trainers.get_config_class", lambda method: PercentConfig)
    assert main(["train", "--help-all"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a 95% interval (0.95)" in out and "~10% slower" in out
