"""Model cards print their method's verdict from the second protocol (issue 63, section 5): the packaged
`exploration_trl/data/second_protocol_verdicts.json` (`experiments/confirmatory/card_verdicts.py`, written by
`confirm --combine`) and the card's "Does it beat GRPO?" section (`hub/protocol_verdict.py`). Amendment 1 promised
that cards print "not interpretable" where the negative control beat GRPO; amendment 2's platform caveats likewise.
The published sections here are synthetic (`_result()` of tests/test_confirmatory_v2_combine.py)."""

from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
from pathlib import Path

import pytest

from exploration_trl.experiments.confirmatory import amendment, card_verdicts, combine_v2, platform_rule
from exploration_trl.hub import protocol_verdict

ROOT = Path(__file__).resolve().parents[1]
SHA = "4e6b608d716e3ec2d6216661676883b841b8a2df"
AMENDMENT1 = "not interpretable: a step-size change alone beats GRPO's trajectory"
AMENDMENT2 = "not interpretable: GRPO alone on this arm's platform beats GRPO's trajectory"


def _published(result=None, amendments=None, platforms=None):
    from test_confirmatory_v2_combine import _first, _result

    return combine_v2.combine([result or _result()], SHA, _first(), None, amendments, None, platforms)


def _with_control(p, p_holm):
    """`_result()` with the control's primary test read at raw p `p` (tests/test_confirmatory_v2_integrity.py)."""
    from test_confirmatory_v2_combine import _result

    r = _result(control_p_holm=p_holm)
    for t in r["tests"]:
        if t["label"] == "grpo_lr_half" and t["family"] == "primary":
            t.update(p=p, effect=0.01, ci=[-0.02, 0.035])
    return r


def _rule(status):
    """Amendment 2's section: kl_cov_tuned and pkpo_k4 made on platform `abc`, whose control reads `status`."""
    control = {f: {"status": status, "checkpoint": c, "effect": 0.04, "ci": [0.01, 0.07], "p": 0.01,
                   "p_below": 0.99} for f, c in (("primary", 1000), ("middle", 500))}
    a = platform_rule.load("countdown3_v2", ROOT)
    return {"file": "f", "date": "2026-12-06", "arms": {"kl_cov_tuned": ["abc"], "pkpo_k4": ["abc"],
                                                        "maxrl": ["reference"]},
            "platforms": {"abc": {"runs": 36, "method_arm_runs": 36, "control_needed": True, "control": control,
                                  "same_as_reference": False, "description": None},
                          "reference": {"runs": 94, "method_arm_runs": 0, "control_needed": False,
                                        "same_as_reference": True}},
            "texts": {k: a[k] for k in ("not_interpretable_text", "masked_text", "not_checked_text")}}


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """Point the hub at a temporary packaged file; `packaged(section)` writes `from_combined(section)` there (None:
    before publication, no file)."""
    path = tmp_path / protocol_verdict.FILE
    monkeypatch.setattr(protocol_verdict, "verdicts_file", lambda: path)

    def put(section):
        if section is None:
            path.unlink(missing_ok=True)
        else:
            card_verdicts.write(section, path)
        return path

    return put


# ------------------------------------------------------------------------------------- the packaged file
def test_each_arm_carries_exactly_the_verdict_the_tables_print():
    for section in (_published(), _published(amendments={"countdown3_v2": amendment.load("countdown3_v2", ROOT)}),
                    _published(_with_control(0.03, 0.3), {"countdown3_v2": amendment.load("countdown3_v2", ROOT)}),
                    _published(platforms={"countdown3_v2": _rule("failed")})):
        setup = section["setups"][0]
        out = card_verdicts.from_combined(section)
        arms = out["setups"][0]["arms"]
        assert [a["label"] for a in arms] == ["kl_cov_tuned", "maxrl", "pkpo_k4"]  # no GRPO, no negative control
        for a in arms:
            arm = next(s for s in setup["settings"] if s["label"] == a["label"])
            test = next(t for t in setup["tests"] if t["label"] == a["label"] and t["family"] == "primary")
            assert a["verdict"] == combine_v2._verdict(setup, arm, test)
            assert (a["checkpoint"], a["effect"], a["ci"], a["p_holm"]) == (
                test["checkpoint"], test["effect"], test["ci"], test["p_holm"])
        assert out["protocol_commit"] == SHA
        assert {k: out["setups"][0][k] for k in ("name", "task", "model_params")} == {
            "name": "countdown3_v2", "task": "countdown", "model_params": 105792}
        assert out["setups"][0]["baseline"]["seeds"] == 36 and {a["seeds"] for a in arms} == {18}
    kl = arms[0]
    assert kl["setting"] == "kl_cov: kl_cov_ratio=0.02 (chosen on the selection split)"
    assert (kl["effect_text"], kl["p_holm_text"]) == ("+3.10 [+1.1, +5.1]", "0.0040")


