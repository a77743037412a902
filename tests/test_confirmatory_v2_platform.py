"""Amendment 2 (the platform rule) and the launcher that records every run segment's platform.

The launcher is run for real, in-process, on a stand-in archive whose `--job` module writes a record at once (the
frozen training would take minutes per run): its order (check, control, method arms), its segment log, its locks
and its slots are what is tested here."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from exploration_trl.experiments.confirmatory import launcher, platform, platform_rule, protocol

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "confirmatory_state" / "countdown3_v2"
CONFIG = ROOT / "configs" / "confirmatory" / "countdown3_v2.yaml"
SHA = "4e6b608d716e3ec2d6216661676883b841b8a2df"
BASELINES = ("grpo", "grpo_lr_half")  # the arms whose records existed before amendment 2

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile

processor\t: 1
vendor_id\t: AuthenticAMD
"""


def _amendment():
    return platform_rule.load("countdown3_v2", ROOT)


# -------------------------------------------------------------------------------------------- the platform
def test_the_platform_is_the_first_cpus_kernel_facts_and_its_id_is_stable():
    cpu = platform.cpu(CPUINFO)
    assert cpu == {"vendor": "GenuineIntel", "family": "6", "model": "207", "model_name": "Intel(R) Xeon(R) Processor",
                   "stepping": "2", "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"]}
    desc = {"cpu": cpu, "torch_cpu_capability": "AVX512", "versions": {"torch": "2.13.0+cpu"}, "python": "3.11.7"}
    assert platform.platform_id(desc) == platform.platform_id(json.loads(json.dumps(desc)))
    other = {**desc, "cpu": {**cpu, "isa": cpu["isa"][:3]}}
    assert platform.platform_id(other) != platform.platform_id(desc) and len(platform.platform_id(desc)) == 12


def test_another_library_version_is_refused_with_the_install_command():
    wanted = _amendment()["run_environment"]
    platform.check_environment(wanted, {k: str(v) for k, v in wanted.items()})
    with pytest.raises(ValueError, match=r"transformers 5\.26\.0 \(wanted 5\.25\.0\).*pip install torch==2\.13\.0 "
                                         r"transformers==5\.25\.0"):
        platform.check_environment(wanted, {**{k: str(v) for k, v in wanted.items()}, "transformers": "5.26.0"})


# ----------------------------------------------------------------------------------------------- the amendment
def test_amendment_2_only_adds_caution_and_names_the_registered_arms():
    a = _amendment()
    cfg = protocol.load(CONFIG)
    methods = [s for s in cfg["settings"] if s.get("role") in ("tuned", "new", "replication")]
    assert a["protocol_commit"] == SHA[:7] and a["platform_control"]["raw_alpha"] == cfg["alpha"]
    assert all(s["seeds"] == a["platform_control"]["seeds"] for s in methods)  # the method arms' own seeds
    assert sorted(a["platform_control"]["checkpoint_families"]) == sorted(cfg["checkpoints"])
    ctl = platform_rule.control_config(cfg, a)
    assert [j["label"] for j in protocol.confirm_jobs(ctl, None)] == ["grpo_platform"] * 18
    assert {k: v for k, v in ctl.items() if k not in ("settings", "baseline", "selection")} == \
        {k: v for k, v in cfg.items() if k not in ("settings", "baseline", "selection")}
    check = platform_rule.check_config(cfg, a)
    assert protocol.confirm_jobs(check, None) == [{"phase": "confirm", "label": "grpo", "method": "grpo",
                                                      "overrides": {}, "seed": 100, "steps": [0, 100, 200]}]


