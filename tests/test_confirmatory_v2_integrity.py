"""The second protocol's amendment 1 and the combine step's integrity checks.

Amendment 1 (configs/confirmatory/countdown3_v2_amendment1.yaml) was committed before any statistic of the control's
records; it reads the control at raw alpha too, and a control that beats GRPO makes its family's verdicts "not
interpretable". The integrity checks run on a copy of the committed records, which are real runs of the protocol."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exploration_trl.experiments.confirmatory import amendment, combine_v2, integrity_v2, protocol
from test_confirmatory_v2_combine import _first, _result

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "confirmatory_state" / "countdown3_v2"
SHA = "4e6b608d716e3ec2d6216661676883b841b8a2df"
AMENDMENT = ROOT / "configs" / "confirmatory" / "countdown3_v2_amendment1.yaml"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------------------------------- the amendment
def test_the_amendment_precedes_any_published_control_result():
    """The amendment's commit is an ancestor of the commit that first wrote `second_protocol` into
    docs/confirmatory.json, and not that commit; until then it precedes HEAD, and no json holds the section."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", str(AMENDMENT.relative_to(ROOT))).splitlines()
    assert added, "the amendment was never committed"
    amended = added[-1]
    assert subprocess.run(["git", "merge-base", "--is-ancestor", SHA, amended], cwd=ROOT).returncode == 0
    written = _git("log", "--format=%H", "-S", "second_protocol", "--", "docs/confirmatory.json").splitlines()
    if not written:
        assert "second_protocol" not in json.loads((ROOT / "docs" / "confirmatory.json").read_text())
        return
    first_write = written[-1]
    assert first_write != amended
    assert subprocess.run(["git", "merge-base", "--is-ancestor", amended, first_write], cwd=ROOT).returncode == 0


def test_the_amendment_only_adds_caution_and_leaves_the_registered_yaml_alone():
    a = amendment.load("countdown3_v2", ROOT)
    cfg = protocol.load(ROOT / "configs" / "confirmatory" / "countdown3_v2.yaml")
    control = next(s for s in cfg["settings"] if s.get("role") == "negative_control")
    assert a["control"]["label"] == control["label"] and a["control"]["raw_alpha"] == cfg["alpha"] == 0.05
    assert sorted(a["control"]["checkpoint_families"]) == sorted(control["checkpoints"])
    assert cfg["holm"] == "primary" and "a step-size change alone beats GRPO's trajectory" in a["not_interpretable_text"]


def _with_control(p, p_holm, effect=0.01, ci=(-0.02, 0.035)):
    r = _result(control_p_holm=p_holm)
    for t in r["tests"]:
        if t["label"] == "grpo_lr_half" and t["family"] == "primary":
            t.update(p=p, effect=effect, ci=None if effect is None else list(ci),
                     reason=None if effect is not None else "outside")
            if effect is None:
                t.update(p=None, p_holm=None)
    return r


def _section(result):
    return combine_v2.combine([result], SHA, _first(), None, {"countdown3_v2": amendment.load("countdown3_v2", ROOT)})


def test_a_control_significant_only_at_raw_alpha_makes_its_familys_verdicts_not_interpretable():
    """Holm's p 0.3 (not significant in the registered family), raw p 0.03: the primary family fails; the winning
    kl_cov arm (Holm p 0.004) is printed as not interpretable, never as beating GRPO; the middle family stands."""
    section = _section(_with_control(p=0.03, p_holm=0.3))
    control = section["setups"][0]["amendment"]["control"]
    assert control["primary"]["status"] == "failed" and control["middle"]["status"] == "passed"
    assert control["primary"]["ci_upper"] == pytest.approx(0.035)
    text = combine_v2.summary_markdown(section)
    assert "beats GRPO**" not in text and "**beats GRPO**" not in combine_v2.tables_markdown(section).split("middle")[0]
    row = next(line for line in text.splitlines() if "| kl_cov_tuned |" in line)
    assert "**not interpretable: a step-size change alone beats GRPO's trajectory**" in row
    assert text.index("**Negative control**") < text.index("| set-up")  # the control first
    assert "every primary verdict is not interpretable" in text and "95% CI upper end +3.5" in text
    tables = combine_v2.tables_markdown(section)
    middle = [line for line in tables.splitlines() if "(middle)" in line and "kl_cov_tuned" in line]
    assert middle and "not interpretable" not in middle[0]