def test_the_packaged_file_is_the_published_json_or_absent():
    """It can never drift from docs/confirmatory.json: it is `from_combined` of its `second_protocol`, and it does
    not exist while that key does not."""
    published = json.loads((ROOT / "docs" / "confirmatory.json").read_text()).get("second_protocol")
    path = ROOT / card_verdicts.PACKAGE_PATH
    if published is None:
        assert not path.exists(), f"{path} exists but docs/confirmatory.json has no second_protocol"
    else:
        assert path.is_file(), f"{path} is missing: `exploration-trl confirm --combine` writes it"
        assert json.loads(path.read_text()) == json.loads(json.dumps(card_verdicts.from_combined(published)))


def test_the_packaged_file_ships_in_the_wheel():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    data = dict(cfg["options.package_data"])
    package, name = card_verdicts.PACKAGE_PATH.parent.as_posix().replace("/", "."), card_verdicts.PACKAGE_PATH.name
    assert any(fnmatch.fnmatch(name, pattern) for pattern in data.get(package, "").split()), data


def test_only_a_checkouts_published_json_gets_the_packaged_file(tmp_path):
    assert card_verdicts.package_path(ROOT / "docs" / "confirmatory.json") == ROOT / card_verdicts.PACKAGE_PATH
    assert card_verdicts.package_path(tmp_path / "confirmatory.json") is None
    (tmp_path / "docs").mkdir()
    assert card_verdicts.package_path(tmp_path / "docs" / "confirmatory.json") is None  # no package beside it
    (tmp_path / "exploration_trl").mkdir()
    assert card_verdicts.package_path(tmp_path / "docs" / "confirmatory.json") == tmp_path / card_verdicts.PACKAGE_PATH


def test_the_combine_step_writes_the_packaged_file_beside_the_json(tmp_path, monkeypatch, capsys):
    from test_confirmatory_v2_combine import _first, _result

    from exploration_trl.experiments.confirmatory import integrity_v2, publish

    monkeypatch.setattr(integrity_v2, "check", lambda cfg, folder, sha: {"runs": 292})
    monkeypatch.setattr(platform_rule, "section", lambda cfg, folder, rule, file: {
        "file": file, "date": str(rule["date"]), "arms": {}, "texts": {},
        "platforms": {"reference": {"runs": 94, "method_arm_runs": 0, "control_needed": False}}})
    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text(json.dumps(_result()))
    checkout = tmp_path / "checkout"
    (checkout / "docs").mkdir(parents=True)
    (checkout / "exploration_trl").mkdir()
    write = checkout / "docs" / "confirmatory.json"
    write.write_text(json.dumps(_first()))
    args = argparse.Namespace(combine=[str(out)], protocol_commit=["HEAD"], write=str(write), fill=[])
    assert publish.combine(args) == 0
    packaged = checkout / card_verdicts.PACKAGE_PATH
    assert f"wrote {packaged} (the verdicts model cards print)" in capsys.readouterr().out
    combined = json.loads(write.read_text())["second_protocol"]
    assert json.loads(packaged.read_text()) == json.loads(json.dumps(card_verdicts.from_combined(combined)))


# ----------------------------------------------------------------------------------------- the section
def test_a_published_verdict_is_printed_verbatim_with_its_scope(packaged):
    packaged(_published())
    text = protocol_verdict.verdict_section("kl_cov")
    assert "arm `kl_cov_tuned` (kl_cov: kl_cov_ratio=0.02 (chosen on the selection split)) on `countdown3_v2`, at " \
           "step 1000: **beats GRPO**." in text
    assert "+3.10 [+1.1, +5.1]; Holm-adjusted p: 0.0040" in text
    assert "one model of 105,792 parameters, 18 seeds per arm (36 for GRPO)" in text
    assert "on your task it is untested" in text and "commit 4e6b608" in text and "docs/confirmatory.md" in text
    maxrl = protocol_verdict.verdict_section("maxrl")
    assert "arm `maxrl` (default settings)" in maxrl and "no verdict (a seed's pass@1 is outside GRPO's" in maxrl
    assert "baseline" in protocol_verdict.verdict_section("grpo")
    clip = protocol_verdict.verdict_section("clip_cov")
    assert "not an arm" in clip and "will not have one" in clip and "beats GRPO" not in clip


