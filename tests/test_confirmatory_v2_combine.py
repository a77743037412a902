"""The second protocol's verdicts in docs/confirmatory.json and the docs (`confirm --combine` of a
`protocol_version: 2` result): the control first, the tuned methods beside 0.7.0's verdicts, the nulls with their
Monte Carlo error, the first protocol's verdicts kept; and the pre-registration precedes every run of it."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from exploration_trl.experiments.confirmatory import combine_v2, protocol

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL_COMMIT = "4e6b608"
#: What the pre-registration commit fixed and HEAD still holds as it was: the protocol and its pre-run calibration.
PREREGISTERED = ("configs/confirmatory/countdown3_v2.yaml", "confirmatory_state/countdown3_v2/pre_run_calibration.json")
#: The code it registered, which the runs and the published analysis ran from its `git archive`. HEAD's code has
#: been folded since (one protocol.py and analysis.py for both protocols); tests/test_confirmatory_publish.py's slow
#: check shows it still writes the published result.json byte for byte from the records.
REGISTERED_CODE = tuple(f"exploration_trl/experiments/confirmatory/{m}.py" for m in (
    "protocol", "protocol_v2", "analysis_v2", "verdict", "calibration", "heldout", "runner", "provenance", "driver"))


def _test(label, checkpoint, family, effect, p, p_holm):
    return {"label": label, "checkpoint": checkpoint, "family": family, "effect": effect,
            "ci": None if effect is None else [effect - 0.02, effect + 0.02], "p": p, "p_holm": p_holm,
            "reason": None if effect is not None else "a seed's pass@1 is outside GRPO's pass@1 range",
            "seeds_and_multisets": {"effect": effect, "p": 0.2 if p is None else p, "ci": [0, 0]}}


def _result(control_p_holm=0.8):
    arms = [("grpo_lr_half", "negative_control", "grpo", {"learning_rate": 5e-5}, 2000),
            ("kl_cov_tuned", "tuned", "kl_cov", {"kl_cov_ratio": 0.02}, 1000),
            ("maxrl", "new", "maxrl", {}, 1000),
            ("pkpo_k4", "replication", "pkpo", {"pkpo_k": 4}, 1000)]
    settings = [{"label": "grpo", "method": "grpo", "seeds": list(range(100, 136))}]
    tests = []
    for label, role, method, overrides, primary in arms:
        settings.append({"label": label, "role": role, "method": method, "overrides": overrides,
                         "seeds": list(range(100, 118)), "checkpoint": primary})
        tests.append(_test(label, primary // 2, "middle", 0.01, 0.3, 0.9))
    tests.append(_test("grpo_lr_half", 2000, "primary", -0.01, 0.6, control_p_holm))
    tests.append(_test("kl_cov_tuned", 1000, "primary", 0.031, 0.001, 0.004))
    tests.append(_test("maxrl", 1000, "primary", None, None, None))
    tests.append(_test("pkpo_k4", 1000, "primary", 0.05, 0.0, 0.0))
    # the order the analysis wrote them in is not the tables' order: the replication comes first here
    settings = [settings[0], settings[4], settings[3], settings[2], settings[1]]
    return {"name": "countdown3_v2", "protocol_version": 2, "task": "countdown", "model_params": 105792,
            "heldout": {"n_problems": 500, "disjoint_from_training": True},
            "provenance": {"version": "0.8.0", "commit": "4e6b608d716e3ec2d6216661676883b841b8a2df",
                           "source_hash": "dbf26ebdaed2b44d", "origin": "git archive", "runs": 292},
            "selection": {"checkpoint": 1000, "grpo_seeds": [30, 31, 32, 33], "seeds": [30, 31, 32],
                          "split": {"n_problems": 300},
                          "settings": {"kl_cov_tuned": {"chosen_label": "ratio=0.02", "reason": "largest effect",
                                                        "grid": [{"label": "ratio=0.002", "effect": 0.001},
                                                                 {"label": "ratio=0.02", "effect": 0.012},
                                                                 {"label": "ratio=0.2", "effect": None}]}}},
            "per_problem_records": "confirmatory_state/countdown3_v2/runs/*.json",
            "null_false_positive_rate": 0.0412, "null_false_positive_mc_se": 0.002,
            "null_false_positive_ci95": [0.0375, 0.0452],
            "empirical_null": {"1000": {"share_p_below_0.05": 0.031, "tested": 10000, "sampled": True}},
            "bootstrap": {"resamples": 10000}, "alpha": 0.05, "settings": settings, "tests": tests}


def _first():
    return json.loads((ROOT / "docs" / "confirmatory.json").read_text())


def test_tuned_and_replicated_arms_carry_0_7_0s_verdict():
    section = combine_v2.combine([_result()], "4e6b608d716e3ec2d6216661676883b841b8a2df", _first())
    earlier = section["setups"][0]["earlier"]
    assert earlier["setup"] == "countdown3"
    assert earlier["arms"]["kl_cov_tuned"]["label"] == "kl_cov_published"  # the published setting, by method
    assert earlier["arms"]["kl_cov_tuned"]["verdict"] == "not shown to beat GRPO"
    assert earlier["arms"]["pkpo_k4"]["label"] == "pkpo_k4" and earlier["arms"]["pkpo_k4"]["verdict"] == "beats GRPO"
    assert "maxrl" not in earlier["arms"] and "grpo_lr_half" not in earlier["arms"]  # new in 0.8.0: nothing earlier


def test_the_summary_puts_the_control_first_and_states_the_nulls():
    section = combine_v2.combine([_result()], "4e6b608d716e3ec2d6216661676883b841b8a2df", _first())
    text = combine_v2.summary_markdown(section)
    rows = [line for line in text.splitlines() if line.startswith("| countdown3_v2")]
    assert [r.split("|")[3].strip() for r in rows] == ["grpo_lr_half", "kl_cov_tuned", "maxrl", "pkpo_k4"]
    assert "| kl_cov_published (step 1500): -0.28, not shown to beat GRPO" in rows[1]
    assert "1000: +3.10 [+1.1, +5.1]" in rows[1] and "**beats GRPO**" in rows[1]
    assert "no verdict (a seed's pass@1 is outside GRPO's pass@1 range)" in rows[2]
    assert "< 0.0003" in rows[3]  # a bootstrap p of 0: Holm's below m/R, m = 3 primary tests with a p
    assert "simulated 4.1% (Monte Carlo SE 0.20 points, 95% CI 3.8%-4.5%" in text
    assert "empirical, directed splits of GRPO's seeds: step 1000: 3.1% of 10000 splits (sampled)" in text
    assert "Pre-registered in commit 4e6b608" in text


def test_a_control_that_beats_grpo_is_said_to_void_the_test():
    section = combine_v2.combine([_result(control_p_holm=0.01)], "4e6b608", _first())
    assert "the control beat GRPO, so this set-up's test is not to be trusted" in combine_v2.summary_markdown(section)


def test_the_full_tables_give_selection_provenance_and_the_secondary_analysis():
    section = combine_v2.combine([_result()], "4e6b608", _first())
    text = combine_v2.tables_markdown(section)
    assert "exploration-trl 0.8.0 at commit 4e6b608 (git archive, source hash dbf26ebdaed2), 292 runs" in text
    assert "kl_cov_tuned: ratio=0.02 (largest effect; ratio=0.002: +0.10, ratio=0.02: +1.20, ratio=0.2: -)" in text
    assert "| kl_cov: kl_cov_ratio=0.02 (chosen on the selection split) |" in text
    assert "| +3.10, p 0.001 " in text  # seeds and multisets


def test_combine_keeps_the_first_protocol_and_fills_both_pages(tmp_path, monkeypatch):
    from exploration_trl.experiments.confirmatory import integrity_v2, publish

    checked = []  # the integrity checks themselves: tests/test_confirmatory_v2_integrity.py
    monkeypatch.setattr(integrity_v2, "check", lambda cfg, folder, sha: checked.append((cfg["name"], folder)) or {
        "runs": 292})
    from exploration_trl.experiments.confirmatory import platform_rule  # its checks: test_confirmatory_v2_platform.py

    monkeypatch.setattr(platform_rule, "section", lambda cfg, folder, rule, file: {
        "file": file, "date": str(rule["date"]), "arms": {}, "texts": {},
        "platforms": {"reference": {"runs": 94, "method_arm_runs": 0, "control_needed": False}}})

    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text(json.dumps(_result()))
    write = tmp_path / "confirmatory.json"
    write.write_text(json.dumps(_first()))
    readme, page = tmp_path / "README.md", tmp_path / "page.md"
    readme.write_text(f"top\n{combine_v2.SUMMARY_START}\n{combine_v2.PENDING}{combine_v2.SUMMARY_END}\nend\n")
    page.write_text(f"# Page\n{combine_v2.BLOCK_START}\n{combine_v2.PENDING}{combine_v2.BLOCK_END}\nend\n")
    args = argparse.Namespace(combine=[str(out)], protocol_commit=["HEAD"], write=str(write),
                              fill=[str(readme), str(page)])
    assert publish.combine(args) == 0
    combined = json.loads(write.read_text())
    assert combined["setups"] == _first()["setups"]  # the first protocol's verdicts, untouched
    assert combined["second_protocol"]["setups"][0]["name"] == "countdown3_v2"
    assert "| countdown3_v2 | negative control | grpo_lr_half |" in readme.read_text()
    assert "292 runs" in page.read_text() and page.read_text().endswith("end\n")
    integrity = combined["second_protocol"]["setups"][0]["integrity"]
    assert checked == [("countdown3_v2", out)] and integrity["runs"] == 292
    assert integrity["pins"]["pins"]["exploration_trl/experiments/confirmatory/combine_v2.py"]
    assert combined["second_protocol"]["setups"][0]["platform_rule"]["date"] == "2026-12-06"
    assert "**Platforms** (amendment 2 of 2026-12-06" in readme.read_text()
    assert combined["second_protocol"]["setups"][0]["amendment"]["date"] == "2026-11-28"
    assert "**Negative control** (`grpo_lr_half`, read as amendment 1 of 2026-11-28" in readme.read_text()


def test_the_readme_and_the_page_have_the_second_protocols_blocks():
    for path, start in ((ROOT / "README.md", combine_v2.ADVICE_START),
                        (ROOT / "docs" / "confirmatory.md", combine_v2.BLOCK_START)):
        assert path.read_text().count(start) == 1, path


# --------------------------------------------------------------------------------------- pre-registration
def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_protocol_commit_precedes_every_run_and_nothing_it_fixed_changed():
    """The runs come from a `git archive` of the protocol commit: it is in this history with the code it registered,
    the protocol and its calibration are unchanged since, and every finished record names it (a record from other
    code would be refused)."""
    full = _git("rev-parse", "--verify", f"{PROTOCOL_COMMIT}^{{commit}}")
    assert full.returncode == 0, "the protocol commit is not in this clone's history (clone without --depth)"
    sha = full.stdout.strip()
    assert _git("merge-base", "--is-ancestor", sha, "HEAD").returncode == 0
    changed = _git("diff", "--name-only", sha, "HEAD", "--", *PREREGISTERED).stdout.split()
    assert changed == [], f"pre-registered files changed since {PROTOCOL_COMMIT}: {changed}"
    listed = _git("ls-tree", "--name-only", sha, "--", *REGISTERED_CODE).stdout.split()
    assert sorted(listed) == sorted(REGISTERED_CODE)
    records = sorted((ROOT / "confirmatory_state" / "countdown3_v2" / "runs").rglob("*.json"))
    assert records, "no finished record of the second protocol is kept yet"
    for path in records:
        prov = json.loads(path.read_text())["provenance"]
        assert (prov["commit"], prov["origin"], prov["version"]) == (sha, "git archive", "0.8.0"), path.name
    cfg = protocol.load(ROOT / PREREGISTERED[0])
    assert cfg["protocol_version"] == 2 and cfg["bootstrap"]["estimator"] == "mean_point"


def test_the_combine_command_refuses_an_unknown_commit():
    from exploration_trl.experiments.confirmatory import publish

    with pytest.raises(ValueError, match="--protocol-commit 0000000: not a commit of this repository"):
        publish.resolve_commit("0000000")


def test_the_hand_written_verdict_sentences_quote_the_published_numbers():
    """README's bullet, docs/confirmatory.md's reading of the verdict and the CHANGELOG quote the control's and each
    arm's primary effect by hand: every quoted effect is docs/confirmatory.json's, to two decimals."""
    setup = json.loads((ROOT / "docs" / "confirmatory.json").read_text())["second_protocol"]["setups"][0]
    effect = {t["label"]: f"{100 * t['effect']:+.2f}" for t in setup["tests"] if t["family"] == "primary"}
    control = next(t for t in setup["tests"] if t["label"] == "grpo_lr_half" and t["family"] == "primary")
    ci = f"[{100 * control['ci'][0]:+.1f}, {100 * control['ci'][1]:+.1f}]"
    readme = (ROOT / "README.md").read_text()
    assert f"{effect['grpo_lr_half'][1:]} points {ci}" in readme
    page = (ROOT / "docs" / "confirmatory.md").read_text().split("### What the second protocol's verdict means")[1]
    changelog = (ROOT / "CHANGELOG.md").read_text().split("## 0.9.0")[1].split("\n## ")[0]
    for label in ("maxrl", "pkpo_k4", "passk_k4", "wreinforce", "qae", "outcome_explore", "kl_cov_tuned",
                  "progrpo_tuned", "grpo_lr_half"):
        assert effect[label] in page.replace("−", "-"), label
        assert effect[label] in changelog.replace("−", "-"), label
