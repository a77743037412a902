"""`benchmarks/casp_cpu_goal.py` (issue 66's CPU-time check of CaSP against TRL), with the trials faked: the cells and
methods it times, the deadline that bounds it, the JSON and the docs block it writes, the verdict against 1.05x."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def goal(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    module = importlib.import_module("casp_cpu_goal")
    monkeypatch.setattr(module.overhead, "toy_checkpoint", lambda path, workload: str(path))
    return module


def fake_trials(monkeypatch, goal, casp_cpu, calls):
    """Each trial: TRL 1.0 CPU s per step, `grpo` 1.01, CaSP `casp_cpu`; peak allocated 100 MB each."""
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if "--trial" not in cmd:
            return real_run(cmd, *args, **kwargs)
        method = cmd[cmd.index("--trial") + 1]
        calls.append((method, int(cmd[cmd.index("--logging-steps") + 1]), int(cmd[cmd.index("--steps") + 1])))
        cpu = {"trl": 1.0, "grpo": 1.01, "casp": casp_cpu}[method]
        result = {"step_time": cpu, "step_cpu": cpu, "peak_rss_delta_mb": 100.0, "peak_alloc_delta_mb": 100.0}
        return types.SimpleNamespace(stdout="RESULT " + json.dumps(result), stderr="")

    monkeypatch.setattr(goal.overhead.subprocess, "run", run)


def doc_with_block(tmp_path, goal) -> Path:
    doc = tmp_path / "overhead.md"
    doc.write_text(f"# Page\n\nbefore\n\n{goal.BEGIN}\nNot measured yet.\n{goal.END}\n\nafter\n", encoding="utf-8")
    return doc


@pytest.mark.parametrize("casp_cpu,word", [(1.02, "within"), (1.08, "over")])
def test_times_trl_grpo_and_casp_at_trls_logging_and_writes_json_and_doc(goal, monkeypatch, tmp_path, casp_cpu, word):
    calls = []
    fake_trials(monkeypatch, goal, casp_cpu, calls)
    doc, out = doc_with_block(tmp_path, goal), tmp_path / "casp66.json"
    assert goal.main(["--output", str(out), "--doc", str(doc)]) == 0
    # base: 4 rounds, 151,936 vocabulary: 3 rounds, of the three methods; all at TRL's default logging, 3 steps
    assert len(calls) == 4 * 3 + 3 * 3 and {c[1] for c in calls} == {10} and {c[2] for c in calls} == {3}
    report = json.loads(out.read_text())
    assert list(report["runs"]) == ["V32768_T64_G8_log10", "V151936_T64_G8_log10"]
    assert report["cpu"] and report["runs"]["V32768_T64_G8_log10"]["methods"]["casp"]["rounds"] == 4
    text = doc.read_text()
    assert text.startswith("# Page\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "Not measured yet" not in text
    assert text.count(goal.BEGIN) == text.count(goal.END) == 1
    assert f"- V151936_T64_G8_log10: CaSP {casp_cpu:.3f}× TRL's CPU time ({word} 1.05×" in text
    assert "`grpo`, which does TRL's exact work, 1.010×" in text and "peak allocated 1.0000× TRL's" in text
    assert f"| casp | 4 | {casp_cpu:.2f} | {casp_cpu:.3f} |" in text  # the base cell's table
    cpu = goal.overhead.cpu_model()
    assert report["cpu"] == cpu and text.count(f"; {cpu}). TRL:") == 2  # the processor beside each cell's table
    # --render writes the same block again from the JSON alone
    before = doc.read_text()
    doc.write_text(before.replace("CaSP", "CASP"))
    assert goal.main(["--render", "--output", str(out), "--doc", str(doc)]) == 0
    assert doc.read_text() == before and len(calls) == 21


def test_no_trial_starts_past_the_deadline(goal, monkeypatch, tmp_path):
    """Every trial takes 50 s on the fake clock: each cell starts trials within its own seconds only (so both cells
    are timed), and none starts later than `LONGEST_TRIAL_S` before the budget ends."""
    calls = []
    fake_trials(monkeypatch, goal, 1.0, calls)
    clock = [1000.0]

    def tick():
        return clock[0]

    real_run = goal.overhead.subprocess.run

    def slow(cmd, *args, **kwargs):
        clock[0] += 50.0
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(goal.overhead.subprocess, "run", slow)
    monkeypatch.setattr(goal.time, "time", tick)
    monkeypatch.setattr(goal.overhead.time, "time", tick)
    report = goal.measure_all(tmp_path / "casp66.json")
    started = len(calls)
    assert started * 50.0 <= goal.BUDGET_S and (started + 1) * 50.0 > goal.BUDGET_S - goal.LONGEST_TRIAL_S
    runs = report["runs"]
    assert runs["V32768_T64_G8_log10"].get("stopped_at_deadline") and runs["V151936_T64_G8_log10"].get("stopped_at_deadline")
    assert runs["V32768_T64_G8_log10"]["methods"]["casp"]["rounds"] >= 1
    assert runs["V151936_T64_G8_log10"]["methods"]["casp"]["rounds"] >= 1


def test_the_processor_is_kept_when_a_report_is_merged_or_resummarised(goal, monkeypatch, tmp_path):
    """`overhead.py --merge` and `--summarize` recompute every cell from its raw trials: the processor stays."""
    fake_trials(monkeypatch, goal, 1.0, [])
    report = goal.measure_all(tmp_path / "casp66.json")
    monkeypatch.setattr(goal.overhead, "cpu_model", lambda: "Other CPU, 2 CPUs")
    merged = goal.overhead.merge_reports([report, report])
    assert {run["cpu"] for run in merged["runs"].values()} == {report["cpu"]}
    path = tmp_path / "casp66.json"
    monkeypatch.setattr(goal.overhead, "plot_scaling", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--summarize", str(path)])
    assert goal.overhead.main() == 0
    assert {run["cpu"] for run in json.loads(path.read_text())["runs"].values()} == {report["cpu"]}


def test_refuses_a_doc_without_the_block(goal, tmp_path):
    doc = tmp_path / "overhead.md"
    doc.write_text("# Page\n")
    with pytest.raises(SystemExit, match="casp66-cpu-time"):
        goal.write_doc({"runs": {}, "cpu": "x", "date": "2026-12-06"}, doc)


def test_the_docs_page_has_the_block():
    text = (REPO / "docs" / "overhead.md").read_text(encoding="utf-8")
    assert text.count("<!-- casp66-cpu-time:begin -->") == text.count("<!-- casp66-cpu-time:end -->") == 1