def test_a_passing_control_reports_the_upper_end_of_its_ci_and_the_verdicts_stand():
    section = _section(_with_control(p=0.4, p_holm=0.9))
    text = combine_v2.summary_markdown(section)
    row = next(line for line in text.splitlines() if "| kl_cov_tuned |" in line)
    assert "**beats GRPO**" in row
    assert ("not significant, but its 95% CI reaches +3.5 points, so a step-size effect that large is not ruled out"
            in text)


def test_an_unreadable_control_leaves_every_verdict_marked_unchecked():
    section = _section(_with_control(p=None, p_holm=None, effect=None))
    assert section["setups"][0]["amendment"]["control"]["primary"]["status"] == "not checked"
    row = next(line for line in combine_v2.summary_markdown(section).splitlines() if "| kl_cov_tuned |" in line)
    assert "**beats GRPO** (the negative control could not be read" in row


# --------------------------------------------------------------------------------------- integrity checks
@pytest.fixture(scope="module")
def cfg():
    return protocol.load(ROOT / "configs" / "confirmatory" / "countdown3_v2.yaml")


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(STATE / "runs", out / "runs")
    shutil.copyfile(STATE / "selection.json", out / "selection.json")
    return out


def test_the_committed_selection_recomputes_and_a_changed_one_is_refused(cfg, folder):
    selection = json.loads((folder / "selection.json").read_text())
    integrity_v2.check_selection(cfg, folder, selection)
    assert {k: s["chosen"] for k, s in selection["settings"].items()} == {
        "progrpo_tuned": {"progrpo_alpha": 0.3}, "dsgrpo_tuned": {"ds_gamma_p": 0.01, "ds_gamma_n": 0.01},
        "casp_tuned": {"casp_alpha": 0.1}, "kl_cov_tuned": {"kl_cov_ratio": 0.02}}
    changed = copy.deepcopy(selection)
    changed["settings"]["casp_tuned"]["chosen"] = {"casp_alpha": 0.01}
    with pytest.raises(integrity_v2.IntegrityError, match=r"casp_tuned chose \{'casp_alpha': 0.01\} but the "
                                                          r"registered rule .* chooses \{'casp_alpha': 0.1\}"):
        integrity_v2.check_selection(cfg, folder, changed)


def test_every_committed_record_names_the_protocol_commit_and_one_source_hash(folder):
    assert integrity_v2.check_provenance(folder, SHA)["source_hash"].startswith("dbf26ebdaed2")
    path = folder / "runs" / "grpo__seed101.json"
    rec = json.loads(path.read_text())
    rec["provenance"]["source_hash"] = "0" * 64
    path.write_text(json.dumps(rec))
    with pytest.raises(integrity_v2.IntegrityError, match="records of more than one source hash"):
        integrity_v2.check_provenance(folder, SHA)
    rec["provenance"]["commit"] = "f" * 40
    path.write_text(json.dumps(rec))
    with pytest.raises(integrity_v2.IntegrityError, match=r"run confirm:grpo:101 names commit f{40}, not the protocol"):
        integrity_v2.check_provenance(folder, SHA)


