"""The second protocol's amendment 1 and the combine step's integrity checks.

Amendment 1 (configs/confirmatory/countdown3_v2_amendment1.yaml) was committed before any statistic of the control's
records; it reads the control at raw alpha too, and a control that beats GRPO makes its family's verdicts "not
interpretable". The integrity checks run on a copy of the committed records, which are real runs of the protocol."""

from __future__ import annotations

import copy
import json
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
    done = len(list((folder / "runs").rglob("*.json")))
    with pytest.raises(integrity_v2.IntegrityError, match=rf"{292 - done} of 292 runs have no finished record"):
        integrity_v2.check_counts(cfg, folder, chosen)
    rec = json.loads((folder / "runs" / "grpo__seed100.json").read_text())
    rec["seed"] = 999
    (folder / "runs" / "grpo__seed999.json").write_text(json.dumps(rec))
    with pytest.raises(integrity_v2.IntegrityError, match="records outside the protocol: confirm:grpo:999"):
        integrity_v2.check_counts(cfg, folder, chosen)


def test_the_combine_command_checks_integrity_before_writing(folder, tmp_path):
    """A folder with runs still missing is refused with one line, and docs/confirmatory.json is not touched."""
    from exploration_trl.experiments.confirmatory import command

    (folder / "result.json").write_text(json.dumps({"name": "countdown3_v2", "protocol_version": 2}))
    write = tmp_path / "confirmatory.json"
    write.write_text("{}")
    with pytest.raises(integrity_v2.IntegrityError, match="runs have no finished record"):
        command.main(["--combine", str(folder), "--protocol-commit", "4e6b608", "--write", str(write), "--fill"])
    assert write.read_text() == "{}"


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


def test_the_readme_has_the_generated_advice_block():
    text = (ROOT / "README.md").read_text()
    assert text.count(combine_v2.ADVICE_START) == 1 and text.count(combine_v2.ADVICE_END) == 1
    block = text.split(combine_v2.ADVICE_START)[1].split(combine_v2.ADVICE_END)[0]
    assert block.strip() == combine_v2.advice_text(None).strip()


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
    for stale in ("5.16%", "0.78", "0.73"):
        assert stale not in page


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
    sentence = reread_v1.calibration_sentence(data)
    for path in (ROOT / "README.md", ROOT / "docs" / "confirmatory.md"):
        text = path.read_text()
        assert text.split(reread_v1.CALIBRATION_START)[1].split(reread_v1.CALIBRATION_END)[0].strip() == sentence
    rates = data["null_at_v1_design"]["rates"]
    assert rates["v1_test_700"]["simulations"] == 10000 and rates["v1_test_700"]["rate"] > 0.05
