"""The confirmatory report: `docs/confirmatory.json`'s fields, the verdict tables on synthetic runs with known
answers, the README/docs blocks (pending until the json exists, then its tables), and `confirm --combine`'s
refusals (no result, a protocol commit that does not precede HEAD)."""

import functools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import run_error

from exploration_trl.experiments.confirmatory import analysis, combine_v1, verdict
from exploration_trl.experiments.confirmatory.records import points_at

ROOT = Path(__file__).resolve().parent.parent
X = np.array([0.2, 0.25, 0.3, 0.35, 0.4])  # GRPO's pass@1 at steps 0..4; pass@n = 1.1 - pass@1
NOISE = np.array([-0.004, -0.002, 0.0, 0.002, 0.004])


def needs_history():
    """The pre-registration checks read git history; a shallow clone (no 9357c88) cannot answer them."""
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("needs the repository's full git history (a shallow or missing clone)")


def _rows(points, distinct=3.0):
    return [{"step": s, "pass@1": float(a), "pass@n": float(b), "distinct_correct": distinct,
             "distinct_correct_canonical": distinct / 2, "token_entropy": 0.5} for s, (a, b) in points]


def synthetic_result(monkeypatch):
    return synthetic_runs(monkeypatch)[0]


def synthetic_runs(monkeypatch):
    """A set-up with GRPO (5 seeds on a straight trajectory), a method 10 points above it, one on it, and one whose
    seeds' pass@1 lies beyond GRPO's range; judged at step 2."""
    monkeypatch.setattr(verdict, "null_false_positive_rate",
                        functools.partial(verdict.null_false_positive_rate, simulations=20, resamples=100))
    seeds = [10, 11, 12, 13, 14]
    records = {("grpo", sd): {"rows": _rows([(s, (x + d, 1.1 - x - d)) for s, x in enumerate(X)])}
               for sd, d in zip(seeds, NOISE)}
    for label, x, shift in (("above", 0.3, 0.10), ("on", 0.3, 0.0), ("beyond", 0.6, 0.0)):
        for sd, d in zip(seeds, NOISE):
            records[(label, sd)] = {"rows": _rows([(0, (0.2, 0.9)), (2, (x + d, 1.1 - x + shift + d))], 3.0 + sd % 2)}
    cfg = {"name": "synthetic", "task": "countdown", "baseline": "grpo", "checkpoints": [2],
           "bootstrap": {"resamples": 500, "seed": 1, "correction": "inflate_t"},
           "settings": [{"label": "grpo", "method": "grpo", "seeds": seeds, "steps": [0, 1, 2, 3, 4]},
                        *({"label": lb, "method": "pkpo", "seeds": seeds, "steps": [0, 2]}
                          for lb in ("above", "on", "beyond"))]}
    return analysis.analyse(cfg, records, 1234, {"n_problems": 500, "disjoint_from_training": True}), records


def test_combined_json_has_the_issue_fields_and_one_heldout_size(monkeypatch):
    one = synthetic_result(monkeypatch)
    two = {**one, "name": "bigger", "heldout": {"n_problems": 600, "disjoint_from_training": True}}
    combined = combine_v1.combine([one, two], "a" * 40)
    assert combined["protocol_commit"] == "a" * 40
    assert combined["heldout"] == {"n_problems": 500, "per_setup": {"synthetic": 500, "bigger": 600},
                                   "disjoint_from_training": True}
    for setup in combined["setups"]:
        assert {"name", "model_params", "task", "null_false_positive_rate", "settings"} <= set(setup)
        assert 0.0 <= setup["null_false_positive_rate"] <= 1.0
        for s in setup["settings"]:
            assert {"label", "method", "seeds"} <= set(s)
            if s["method"] != "grpo":
                assert {"effect", "ci", "p", "p_holm"} <= set(s)