def test_a_tuned_arm_must_run_the_selected_value(cfg, folder):
    chosen = {k: s["chosen"] for k, s in json.loads((folder / "selection.json").read_text())["settings"].items()}
    integrity_v2.check_settings(cfg, folder, chosen)
    rec = json.loads((folder / "runs" / "grpo__seed100.json").read_text())
    rec.update(label="progrpo_tuned", method="progrpo", overrides={"progrpo_alpha": 3.0})
    (folder / "runs" / "progrpo_tuned__seed100.json").write_text(json.dumps(rec))
    with pytest.raises(integrity_v2.IntegrityError, match=r"run progrpo_tuned:100 ran overrides \{'progrpo_alpha': "
                                                          r"3.0\} but the protocol and selection.json say "
                                                          r"\{'progrpo_alpha': 0.3\}"):
        integrity_v2.check_settings(cfg, folder, chosen)


def test_every_planned_run_needs_one_finished_record_and_no_other(cfg, folder):
    chosen = {k: s["chosen"] for k, s in json.loads((folder / "selection.json").read_text())["settings"].items()}
    assert len(list((folder / "runs").rglob("*.json"))) == 292  # the committed records are complete
    integrity_v2.check_counts(cfg, folder, chosen)
    (folder / "runs" / "maxrl__seed117.json").unlink()
    (folder / "runs" / "selection" / "grpo__seed30.json").unlink()
    with pytest.raises(integrity_v2.IntegrityError, match=r"2 of 292 runs have no finished record"):
        integrity_v2.check_counts(cfg, folder, chosen)
    shutil.copytree(STATE / "runs", folder / "runs", dirs_exist_ok=True)
    rec = json.loads((folder / "runs" / "grpo__seed100.json").read_text())
    rec["seed"] = 999
    (folder / "runs" / "grpo__seed999.json").write_text(json.dumps(rec))
    with pytest.raises(integrity_v2.IntegrityError, match="records outside the protocol: confirm:grpo:999"):
        integrity_v2.check_counts(cfg, folder, chosen)


def test_the_combine_command_checks_integrity_before_writing(folder, tmp_path):
    """A folder with runs still missing is refused with one line, and docs/confirmatory.json is not touched."""
    from exploration_trl.experiments.confirmatory import command

    (folder / "result.json").write_text(json.dumps({"name": "countdown3_v2", "protocol_version": 2}))
    (folder / "runs" / "qae__seed105.json").unlink()  # one run missing
    write = tmp_path / "confirmatory.json"
    write.write_text("{}")
    with pytest.raises(integrity_v2.IntegrityError, match="runs have no finished record"):
        command.main(["--combine", str(folder), "--protocol-commit", "4e6b608", "--write", str(write), "--fill"])
    assert write.read_text() == "{}"


# ------------------------------------------------------------------- the records themselves and result.json
def _small_cfg(cfg):
    """The protocol cut to the two arms the committed records complete (GRPO and the control), with bootstraps and
    nulls small enough for a test (they do not change the numbers `check_result` recomputes)."""
    small = copy.deepcopy(cfg)
    small["settings"] = [s for s in small["settings"] if s["label"] in ("grpo", "grpo_lr_half")]
    small["bootstrap"] = {**cfg["bootstrap"], "resamples": 200}
    small["secondary"] = {"seeds_and_multisets": {"resamples": 20, "seed": 1}}
    small["null"] = {"simulations": 4, "resamples": 50, "seed": 101, "splits": 2}
    return small


@pytest.fixture(scope="module")
def small(cfg, tmp_path_factory):
    """A complete run folder of `_small_cfg`: the committed GRPO and control runs, GRPO's selection runs, the warm
    start's json and the result.json that `analysis.analyse` computes from them."""
    from exploration_trl.experiments import _common
    from exploration_trl.experiments.confirmatory import analysis, runner

    small_cfg = _small_cfg(cfg)
    out = tmp_path_factory.mktemp("small") / "run"
    (out / "runs" / "selection").mkdir(parents=True)
    (out / "warm_start").mkdir()
    for path in (STATE / "runs").glob("grpo*__seed*.json"):
        shutil.copyfile(path, out / "runs" / path.name)
    for path in (STATE / "runs" / "selection").glob("grpo__seed*.json"):
        shutil.copyfile(path, out / "runs" / "selection" / path.name)
    shutil.copyfile(STATE / "selection.json", out / "selection.json")
    shutil.copyfile(STATE / "warm_start" / "warm_start.json", out / "warm_start" / "warm_start.json")
    ws = json.loads((out / "warm_start" / "warm_start.json").read_text())
    result = analysis.analyse(small_cfg, runner.collect(out), ws["num_parameters"],
                              {"n_problems": 500, "warm_start_checksum": ws["checksum"]},
                              selection_records=runner.collect(out, "selection"),
                              selection=json.loads((out / "selection.json").read_text()),
                              groups=[str(i % 87) for i in range(500)])
    _common.write_json(out / "result.json", result)
    return small_cfg, out