def test_not_shown_comes_with_the_power_of_the_test(packaged):
    from test_confirmatory_v2_combine import _result

    result = _result()
    next(t for t in result["tests"] if t["label"] == "kl_cov_tuned" and t["family"] == "primary")["p_holm"] = 0.2
    section = _published(result)
    section["setups"][0]["power"] = {"curve": [{"effect": 0.03, "rate": 0.84, "simulations": 2000}]}
    packaged(section)
    text = protocol_verdict.verdict_section("kl_cov")
    assert "at step 1000: not shown to beat GRPO." in text
    assert combine_v2.power_sentence(section["setups"][0]).strip() in text and "0.84 at +3.0 points" in text
    assert "Power of this test" not in protocol_verdict.verdict_section("pkpo")  # a win needs no power caveat


def test_a_failed_negative_control_makes_the_card_say_not_interpretable(packaged):
    """Amendment 1: the control beat GRPO at raw alpha, so kl_cov's win (Holm p 0.004) is not interpretable."""
    packaged(_published(_with_control(0.03, 0.3), {"countdown3_v2": amendment.load("countdown3_v2", ROOT)}))
    for method in ("kl_cov", "pkpo"):
        text = protocol_verdict.verdict_section(method)
        assert f"**{AMENDMENT1}**" in text
        assert "**beats GRPO**" not in text


def test_a_failed_platform_control_makes_the_card_say_not_interpretable(packaged):
    """Amendment 2: kl_cov_tuned and pkpo_k4 were made on a platform whose control beat GRPO; maxrl was not."""
    packaged(_published(platforms={"countdown3_v2": _rule("failed")}))
    for method in ("kl_cov", "pkpo"):
        text = protocol_verdict.verdict_section(method)
        assert f"**{AMENDMENT2}**" in text and "**beats GRPO**" not in text
    assert "not interpretable" not in protocol_verdict.verdict_section("maxrl")


def test_before_publication_the_card_says_no_verdict_yet(packaged):
    packaged(None)
    assert protocol_verdict.load_verdicts() is None
    for method in ("maxrl", "clip_cov", "progrpo+casp"):  # the card names no arm list: the page does
        text = protocol_verdict.verdict_section(method)
        assert text == protocol_verdict.PENDING
    text = protocol_verdict.PENDING
    assert "no published verdict yet" in text and "runs are under way" in text and "docs/confirmatory.md" in text
    assert "beats GRPO" not in text


def test_a_composition_gets_its_components_verdicts_and_is_said_untested(packaged):
    packaged(_published())
    text = protocol_verdict.verdict_section("maxrl+kl_cov")
    assert text.startswith("`maxrl+kl_cov` was not an arm") and "The composition itself was not tested." in text
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(lines) == 2
    assert lines[0].startswith("- `maxrl`: arm `maxrl`") and "no verdict (a seed's pass@1" in lines[0]
    assert lines[1].startswith("- `kl_cov`: arm `kl_cov_tuned`") and "**beats GRPO**" in lines[1]
    assert "on your task it is untested" in text
    still = protocol_verdict.verdict_section("kl_cov", still=True)
    assert "`kl_cov` with the STILL shapings was not an arm" in still and "will not have one. The verdict of " \
        "`kl_cov` alone, without the STILL shapings:" in still
    none = protocol_verdict.verdict_section("clip_cov+unlikely")
    assert "not an arm" in none and "- " not in none


def test_the_card_has_the_section(packaged, tmp_path):
    import exploration_trl.trainers  # noqa: F401  (registers the methods)
    from exploration_trl.hub import render_model_card

    packaged(_published(_with_control(0.03, 0.3), {"countdown3_v2": amendment.load("countdown3_v2", ROOT)}))
    out = tmp_path / "model"
    out.mkdir()
    text = render_model_card(out, method="kl_cov", base_model="Qwen/Qwen2.5-0.5B-Instruct").text
    section = text.split("## Does it beat GRPO?\n", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Method") < text.index("## Does it beat GRPO?") < text.index("## Evaluation")
    assert f"**{AMENDMENT1}**" in section and "**beats GRPO**" not in section
    assert "one model of 105,792 parameters" in section
    packaged(None)
    pending = render_model_card(out, method="kl_cov", base_model="Qwen/Qwen2.5-0.5B-Instruct").text
    assert f"## Does it beat GRPO?\n\n{protocol_verdict.PENDING}" in pending