def test_amendment_2_precedes_every_method_arm_record():
    """The commit that added amendment 2 is an ancestor of every commit that added a method-arm or control record."""
    path = "configs/confirmatory/countdown3_v2_amendment2.yaml"
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", path], cwd=ROOT,
                           capture_output=True, text=True).stdout.split()
    assert added, "amendment 2 was never committed"
    arms = {"grpo", "grpo_lr_half"}
    later = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--name-only", "--",
                            "confirmatory_state/countdown3_v2/runs", "confirmatory_state/countdown3_v2/platform_control"],
                           cwd=ROOT, capture_output=True, text=True).stdout
    commit = None
    for line in later.splitlines():
        if len(line) == 40 and " " not in line and "/" not in line:
            commit = line
        elif line.endswith(".json") and "/selection/" not in line and Path(line).name.split("__")[0] not in arms:
            ok = subprocess.run(["git", "merge-base", "--is-ancestor", added[-1], commit], cwd=ROOT).returncode == 0
            assert ok, f"{line} was committed in {commit[:7]}, before amendment 2"


def test_every_committed_record_is_the_reference_platforms_by_its_fingerprint():
    # Only a segment's start names its platform; a paused segment's end (`exit`, `last_step`) does not.
    a = _amendment()
    checked = {p.stem for p in (STATE / "platforms" / "checks").glob("*.json")}
    for phase, folder in (("confirm", STATE / "runs"), ("selection", STATE / "runs" / "selection")):
        for path in sorted(folder.glob("*__seed*.json")):
            rec = json.loads(path.read_text())
            starts = {s["platform_id"] for s in platform_rule.segments(STATE, phase, rec["label"], rec["seed"])
                      if s.get("event") == "start"}
            got = platform_rule.record_platforms(STATE, rec, a)
            assert got == (sorted(starts) or ["reference"]), path.name
            assert set(got) <= checked | {"reference"}, f"{path.name}: made on {got}, no committed platform check"
            assert all((STATE / "platforms" / "hosts" / f"{pid}.json").is_file() for pid in starts), path.name


def test_a_record_without_a_platform_log_and_another_fingerprint_is_refused():
    rec = json.loads((STATE / "runs" / "grpo__seed100.json").read_text())
    rec["rows"][0]["token_entropy"] = 0.4756019348083057  # this Xeon's step 0
    with pytest.raises(ValueError, match=r"run confirm:grpo:100 has no platform log .* 0\.4756019348083057 is not "
                                         r"the reference fingerprint 0\.4756019319177367"):
        platform_rule.record_platforms(STATE, rec, _amendment())


def test_the_same_platform_check_needs_every_count_and_the_entropy():
    committed = json.loads((STATE / "runs" / "grpo__seed100.json").read_text())
    same = platform_rule.compare_check(committed, committed, [0, 100, 200])
    assert same["reproduces"] and same["first_differing_step"] is None
    drift = json.loads(json.dumps(committed))
    drift["rows"][0]["token_entropy"] += 3e-9
    assert platform_rule.compare_check(drift, committed, [0, 100, 200])["first_differing_step"] == 0
    moved = json.loads(json.dumps(committed))
    moved["correct_counts"]["100"][7] += 1
    got = platform_rule.compare_check(moved, committed, [0, 100, 200])
    assert not got["reproduces"] and got["first_differing_step"] == 100


# ------------------------------------------------------------------------------------------------ the launcher
STUB = '''
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--output-dir") + 1]); phase, label, seed = args[args.index("--job") + 1].split(":")
committed = json.loads(Path(os.environ["STUB_COMMITTED"]).read_text())
rec = {**committed, "label": label, "seed": int(seed), "finished": True, "overrides": {}}
if label == "grpo" and os.environ.get("STUB_DIFFERS"):
    rec["rows"][0]["token_entropy"] += 3e-9
Path(out, "runs").mkdir(parents=True, exist_ok=True)
time.sleep(float(os.environ.get("STUB_SLEEP", "0")))
Path(out, "runs", f"{label}__seed{seed}.json").write_text(json.dumps(rec))
'''