@pytest.fixture
def complete(small, tmp_path):
    small_cfg, src = small
    out = tmp_path / "run"
    shutil.copytree(src, out)
    return small_cfg, out


def _edit(path, change):
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def _refused(small_cfg, out, pattern):
    with pytest.raises(integrity_v2.IntegrityError, match=pattern) as e:
        integrity_v2.check(small_cfg, out, SHA)
    assert "\n" not in str(e.value)  # one line


def test_a_complete_folder_passes_and_the_check_names_its_records_digest(complete):
    small_cfg, out = complete
    info = integrity_v2.check(small_cfg, out, SHA)
    assert info["runs"] == 36 + 18 + 4 and info["source_hash"].startswith("dbf26ebdaed2")
    assert info["records_checked"] and info["result_recomputed"] and info["warm_start_checksum"].startswith("6df1cdd7")
    assert info["records_digest"] == integrity_v2.records_digest(out) and len(info["records_digest"]) == 64
    path = out / "runs" / "grpo__seed100.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))  # the same record, other bytes
    assert integrity_v2.records_digest(out) != info["records_digest"]


def test_every_committed_record_passes_the_record_checks(cfg):
    files = integrity_v2.check_files(STATE)
    assert len(files) == len(list((STATE / "runs").rglob("*__seed*.json")))
    integrity_v2.check_records(cfg, files)
    assert integrity_v2.check_warm_start(STATE, files).startswith("6df1cdd78c21")


def test_a_record_from_another_warm_start_is_refused(complete):
    small_cfg, out = complete
    _edit(out / "runs" / "grpo_lr_half__seed103.json", lambda r: r.update(warm_start_checksum="0" * 64))
    _refused(small_cfg, out, r"run confirm:grpo_lr_half:103 \(grpo_lr_half__seed103.json\) trained from warm start "
                             r"000000000000, not this folder's 6df1cdd78c21 .*run it again")


def test_a_folder_without_its_warm_start_json_is_refused(complete):
    small_cfg, out = complete
    (out / "warm_start" / "warm_start.json").unlink()
    _refused(small_cfg, out, r"warm_start/warm_start.json: missing; copy the warm start")


def test_a_record_missing_a_registered_steps_row_is_refused(complete):
    small_cfg, out = complete
    _edit(out / "runs" / "grpo__seed110.json", lambda r: r.update(rows=[x for x in r["rows"] if x["step"] != 700]))
    _refused(small_cfg, out, r"run confirm:grpo:110 \(grpo__seed110.json\) has evaluation rows at steps \[0, 100, 200, "
                             r"300, 400, 500, 1000, 1500, 2000, 2500\], but its planned steps are \[0, 100, 200, 300, "
                             r"400, 500, 700, 1000, 1500, 2000, 2500\]")


def test_a_record_without_correct_counts_is_refused_before_any_analysis(complete):
    """Without the check, records.counts_at would fail with a bare KeyError."""
    small_cfg, out = complete
    _edit(out / "runs" / "grpo_lr_half__seed100.json", lambda r: r.pop("correct_counts"))
    _refused(small_cfg, out, r"run confirm:grpo_lr_half:100 \(grpo_lr_half__seed100.json\) has no correct_counts "
                             r"\(the per-problem counts the analysis reads\); remove its record and run it again")