def test_verdict_table_on_known_answers(monkeypatch):
    result, records = synthetic_runs(monkeypatch)
    text = combine_v1.verdict_markdown(combine_v1.combine([result], "b" * 40, [combine_v1.diversity(result, records)]))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| setting")}
    assert rows["above"][9] == "**beats GRPO**"
    assert rows["above"][4] == "+10.00"  # the distance is exactly 0.10 for every seed
    assert float(rows["above"][7].removeprefix("< ")) < 0.05
    assert rows["on"][9] == "not shown to beat GRPO" and rows["on"][4] == "+0.00"
    assert rows["beyond"][9].startswith("no verdict (a seed's pass@1 is outside") and rows["beyond"][6] == "-"
    assert rows["above"][2] == "2 (primary)" and rows["above"][3] == "5"
    # Seeds 10-14 recorded 3, 4, 3, 4, 3 distinct correct equations (canonical: half): means 3.4 and 1.7.
    assert rows["above"][8] == "3.40 / 1.70" and rows["grpo"][8] == "3.00 / 1.50"
    assert rows["grpo"][9] == "(the reference trajectory)"
    assert "Pre-registered in commit bbbbbbb" in text and "500 held-out problems" in text
    assert "1,234 parameters" in text


def test_verdict_names_the_share_of_resamples_outside_the_curve():
    t = {"p": 0.2, "p_holm": 0.4, "reason": None, "outside_resamples": 0.125}
    assert analysis.verdict_of(t, 0.05) == ("not shown to beat GRPO (12% of resamples put a seed outside GRPO's "
                                            "curve: counted as the lowest effect, -100)")
    assert analysis.verdict_of({**t, "p_holm": 0.01, "outside_resamples": 0.0}, 0.05) == "**beats GRPO**"


def test_diversity_is_none_where_a_run_did_not_record_it(monkeypatch):
    result, records = synthetic_runs(monkeypatch)
    for row in records[("on", 12)]["rows"]:
        del row["distinct_correct_canonical"]
    div = combine_v1.diversity(result, records)
    assert div["on"]["2"]["distinct_correct_canonical"] is None and div["on"]["2"]["distinct_correct"] == pytest.approx(3.4)
    assert div["grpo"]["2"] == {"distinct_correct": 3.0, "distinct_correct_canonical": 1.5, "token_entropy": 0.5}


def test_fill_block_replaces_only_between_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{combine_v1.BLOCK_START}\nold\n{combine_v1.BLOCK_END}\noutro\n")
    analysis.fill_block(page, "new table\n", combine_v1.BLOCK_START, combine_v1.BLOCK_END)
    assert page.read_text() == f"intro\n{combine_v1.BLOCK_START}\nnew table\n{combine_v1.BLOCK_END}\noutro\n"
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="needs exactly one <!-- confirmatory:start -->"):
        analysis.fill_block(page, "x\n", combine_v1.BLOCK_START, combine_v1.BLOCK_END)


def test_summary_table_on_known_answers(monkeypatch):
    result, records = synthetic_runs(monkeypatch)
    text = combine_v1.summary_markdown(combine_v1.combine([result], "b" * 40))
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| set-up")}
    assert set(rows) == {"above", "on", "beyond"}  # GRPO is the reference, not a row
    assert rows["above"][0] == "synthetic" and rows["above"][2].startswith("2: +10.00 [")
    assert rows["above"][4] == "**beats GRPO**" and float(rows["above"][3].removeprefix("< ")) < 0.05
    assert rows["on"][4] == "not shown to beat GRPO"
    assert rows["beyond"][4].startswith("no verdict: a seed's pass@1 is outside") and rows["beyond"][3] == "-"
    assert "\n\nA CI bound" in text and "Pre-registered in commit bbbbbbb." in text


def test_summary_gives_each_setups_empirical_null_with_its_splits(monkeypatch):
    """The summary's closing sentence: the simulated null, then each set-up's share of GRPO-vs-GRPO splits with
    p < 0.05 at each checkpoint, over the splits that had a verdict; none without an empirical null."""
    result, _ = synthetic_runs(monkeypatch)
    assert "Empirical null" not in combine_v1.summary_markdown(combine_v1.combine([result], "b" * 40))
    base = result["settings"][0]
    result["settings"][0] = {**base, "null_seeds": [15, 16, 17, 18, 19]}
    result["empirical_null"] = {
        "2": {"all_splits": {"splits": 126, "no_verdict": 0, "share_p_below_0.05": 11 / 126}},
        "4": {"all_splits": {"splits": 126, "no_verdict": 10, "share_p_below_0.05": 0.0}}}
    other = {**result, "name": "other", "empirical_null": {
        c: {"all_splits": {"splits": 126, "no_verdict": 0, "share_p_below_0.05": 0.0}} for c in ("2", "4")}}
    text = combine_v1.summary_markdown(combine_v1.combine([result, other], "b" * 40))
    closing = text.splitlines()[-1]
    assert ("synthetic, 10 seeds split 5/5: 8.7% at step 2 (126 splits) and 0.0% at step 4 (116 of 126 splits with "
            "a verdict); other, 10 seeds split 5/5: 0.0% at step 2 and 0.0% at step 4 (126 splits each).") in closing
    assert "not independent" in closing and closing.index("Null false-positive rate") < closing.index("Empirical")
    assert closing.endswith("Pre-registered in commit bbbbbbb.")