def _method_arms(folder, names):
    """`shutil.copytree`'s ignore: the method arms' records and platform logs, so that a copy of the committed state
    is the state the method arms found (their committed records would make the tests' jobs finished, and their logs
    would name this machine's platform)."""
    if Path(folder) not in (STATE / "runs", STATE / "platforms" / "confirm"):
        return []
    return [n for n in names if "__seed" in n and n.split("__seed")[0] not in BASELINES]


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """An archive whose `--job` writes a finished record, and a run folder restored from the committed state."""
    archive = tmp_path / "archive"
    pkg = archive / "exploration_trl" / "experiments" / "confirmatory"
    pkg.mkdir(parents=True)
    for d in (archive / "exploration_trl", archive / "exploration_trl" / "experiments", pkg):
        (d / "__init__.py").write_text("")
    (archive / "exploration_trl" / "_commit.py").write_text(f'ARCHIVED_COMMIT = "{SHA}"\n')
    (pkg / "command.py").write_text(textwrap.dedent(STUB))
    (archive / "configs" / "confirmatory").mkdir(parents=True)
    shutil.copyfile(CONFIG, archive / "configs" / "confirmatory" / "countdown3_v2.yaml")
    output = tmp_path / "runs"
    output.mkdir()
    shutil.copytree(STATE / "warm_start", output / "warm_start")
    shutil.copyfile(STATE / "selection.json", output / "selection.json")
    shutil.copytree(STATE / "runs", output / "runs", ignore=_method_arms)
    monkeypatch.setattr(launcher, "POLL_S", 0.05)
    monkeypatch.setattr(launcher, "prioritise", lambda: "no cgroup in tests")
    monkeypatch.setattr(launcher.provenance, "source_hash", lambda root=None: json.loads(
        (STATE / "runs" / "grpo__seed100.json").read_text())["provenance"]["source_hash"])
    monkeypatch.setattr(launcher.platform, "check_environment", lambda wanted, found=None: None)
    monkeypatch.setenv("STUB_COMMITTED", str(STATE / "runs" / "grpo__seed100.json"))
    return archive, output


def test_a_platform_that_reproduces_grpo_runs_no_control(stand_in):
    archive, output = stand_in
    assert launcher.run(archive, output, 2, "control") == 0
    pid = platform.platform_id(platform.describe())
    check = json.loads((output / "platforms" / "checks" / f"{pid}.json").read_text())
    assert check["reproduces"]
    # while the check is undecided the other slot starts the first control run; once it passes, no other starts
    assert len(list((output / "platform_control").glob("*/runs/*.json"))) <= 1
    (start, end) = platform_rule.segments(output / "platforms" / "checks" / pid, "confirm", "grpo", 100)
    assert start["event"] == "start" and start["platform_id"] == pid and start["resume_from_step"] == 0
    assert end["event"] == "end" and end["exit"] == 0 and end["finished"] is True
    assert json.loads((output / "platforms" / "hosts" / f"{pid}.json").read_text())["cpu"]["isa"] is not None


def test_another_platform_runs_its_control_before_any_method_arm(stand_in, monkeypatch):
    archive, output = stand_in
    monkeypatch.setenv("STUB_DIFFERS", "1")
    assert launcher.run(archive, output, 2, "control") == 0
    pid = platform.platform_id(platform.describe())
    assert json.loads((output / "platforms" / "checks" / f"{pid}.json").read_text())["first_differing_step"] == 0
    folder = output / "platform_control" / pid
    assert sorted(int(p.stem.split("seed")[1]) for p in (folder / "runs").glob("*.json")) == list(range(100, 118))
    cfg = protocol.load(folder / "config.yaml")
    assert cfg["settings"][0]["steps"] == [0, 500, 1000] and cfg["eval"] == protocol.load(CONFIG)["eval"]
    for sd in range(100, 118):
        starts = [s for s in platform_rule.segments(folder, "confirm", "grpo_platform", sd) if s["event"] == "start"]
        assert [s["platform_id"] for s in starts] == [pid]
    assert not list((output / "runs").glob("maxrl__*.json"))  # scope control: no method arm
    order = [line.split()[3] for line in (output / "launcher.log").read_text().splitlines() if "starting" in line]
    assert order[0] == "check:" + pid + ":grpo:100"