def test_correct_counts_missing_a_step_or_a_problem_are_refused(complete):
    small_cfg, out = complete
    path = out / "runs" / "selection" / "grpo__seed31.json"
    _edit(path, lambda r: r["correct_counts"].pop("2000"))
    _refused(small_cfg, out, r"run selection:grpo:31 \(grpo__seed31.json\)'s correct_counts at step 2000: missing, "
                             r"not one count for each of its 300 problems")
    shutil.copyfile(STATE / "runs" / "selection" / "grpo__seed31.json", path)
    _edit(path, lambda r: r["correct_counts"]["500"].pop())
    _refused(small_cfg, out, r"grpo__seed31.json\)'s correct_counts at step 500: 299 counts, not one count for each "
                             r"of its 300 problems")


@pytest.mark.parametrize("phase, name, field, value, want", [
    ("confirm", "grpo__seed105", "n_samples", 32, "64"),
    ("confirm", "grpo__seed105", "eval_seed", 1, "314159"),
    ("confirm", "grpo_lr_half__seed105", "benchmark", "countdown3_v2_selection", "'countdown3_v2_heldout'"),
    ("selection", "grpo__seed30", "benchmark", "countdown3_v2_heldout", "'countdown3_v2_selection'"),
    ("confirm", "grpo__seed105", "num_problems", 300, "500"),
    ("selection", "grpo__seed30", "num_problems", 500, "300"),
    ("confirm", "grpo__seed105", "phase", "selection", "'confirm'")])
def test_a_record_of_another_evaluation_or_split_is_refused(complete, phase, name, field, value, want):
    small_cfg, out = complete
    path = out / "runs" / ("selection" if phase == "selection" else "") / f"{name}.json"
    _edit(path, lambda r: r.update({field: value}))
    label, seed = name.split("__seed")
    _refused(small_cfg, out, rf"run {phase}:{label}:{seed} \({name}.json\) has {field} {value!r} but the protocol's "
                             rf"{phase} runs have {want}; remove its record and run it again")


def test_an_unfinished_record_is_refused_by_name(cfg, folder):
    """Named even where many runs are still missing (the count check lists only five of them)."""
    _edit(folder / "runs" / "grpo_lr_half__seed117.json", lambda r: r.update(finished=False))
    _refused(cfg, folder, r"run confirm:grpo_lr_half:117 \(grpo_lr_half__seed117.json\) has not finished "
                          r"\(finished: False, last step 2000\); resume it")


def test_two_files_of_one_run_are_refused(complete):
    small_cfg, out = complete
    shutil.copyfile(out / "runs" / "grpo__seed100.json", out / "runs" / "grpo__seed100 (copy).json")
    _refused(small_cfg, out, r"runs/grpo__seed100 \(copy\).json and runs/grpo__seed100.json both hold run "
                             r"confirm:grpo:100; keep the one the protocol's run wrote, remove the other")


def test_a_record_named_after_another_run_is_refused(complete):
    small_cfg, out = complete
    (out / "runs" / "grpo_lr_half__seed117.json").rename(out / "runs" / "grpo_lr_half__seed118.json")
    _refused(small_cfg, out, r"runs/grpo_lr_half__seed118.json holds run confirm:grpo_lr_half:117, but its name says "
                             r"grpo_lr_half:118")


@pytest.mark.parametrize("name, step, metric, pattern", [
    ("grpo_lr_half__seed105", 2000, "pass@n", r"grpo_lr_half at checkpoint 2000: effect 0\.\d+ but the checked "
                                              r"records give 0\.\d+"),
    ("grpo_lr_half__seed110", 1000, "pass@n", r"grpo_lr_half at checkpoint 1000: effect"),
    ("grpo__seed120", 1000, "pass@1", r"grpo_lr_half at checkpoint 2000: effect"),  # GRPO's curve moved
    ("grpo__seed120", 100, "pass@n", r"grpo's trajectory_mean at steps \[0, 100, .*\] is .* but the checked records "
                                     r"give"),
    ("grpo_lr_half__seed105", 0, "pass@1", r"grpo_lr_half's trajectory_mean at steps \[0, 500, 1000, 2000\]")])
