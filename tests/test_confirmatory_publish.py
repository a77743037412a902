"""The combine step reproduces what was published, byte for byte, from the committed records of both protocols:
docs/confirmatory.json, the verdict blocks of README.md and docs/confirmatory.md, the plots and the verdicts model
cards print. The slow check goes one step further back: the analysis, folded for both protocols since, writes each
set-up's committed result.json byte for byte from its run records."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from exploration_trl.experiments.confirmatory import combine_v1, combine_v2, publish

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "confirmatory_state"
SETUPS = ("countdown3", "countdown4", "countdown3_v2")
#: The commits that pre-registered each protocol, the first protocol's first.
PROTOCOL_COMMITS = ["9357c88", "4e6b608"]


def _needs_history():
    from test_confirmatory_report import needs_history

    needs_history()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """`confirm --combine` of the three committed set-ups into a fresh folder, with copies of the two pages."""
    _needs_history()
    out = tmp_path_factory.mktemp("published")
    for page in ("README.md", "confirmatory.md"):
        shutil.copyfile(ROOT / ("README.md" if page == "README.md" else "docs/confirmatory.md"), out / page)
    args = argparse.Namespace(combine=[str(STATE / s) for s in SETUPS], protocol_commit=PROTOCOL_COMMITS,
                              write=str(out / "confirmatory.json"), fill=[str(out / "README.md"),
                                                                          str(out / "confirmatory.md")])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the pins and the power curves are read from the checkout
        assert publish.combine(args) == 0
    return out


def test_the_combine_step_reproduces_docs_confirmatory_json_byte_for_byte(published):
    assert (published / "confirmatory.json").read_bytes() == (ROOT / "docs" / "confirmatory.json").read_bytes()


def test_the_combine_step_reproduces_the_verdict_blocks_and_the_plots(published):
    assert (published / "README.md").read_text() == (ROOT / "README.md").read_text()
    assert (published / "confirmatory.md").read_text() == (ROOT / "docs" / "confirmatory.md").read_text()
    for name in SETUPS:
        assert (published / "img" / f"confirmatory_{name}.png").read_bytes() == \
            (ROOT / "docs" / "img" / f"confirmatory_{name}.png").read_bytes(), name


def test_the_verdicts_cards_print_are_the_combined_ones(published, tmp_path):
    from exploration_trl.experiments.confirmatory import card_verdicts

    section = json.loads((published / "confirmatory.json").read_text())["second_protocol"]
    written = card_verdicts.write(section, tmp_path / "verdicts.json")
    assert Path(written).read_bytes() == (ROOT / card_verdicts.PACKAGE_PATH).read_bytes()


def test_one_protocols_combine_keeps_the_others_part(published, tmp_path, monkeypatch):
    """Combining the first protocol's set-ups alone rewrites its part and keeps `second_protocol` as it was."""
    write = tmp_path / "confirmatory.json"
    shutil.copyfile(published / "confirmatory.json", write)
    page = tmp_path / "page.md"
    page.write_text(f"{combine_v1.BLOCK_START}\nold\n{combine_v1.BLOCK_END}\n{combine_v2.BLOCK_START}\nkept\n"
                    f"{combine_v2.BLOCK_END}\n")
    monkeypatch.chdir(ROOT)
    args = argparse.Namespace(combine=[str(STATE / s) for s in SETUPS[:2]], protocol_commit=PROTOCOL_COMMITS[:1],
                              write=str(write), fill=[str(page)])
    assert publish.combine(args) == 0
    assert write.read_bytes() == (ROOT / "docs" / "confirmatory.json").read_bytes()
    assert "kept" in page.read_text() and "old" not in page.read_text()


def test_each_protocol_needs_its_commit(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    _needs_history()
    args = argparse.Namespace(combine=[str(STATE / s) for s in SETUPS], protocol_commit=PROTOCOL_COMMITS[1:],
                              write=str(tmp_path / "c.json"), fill=[])
    with pytest.raises(ValueError, match=r"--protocol-commit: give one commit per protocol among the set-ups "
                                         r"\(protocol 1: countdown3, countdown4; protocol 2: countdown3_v2\), in that "
                                         r"order; got 1"):
        publish.combine(args)
    assert not (tmp_path / "c.json").exists()


def test_a_page_without_a_block_of_the_combined_protocols_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"{combine_v1.BLOCK_START}\nold\n{combine_v1.BLOCK_END}\n")
    with pytest.raises(ValueError, match="page.md: has no verdict block of the protocols combined"):
        publish.fill(page, None, {"setups": []})


@pytest.mark.parametrize("name", [pytest.param("countdown3"), pytest.param("countdown4", marks=pytest.mark.slow),
                                  pytest.param("countdown3_v2", marks=pytest.mark.slow)])
def test_the_folded_analysis_writes_each_committed_result_byte_for_byte(name, tmp_path, monkeypatch):
    """`confirm --analyse-only` on a copy of the committed records (countdown3 ~15 s, in CI; countdown4 ~65 s and
    countdown3_v2 ~8 min, `-m slow`; one core of an Intel Xeon, 2026-12-06, where all three came out byte for byte).
    The numbers come from numpy's random streams and float sums: on another CPU or numpy build, where the last bits
    may differ, every number must still agree within 1e-9 and the structure exactly."""
    from exploration_trl.experiments.confirmatory import command

    run = tmp_path / name
    shutil.copytree(STATE / name, run)
    for f in ("result.json", "table.md", "plot.png"):
        (run / f).unlink(missing_ok=True)
    monkeypatch.chdir(ROOT)
    assert command.main(["--config", f"configs/confirmatory/{name}.yaml", "--analyse-only",
                         "--output-dir", str(run)]) == 0
    got, want = (run / "result.json").read_bytes(), (STATE / name / "result.json").read_bytes()
    if got != want:  # another CPU's float sums may differ in the last bits: then every number within 1e-9
        assert _close(json.loads(got), json.loads(want)), f"{name}: result.json differs beyond rounding"


def _close(got, want) -> bool:
    """Same structure, keys in the same order, equal strings and integers, floats within 1e-9 (relative)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and list(got) == list(want) and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_close, got, want))
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(got - want) <= 1e-9 * max(1.0, abs(want))
    return got == want


def test_close_tells_rounding_from_a_change():
    assert _close({"a": [0.1 + 0.2, None, "x"]}, {"a": [0.3, None, "x"]})
    assert not _close({"a": [0.31, None, "x"]}, {"a": [0.3, None, "x"]})
    assert not _close({"b": 1, "a": 2}, {"a": 2, "b": 1})  # key order is part of the file