def test_a_job_whose_lock_is_held_is_not_started_twice(stand_in, monkeypatch):
    archive, output = stand_in
    pid = platform.platform_id(platform.describe())
    (output / "platforms" / "checks").mkdir(parents=True)
    (output / "platforms" / "checks" / f"{pid}.json").write_text(json.dumps({"reproduces": True}))
    lock_path = output / "locks" / "confirm__main__progrpo_tuned__100.lock"
    lock_path.parent.mkdir(parents=True)
    held = os.open(lock_path, os.O_CREAT | os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # another launcher's job holds it
    monkeypatch.setattr(launcher, "plan", lambda out, arc, a, p, scope: [
        j for j in [{"kind": "confirm", "folder": output, "cfg": None, "label": lab, "seed": 100}
                    for lab in ("progrpo_tuned", "dsgrpo_tuned")] if not launcher.is_finished(j)]
        if not (output / "stop").exists() else [])
    monkeypatch.setattr(launcher, "POLL_S", 0.05)
    real_sleep = launcher.time.sleep

    def sleep_then_stop(s):
        if launcher.is_finished({"folder": output, "label": "dsgrpo_tuned", "seed": 100}):
            (output / "stop").write_text("")
        real_sleep(s)

    monkeypatch.setattr(launcher.time, "sleep", sleep_then_stop)
    launcher.run(archive, output, 2, "all")
    assert (output / "runs" / "dsgrpo_tuned__seed100.json").is_file()
    assert not (output / "runs" / "progrpo_tuned__seed100.json").is_file()
    os.close(held)


def test_a_checkpoint_cut_by_a_kill_is_set_aside(tmp_path):
    ckpt = tmp_path / "ckpt" / "maxrl__seed100"
    (ckpt / "checkpoint-500").mkdir(parents=True)
    (ckpt / "checkpoint-500" / "trainer_state.json").write_text("{}")
    (ckpt / "checkpoint-1000").mkdir()
    moved = launcher.set_aside_incomplete(tmp_path, "maxrl", 100)
    assert len(moved) == 1 and moved[0].startswith("incomplete-checkpoint-1000")
    assert launcher.resume_step(tmp_path, "maxrl", 100) == 500


def test_the_launcher_refuses_an_archive_of_another_commit(stand_in):
    archive, output = stand_in
    (archive / "exploration_trl" / "_commit.py").write_text('ARCHIVED_COMMIT = "0123456"\n')
    with pytest.raises(ValueError, match="not an archive of the protocol commit 4e6b608"):
        launcher.run(archive, output, 2, "all")


def test_the_pause_script_stops_a_job_that_ignores_sigint(tmp_path):
    """A job started from a background shell ignores SIGINT; the script gets it with SIGTERM after the grace."""
    name = f"stand_in_job_{os.getpid()}"  # its own names: the real runs on this machine are left alone
    fake = tmp_path / f"{name}.py"
    ready = tmp_path / "ready"
    fake.write_text("import pathlib, signal, sys, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "pathlib.Path(sys.argv[1]).touch()\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(fake), str(ready)], start_new_session=True)
    # Pause only once it ignores SIGINT: a SIGINT during the interpreter's start-up would end it (a slow CI machine).
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the stand-in job did not start in 60 s"
    env = {**os.environ, "CONFIRM_JOBS_PATTERN": name, "CONFIRM_LAUNCHER_PATTERN": f"{name}_launcher",
           "CONFIRM_DRIVER_PATTERN": f"{name}_driver"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "confirm_pause.sh"), "2"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert proc.wait(timeout=10) != 0
    assert "SIGINT to job group" in out.stdout and "SIGTERM to job group" in out.stdout
    assert "no protocol job is running" in out.stdout