def test_result_json_must_be_computed_from_the_checked_records(complete, name, step, metric, pattern):
    """One number of one record changed after result.json was written: the recomputed numbers differ."""
    small_cfg, out = complete

    def change(rec):
        row = next(r for r in rec["rows"] if r["step"] == step)
        row[metric] += 0.004

    _edit(out / "runs" / f"{name}.json", change)
    _refused(small_cfg, out, r"result.json: " + pattern + r".*; write the verdict again from these records")


def test_result_json_must_hold_the_records_provenance_warm_start_and_tests(complete):
    small_cfg, out = complete
    path = out / "result.json"
    original = json.loads(path.read_text())
    for change, pattern in [
            (lambda r: r["provenance"].update(runs=57), r"result.json: provenance .* is not the records'"),
            (lambda r: r["heldout"].update(warm_start_checksum="f" * 64),
             r"result.json: heldout.warm_start_checksum ffffffffffff is not the records' 6df1cdd78c21"),
            (lambda r: r["tests"].pop(0), r"result.json: its tests are not the protocol's \(differ at "
                                          r"grpo_lr_half@1000\)"),
            (lambda r: r["tests"][1].update(method_mean=[0.3, 0.9]),
             r"result.json: grpo_lr_half at checkpoint 2000: method_mean \[0.3, 0.9\] but the checked records give")]:
        result = copy.deepcopy(original)
        change(result)
        path.write_text(json.dumps(result))
        _refused(small_cfg, out, pattern)
    path.unlink()
    _refused(small_cfg, out, r"result.json: missing; write the verdict first")


# --------------------------------------------------------------------------- "Which method should I use?"
def _power():
    return {"countdown3_v2": {"curve": [{"effect": 0.03, "rate": 0.8365, "simulations": 2000},
                                        {"effect": 0.02, "rate": 0.42, "simulations": 1000}]}}


def test_the_advice_names_the_winners_with_their_scope_and_what_not_shown_is_worth():
    section = combine_v2.combine([_with_control(p=0.4, p_holm=0.9)], SHA, _first(), None,
                                 {"countdown3_v2": amendment.load("countdown3_v2", ROOT)}, _power())
    text = combine_v2.advice_markdown(section)
    assert text.startswith("**On countdown3_v2** (one task (countdown) and one model of 105,792 parameters; 18 seeds "
                           "per arm): The negative control did not beat GRPO (its effect's 95% CI reaches +3.5 points).")
    assert ("Beat GRPO's own trajectory at the primary checkpoint: `kl_cov_tuned` (kl_cov: kl_cov_ratio=0.02 (chosen "
            "on the selection split), +3.1 points), `pkpo_k4` (pkpo: pkpo_k=4, +5.0 points).") in text
    assert "No verdict (seeds outside GRPO's pass@1 range): `maxrl`." in text
    assert "0.84 at +3.0 points (2,000 simulations), 0.42 at +2.0 points (1,000 simulations)" in text
    assert "0.84 at +3.0 points" in combine_v2.summary_markdown(section)  # where the verdicts are


def test_the_advice_says_first_when_the_control_failed():
    section = combine_v2.combine([_with_control(p=0.01, p_holm=0.2)], SHA, _first(), None,
                                 {"countdown3_v2": amendment.load("countdown3_v2", ROOT)}, _power())
    text = combine_v2.advice_markdown(section)
    assert text.startswith("**countdown3_v2: the negative control beat GRPO** (a step-size change alone)")
    assert "kl_cov_tuned" not in text