def test_a_bootstrap_p_of_zero_is_shown_as_a_bound():
    setup = {"bootstrap": {"resamples": 10000}, "tests": [{"p": 0.0}, {"p": 0.2}, {"p": None}]}
    p_text, p_holm_text = combine_v1._p_formats(setup)
    assert (p_text(0.0), p_text(0.0123), p_text(None)) == ("< 0.0001", "0.0123", "-")
    assert p_holm_text(0.0) == "< 0.0002"  # Holm over the 2 tests with a p


@pytest.mark.parametrize("name", ["docs/confirmatory.md"])
def test_the_docs_show_the_verdicts_of_docs_confirmatory_json(name):
    """Pending text while docs/confirmatory.json is absent; once it exists, exactly its verdicts: the full tables or
    the short table, whichever markers the page has (README.md links the page and holds neither)."""
    path = ROOT / "docs" / "confirmatory.json"
    combined = json.loads(path.read_text()) if path.exists() else None
    text = (ROOT / name).read_text()
    found = 0
    for start, end, render in ((combine_v1.BLOCK_START, combine_v1.BLOCK_END, combine_v1.block_text),
                               (combine_v1.SUMMARY_START, combine_v1.SUMMARY_END, combine_v1.summary_text)):
        if start in text:
            found += 1
            assert text.split(start + "\n")[1].split(end)[0] == render(combined)
    assert found >= 1


def test_fill_verdicts_fills_each_block_a_page_has_and_refuses_a_page_with_none(tmp_path, monkeypatch):
    result, _ = synthetic_runs(monkeypatch)
    combined = combine_v1.combine([result], "b" * 40)
    page = tmp_path / "page.md"
    page.write_text(f"a\n{combine_v1.SUMMARY_START}\nold\n{combine_v1.SUMMARY_END}\nb\n{combine_v1.BLOCK_START}\nold\n"
                    f"{combine_v1.BLOCK_END}\n")
    assert combine_v1.fill_verdicts(page, combined) == ["tables", "summary"]
    assert page.read_text() == (f"a\n{combine_v1.SUMMARY_START}\n{combine_v1.summary_markdown(combined)}"
                                f"{combine_v1.SUMMARY_END}\nb\n{combine_v1.BLOCK_START}\n"
                                f"{combine_v1.verdict_markdown(combined)}{combine_v1.BLOCK_END}\n")
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="has neither <!-- confirmatory:start --> nor"):
        combine_v1.fill_verdicts(page, combined)


def test_protocol_commit_precedes_the_verdict_commit():
    """The pre-registration commit is an ancestor of the commit that added docs/confirmatory.json, and not it."""
    needs_history()
    path = ROOT / "docs" / "confirmatory.json"
    git = functools.partial(subprocess.run, cwd=ROOT, capture_output=True, text=True)
    proto = git(["git", "rev-parse", "9357c88^{commit}"]).stdout.strip()
    assert git(["git", "merge-base", "--is-ancestor", proto, "HEAD"]).returncode == 0
    if path.exists():
        combined = json.loads(path.read_text())
        assert combined["protocol_commit"] == proto
        added = git(["git", "log", "--diff-filter=A", "--format=%H", "--", "docs/confirmatory.json"]).stdout.split()
        for commit in added or [git(["git", "rev-parse", "HEAD"]).stdout.strip()]:
            assert commit != proto
            assert git(["git", "merge-base", "--is-ancestor", proto, commit]).returncode == 0