def test_sync_keeps_finished_records_with_their_platform_logs_and_the_controls(tmp_path):
    src, dst = tmp_path / "run", tmp_path / "state"
    rec = json.loads((STATE / "runs" / "grpo__seed100.json").read_text())
    for folder, label, finished in ((src, "maxrl", True), (src, "qae", False),
                                    (src / "platform_control" / "abc", "grpo_platform", True)):
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        (folder / "runs" / f"{label}__seed100.json").write_text(json.dumps({**rec, "label": label,
                                                                            "finished": finished}))
        log = platform_rule.segments_path(folder, "confirm", label, 100)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text('{"event": "start", "platform_id": "abc"}\n')
    (src / "platforms" / "hosts").mkdir(parents=True)
    (src / "platforms" / "hosts" / "abc.json").write_text("{}")
    (src / "platform_control" / "abc" / "config.yaml").write_text("name: x\n")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "sync_confirmatory_state.sh"), str(src), str(dst)],
                         capture_output=True, text=True, check=True).stdout
    assert "control abc 1" in out and "maxrl 1" in out and "qae" not in out
    assert (dst / "platforms" / "confirm" / "maxrl__seed100.jsonl").is_file()
    assert not (dst / "runs" / "qae__seed100.json").exists() and not (dst / "platforms" / "confirm" /
                                                                      "qae__seed100.jsonl").exists()
    assert (dst / "platform_control" / "abc" / "platforms" / "confirm" / "grpo_platform__seed100.jsonl").is_file()
    assert (dst / "platform_control" / "abc" / "config.yaml").is_file() and (dst / "platforms" / "hosts" /
                                                                             "abc.json").is_file()


# ------------------------------------------------------------------------------------------------ at combine
OTHER = 0.4756019348083057  # another platform's step-0 entropy


def _platform_folder(tmp_path, control_shift=0.0, with_control=True, log_arm=True):
    """The committed records as the method arms found them, plus 18 method-arm records (`maxrl`) and, if asked, platform abc's control: GRPO's
    seeds 100-117 at 0/500/1000 with pass@n moved by `control_shift`."""
    out = tmp_path / "run"
    shutil.copytree(STATE, out, ignore=_method_arms)
    for sd in range(100, 118):
        grpo = json.loads((STATE / "runs" / f"grpo__seed{sd}.json").read_text())
        keep = [r for r in grpo["rows"] if r["step"] in (0, 500, 1000)]
        keep[0] = {**keep[0], "token_entropy": OTHER}
        arm = {**grpo, "label": "maxrl", "method": "maxrl", "rows": keep, "steps": [0, 500, 1000]}
        (out / "runs" / f"maxrl__seed{sd}.json").write_text(json.dumps(arm))
        if log_arm:
            log = platform_rule.segments_path(out, "confirm", "maxrl", sd)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text('{"event": "start", "platform_id": "abc", "resume_from_step": 0}\n')
        if with_control:
            folder = platform_rule.control_folder(out, "abc")
            rows = [dict(r, **({"pass@n": min(1.0, r["pass@n"] + control_shift)} if r["step"] else {})) for r in keep]
            (folder / "runs").mkdir(parents=True, exist_ok=True)
            (folder / "runs" / f"grpo_platform__seed{sd}.json").write_text(json.dumps(
                {**arm, "label": "grpo_platform", "method": "grpo", "rows": rows}))
            log = platform_rule.segments_path(folder, "confirm", "grpo_platform", sd)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text('{"event": "start", "platform_id": "abc", "resume_from_step": 0}\n')
    return out


def test_a_platform_with_method_arms_needs_its_control(tmp_path):
    out = _platform_folder(tmp_path, with_control=False)
    with pytest.raises(ValueError, match=r"platform abc: its control has no finished record for seeds \[100, "):
        platform_rule.check_platforms(protocol.load(CONFIG), out, _amendment())


def test_a_method_arm_record_without_a_platform_is_refused(tmp_path):
    out = _platform_folder(tmp_path, log_arm=False)
    with pytest.raises(ValueError, match="run confirm:maxrl:100 has no platform log"):
        platform_rule.check_platforms(protocol.load(CONFIG), out, _amendment())


def test_a_control_of_another_fingerprint_is_refused(tmp_path):
    out = _platform_folder(tmp_path)
    path = platform_rule.control_folder(out, "abc") / "runs" / "grpo_platform__seed100.json"
    rec = json.loads(path.read_text())
    rec["rows"][0]["token_entropy"] = 0.5
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=r"platform abc: its control's step-0 entropy \[0\.4756019348083057, 0\.5\]"):
        platform_rule.check_platforms(protocol.load(CONFIG), out, _amendment())