def test_every_second_protocol_block_is_generated_from_the_published_json():
    """The advice (README) and the full tables (docs/confirmatory.md) are what combine_v2 renders from
    docs/confirmatory.json's `second_protocol` (the pending text while it has none): before and after publication, no
    table or advice that states a verdict is written by hand."""
    combined = json.loads((ROOT / "docs" / "confirmatory.json").read_text()).get("second_protocol")
    for path, start, end, render in (
            (ROOT / "README.md", combine_v2.ADVICE_START, combine_v2.ADVICE_END, combine_v2.advice_text),
            (ROOT / "docs" / "confirmatory.md", combine_v2.BLOCK_START, combine_v2.BLOCK_END, combine_v2.block_text)):
        text = path.read_text()
        assert text.count(start) == 1 and text.count(end) == 1, (path, start)
        block = text.split(start)[1].split(end)[0]
        assert block.strip() == render(combined).strip(), (path, start)


def test_the_docs_power_sentence_is_the_committed_curve():
    """docs/confirmatory.md quotes no power figure that no committed output holds: its block is generated from
    power_curve.json and the registered +3-point figure (pre_run_calibration.json)."""
    from exploration_trl.experiments.confirmatory import power_curve

    data = json.loads((STATE / "power_curve.json").read_text())
    pre = json.loads((STATE / "pre_run_calibration.json").read_text())["power"]
    assert sorted(r["effect"] for r in data["curve"]) == [0.015, 0.02, 0.025, 0.03]
    assert pre["rate"] == 0.8365 and pre["simulations"] == 2000
    page = (ROOT / "docs" / "confirmatory.md").read_text()
    block = page.split(power_curve.BLOCK_START)[1].split(power_curve.BLOCK_END)[0]
    assert block.strip() == power_curve.sentence(data, pre)
    assert "**0.84** [0.82, 0.85] at +3.0 points (2,000 simulations)" in block
    for stale in ("5.16%", "0.78", "0.73"):  # as a number of its own, not inside another (a p-value 0.7884)
        assert not re.search(rf"(?<![\d.]){re.escape(stale)}(?![\d])", page), stale


def test_the_post_hoc_reread_and_the_calibration_sentence_are_the_committed_json():
    from exploration_trl.experiments.confirmatory import reread_v1

    data = json.loads((ROOT / "docs" / "confirmatory_v1_reread.json").read_text())
    original = json.loads((ROOT / "confirmatory_state" / "countdown3" / "result.json").read_text())
    assert data["post_hoc"] is True and data["test"]["estimator"] == "mean_point" and data["test"]["spread"] == 1.1
    assert len(data["tests"]) == 12 and {t["label"] for t in data["tests"]} == {t["label"] for t in original["tests"]}
    page = (ROOT / "docs" / "confirmatory.md").read_text()
    block = page.split(reread_v1.BLOCK_START)[1].split(reread_v1.BLOCK_END)[0]
    assert block.strip() == reread_v1.markdown(data, original).strip()
    assert "post hoc" in page.split(reread_v1.BLOCK_START)[0].rsplit("###", 1)[1]
    sentence = reread_v1.sentence_from_files(ROOT)
    assert "countdown3 4.4%, countdown4 2.0%" in sentence and "5.9% [5.5, 6.4] at step 1,500" in sentence
    assert "the second protocol's test at step 1,500 on countdown3 (its whole interval)" in sentence
    # countdown4 at 0.7.0's design (reread_v1 --calibrate): its json, once committed, is in the sentence
    assert "on countdown4, 0.7.0's test 5.5% [5.1, 6.0] at step 400" in sentence
    assert "0.7.0's test at step 400 on countdown4 (its whole interval)" in sentence
    text = (ROOT / "docs" / "confirmatory.md").read_text()
    assert text.split(reread_v1.CALIBRATION_START)[1].split(reread_v1.CALIBRATION_END)[0].strip() == sentence
    rates = data["null_at_v1_design"]["rates"]
    assert rates["v1_test_700"]["simulations"] == 10000 and rates["v1_test_700"]["rate"] > 0.05