def test_combine_refuses_a_missing_result_and_a_later_protocol_commit(tmp_path, capsys, monkeypatch):
    # In-process (the CLI's `main`, as a console script calls it): three launches of a fresh interpreter cost 15 s.
    argv = ["confirm", "--combine", str(tmp_path), "--write", str(tmp_path / "c.json"), "--fill"]
    monkeypatch.chdir(ROOT)
    assert f"--combine {tmp_path}: no result.json" in run_error(capsys, [*argv, "--protocol-commit", "9357c88"])
    assert "not a commit of this repository" in run_error(capsys, [*argv, "--protocol-commit", "0" * 40])
    assert not (tmp_path / "c.json").exists()
    # A protocol commit on another branch does not precede HEAD.
    repo = tmp_path / "repo"
    repo.mkdir()
    git = functools.partial(subprocess.run, cwd=repo, capture_output=True, text=True, check=True)
    git(["git", "init", "-q", "-b", "main"])
    for branch, name in (("main", "a"), ("side", "b")):
        if branch == "side":
            git(["git", "checkout", "-q", "-b", "side"])
        (repo / name).write_text(name)
        git(["git", "add", name])
        git(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name])
    side = git(["git", "rev-parse", "HEAD"]).stdout.strip()
    git(["git", "checkout", "-q", "main"])
    monkeypatch.chdir(repo)
    assert "not an ancestor of HEAD" in run_error(capsys, [*argv, "--protocol-commit", side])


def test_the_test_and_the_settings_are_the_pre_registered_ones():
    """The protocol YAMLs are byte for byte those of the pre-registration commit, and the verdict code gives 0.7.0's
    published tests exactly: every effect, CI and p of docs/confirmatory.json recomputed from the committed run
    records. (The analysis has since been folded with the second protocol's; that it still writes each set-up's
    committed result.json byte for byte is tests/test_confirmatory_publish.py's slow check.)"""
    from exploration_trl.experiments.confirmatory import protocol, runner, verdict

    needs_history()

    def at_protocol(path):
        return subprocess.run(["git", "show", f"9357c88:{path}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    for path in ("configs/confirmatory/countdown3.yaml", "configs/confirmatory/countdown4.yaml"):
        assert (ROOT / path).read_text() == at_protocol(path), f"{path} changed since the pre-registration"
    published = json.loads((ROOT / "docs" / "confirmatory.json").read_text())
    for setup in published["setups"]:
        cfg = protocol.load(ROOT / "configs" / "confirmatory" / f"{setup['name']}.yaml")
        records = runner.collect(ROOT / "confirmatory_state" / setup["name"])
        base = next(s for s in cfg["settings"] if s["label"] == cfg["baseline"])
        grpo = np.stack([points_at(records[(base["label"], sd)], sorted(base["steps"])) for sd in base["seeds"]])
        boot = cfg["bootstrap"]
        for t in setup["tests"]:
            s = next(s for s in cfg["settings"] if s["label"] == t["label"])
            m = np.stack([points_at(records[(s["label"], sd)], [t["checkpoint"]])[0] for sd in s["seeds"]])
            r = verdict.test(grpo, m, resamples=int(boot["resamples"]), seed=int(boot["seed"]),
                             correction=boot["correction"])
            assert (r["effect"], r["ci"], r["p"]) == (t["effect"], t["ci"], t["p"]), (setup["name"], t["label"])


def test_combine_writes_the_json_fills_the_pages_and_copies_the_plot(monkeypatch, tmp_path):
    import sys

    result, records = synthetic_runs(monkeypatch)
    out = tmp_path / "synthetic"
    (out / "runs").mkdir(parents=True)
    (out / "result.json").write_text(json.dumps(result))
    (out / "plot.png").write_bytes(b"png")
    for (label, seed), rec in records.items():
        (out / "runs" / f"{label}__seed{seed}.json").write_text(json.dumps({**rec, "label": label, "seed": seed}))
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n{combine_v1.BLOCK_START}\n{combine_v1.PENDING}{combine_v1.BLOCK_END}\nend\n")
    docs = tmp_path / "docs"
    done = subprocess.run([sys.executable, "-m", "exploration_trl.cli", "confirm", "--combine", str(out),
                           "--protocol-commit", "HEAD", "--write", str(docs / "confirmatory.json"), "--fill", str(page)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    combined = json.loads((docs / "confirmatory.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert combined["protocol_commit"] == head
    assert combined["heldout"]["n_problems"] == 500
    assert combined["setups"][0]["diversity"]["above"]["2"]["distinct_correct"] == pytest.approx(3.4)
    assert page.read_text() == f"# Page\n{combine_v1.BLOCK_START}\n{combine_v1.verdict_markdown(combined)}" \
                               f"{combine_v1.BLOCK_END}\nend\n"
    assert (docs / "img" / "confirmatory_synthetic.png").read_bytes() == b"png"