def test_a_reproducing_platform_needs_no_control_and_the_committed_records_are_the_reference(tmp_path):
    out = _platform_folder(tmp_path, with_control=False)
    for sd in range(100, 118):  # the arm's step 0 now carries the reference fingerprint
        p = out / "runs" / f"maxrl__seed{sd}.json"
        rec = json.loads(p.read_text())
        rec["rows"][0]["token_entropy"] = _amendment()["reference_platform"]["fingerprint"]["confirm"]
        p.write_text(json.dumps(rec))
    (out / "platforms" / "checks").mkdir(parents=True, exist_ok=True)
    (out / "platforms" / "checks" / "abc.json").write_text(json.dumps({"reproduces": True}))
    got = platform_rule.check_platforms(protocol.load(CONFIG), out, _amendment())
    assert got["platforms"]["reference"]["runs"] == 94 and got["platforms"]["reference"]["method_arm_runs"] == 0
    assert got["platforms"]["abc"] == {**got["platforms"]["abc"], "runs": 18, "method_arm_runs": 18,
                                       "same_as_reference": True, "control_needed": False}
    assert got["arms"]["maxrl"] == ["abc"] and got["arms"]["grpo"] == ["reference"]


@pytest.mark.parametrize("shift, primary", [(0.0, "passed"), (0.06, "failed"), (-0.06, "below")])
def test_the_control_is_read_both_ways_by_the_registered_test(tmp_path, shift, primary):
    """GRPO's own seeds as the control read against all 36: no effect; moved up 6 points, it beats GRPO; moved
    down, it lies below. The control is never part of a Holm family."""
    out = _platform_folder(tmp_path, control_shift=shift)
    reading = platform_rule.read_control(protocol.load(CONFIG), out, _amendment(), "abc")
    assert reading["primary"]["checkpoint"] == 1000 and reading["middle"]["checkpoint"] == 500
    assert reading["primary"]["status"] == primary and reading["primary"]["seeds"] == 18
    c = reading["primary"]
    assert c["ci"][0] < c["effect"] < c["ci"][1] and 0 <= c["p"] <= 1 and 0 <= c["p_below"] <= 1
    if shift == 0.0:
        assert abs(c["effect"]) < 0.02 and c["p"] > 0.05 and c["p_below"] > 0.05
    assert "p_holm" not in c


def _rule(status):
    control = {f: {"status": status, "checkpoint": c, "effect": 0.04, "ci": [0.01, 0.07], "p": 0.01,
                   "p_below": 0.99} for f, c in (("primary", 1000), ("middle", 500))}
    a = _amendment()
    return {"file": "f", "date": "2026-12-06", "arms": {"kl_cov_tuned": ["abc"], "pkpo_k4": ["abc"],
                                                        "maxrl": ["reference"]},
            "platforms": {"abc": {"runs": 36, "method_arm_runs": 36, "control_needed": True, "control": control,
                                  "same_as_reference": False, "description": None},
                          "reference": {"runs": 94, "method_arm_runs": 0, "control_needed": False,
                                        "same_as_reference": True}},
            "texts": {k: a[k] for k in ("not_interpretable_text", "masked_text", "not_checked_text")}}


def test_a_control_that_beats_grpo_voids_the_verdicts_of_its_platforms_arms_only():
    from exploration_trl.experiments.confirmatory import combine_v2
    from test_confirmatory_v2_combine import _first, _result

    section = combine_v2.combine([_result()], SHA, _first(), platforms={"countdown3_v2": _rule("failed")})
    text = combine_v2.summary_markdown(section)
    assert "**Platforms** (amendment 2 of 2026-12-06" in text
    for label in ("kl_cov_tuned", "pkpo_k4"):  # both won under Holm; made on abc, they are void
        row = next(line for line in text.splitlines() if re.search(rf"\| {label} +\|", line))
        assert "not interpretable: GRPO alone on this arm's platform beats GRPO's trajectory" in row
        assert "**beats GRPO**" not in row
    advice = combine_v2.advice_markdown(section)
    assert "Beat GRPO's own trajectory at the primary checkpoint: none." in advice
    assert "Not interpretable (GRPO alone on their platform" in advice and "`pkpo_k4`" in advice


def test_a_control_below_grpo_marks_only_the_verdicts_that_are_not_wins():
    from exploration_trl.experiments.confirmatory import combine_v2
    from test_confirmatory_v2_combine import _first, _result

    rule = _rule("below")
    rule["arms"]["maxrl"] = ["abc"]
    section = combine_v2.combine([_result()], SHA, _first(), platforms={"countdown3_v2": rule})
    tables = combine_v2.tables_markdown(section)
    rows = {label: [line for line in tables.splitlines() if re.search(rf"\| {label} +\|", line)]
            for label in ("pkpo_k4", "maxrl")}
    assert len(rows["pkpo_k4"]) == len(rows["maxrl"]) == 2
    assert all("may hide a win" not in r for r in rows["pkpo_k4"] if "(primary)" in r)  # a win stands
    assert any("a platform effect may hide a win" in r for r in rows["pkpo_k4"] if "(middle)" in r)
    assert all("a platform effect may hide a win" in r for r in rows["maxrl"])


# ------------------------------------------------------------------------------------------------------ pins
def test_what_prints_the_verdicts_is_the_registered_code_and_precedes_the_method_arm_records():
    from exploration_trl.experiments.confirmatory import pins

    held = pins.check(ROOT)
    assert {"exploration_trl/experiments/confirmatory/combine_v2.py", "configs/confirmatory/countdown3_v2_amendment2.yaml",
            "exploration_trl/experiments/confirmatory/analysis.py::verdict_of"} <= set(held)
    first = pins.first_method_arm_commit(ROOT, "confirmatory_state/countdown3_v2", {"grpo", "grpo_lr_half"})
    assert pins.check_order(ROOT, held, first)["first_method_arm_commit"] == first


def test_a_pinned_file_or_function_changed_after_its_commit_is_refused(tmp_path):
    from exploration_trl.experiments.confirmatory import pins

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "m.py").write_text("def verdict(p):\n    return p < 0.05\n\n\ndef table():\n    return 1\n")
    (tmp_path / "a.yaml").write_text("alpha: 0.05\n")
    git("add", ".")
    git("commit", "-q", "-m", "register")
    sha = git("rev-parse", "HEAD")
    pinned = {"m.py::verdict": sha, "a.yaml": sha}
    assert pins.check(tmp_path, pinned) == pinned
    (tmp_path / "m.py").write_text("def verdict(p):\n    return p < 0.05\n\n\ndef table():\n    return 2\n")
    pins.check(tmp_path, pinned)  # another function may change
    (tmp_path / "m.py").write_text("def verdict(p):\n    return p < 0.10\n\n\ndef table():\n    return 2\n")
    with pytest.raises(ValueError, match=rf"pin m.py::verdict: the working tree differs from commit {sha}"):
        pins.check(tmp_path, pinned)
    (tmp_path / "a.yaml").write_text("alpha: 0.1\n")
    with pytest.raises(ValueError, match="pin a.yaml: the working tree differs"):
        pins.check(tmp_path, {"a.yaml": sha})
    git("commit", "-qam", "after the results")
    later = git("rev-parse", "HEAD")
    with pytest.raises(ValueError, match="does not precede the first method-arm record's commit"):
        pins.check_order(tmp_path, {"a.yaml": later}, sha)


def test_prioritise_puts_the_launcher_in_a_heavy_cpu_group_or_says_why_not(tmp_path):
    group = tmp_path / "group"
    said = launcher.prioritise(group, shares=1000)
    assert said == f"jobs in cpu cgroup {group} (cpu.shares 1000)"
    assert (group / "cpu.shares").read_text() == "1000" and (group / "cgroup.procs").read_text() == str(os.getpid())
    assert launcher.prioritise(tmp_path / "missing" / "group").startswith("no cpu cgroup (No such file")
