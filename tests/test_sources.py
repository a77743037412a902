"""docs/math.md, "Sources": what the method registry calls a paper's value is what a source states, and every method
cites its paper the same way.

* `MethodInfo.published` of every registered method and shaping is exactly the "Published settings and their sources"
  table (key, value, a source), and `MethodInfo.chosen` exactly the "Our values where no source gives one" table.
* Every method's row in "Citations" names its arXiv id (the registry's), and its section of the page and its core
  function's docstring cite that id and the equations listed.
* The tables that show a method's default setting say which of its values are ours: the methods table and the
  sweeps' findings table.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import exploration_trl.core as core
from exploration_trl import methods
from exploration_trl.experiments.research import frontier
from exploration_trl.trainers import METHODS

ROOT = Path(__file__).resolve().parent.parent
MATH = ROOT / "docs" / "math.md"
NONE = "–"  # a cell with nothing pinned


def flat(text: str) -> str:
    return " ".join(text.split())


def section(heading: str) -> str:
    """The text under `heading` (a `##` or `###` heading of the page) up to the next heading of its level or above."""
    lines = MATH.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+) (.+)$", line)
        if m and m.group(2) == heading:
            level = len(m.group(1))
            body = []
            for rest in lines[i + 1:]:
                n = re.match(r"^(#+) ", rest)
                if n and len(n.group(1)) <= level:
                    break
                body.append(rest)
            return "\n".join(body)
    raise AssertionError(f"docs/math.md has no heading {heading!r}")


def table(heading: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table under `heading`, as {column: cell} with code marks dropped."""
    rows = [line for line in section(heading).splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert set(rows[1].replace("|", "").strip()) <= set("-: "), heading
    return [dict(zip(header, (c.strip().strip("`") for c in row.strip("|").split("|")))) for row in rows[2:]]


def value(cell: str):
    try:
        return ast.literal_eval(cell)
    except (ValueError, SyntaxError):
        return cell


def registered() -> dict[str, methods.MethodInfo]:
    """The built-in methods and shapings (a method another test registers for a while is not the page's)."""
    builtin = [name for name in METHODS
               if (methods.strategy_of(name) or METHODS[name][0]).__module__.startswith("exploration_trl.")]
    return {**{name: methods.method_info(name) for name in builtin}, **{s.name: s for s in methods.shapings()}}


def by_method(rows: list[dict[str, str]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in rows:
        out.setdefault(row["method"], {})[row["key"]] = value(row["value"])
    return out


# ----------------------------------------------------------------------------------------- published and ours
def test_published_holds_exactly_the_listed_sourced_values():
    rows = table("Published settings and their sources")
    assert all(row["source"] and row["source"] != NONE for row in rows)
    listed = by_method(rows)
    infos = registered()
    assert set(listed) <= set(infos), sorted(set(listed) - set(infos))
    for name, info in infos.items():
        assert dict(info.published) == listed.get(name, {}), name


def test_chosen_holds_exactly_our_listed_values():
    rows = table("Our values where no source gives one")
    assert all(row["why"] for row in rows)
    listed = by_method(rows)
    for name, info in registered().items():
        assert dict(info.chosen) == listed.get(name, {}), name
        assert not set(info.chosen) & set(info.published), name
    # the one the issue named: the batch penalty's coefficient is ours, the historical bonus's the paper's
    outcome = methods.method_info("outcome_explore")
    assert "outcome_batch_coef" not in outcome.published and outcome.chosen == {"outcome_batch_coef": 0.2}


def test_a_record_refuses_a_key_both_published_and_chosen():
    info = methods.method_info("outcome_explore")
    with pytest.raises(ValueError, match="method 'outcome_explore': outcome_batch_coef both published and chosen"):
        methods.MethodInfo(**{**info.__dict__, "published": {**info.published, "outcome_batch_coef": 0.2}})


# ------------------------------------------------------------------------------------------------- citations
def test_every_method_cites_its_arxiv_id_and_equations_on_the_page_and_in_its_core_function():
    rows = table("Citations")
    infos = registered()
    assert {row["method"] for row in rows} == set(infos)
    for row in rows:
        info, arxiv = infos[row["method"]], row["arXiv"]
        assert info.paper.url == f"https://arxiv.org/abs/{arxiv}", row["method"]
        cited = f"arXiv {arxiv}"
        equations = [] if row["equations"] == NONE else row["equations"].split(", ")
        assert all(re.fullmatch(r"Eq\. \d+", e) for e in equations), row
        where = [] if row["where"] == NONE else [row["where"]]
        page = flat(section(row["section of this page"]))
        doc = flat(inspect.getdoc(getattr(core, row["core function"])) or "")
        for needed in [cited, *equations, *where]:
            assert needed in page, (row["method"], "docs/math.md", needed)
            assert needed in doc, (row["method"], row["core function"], needed)
        if info.side != "none":  # a method's table row names where in the paper it comes from
            assert info.where, row["method"]


def test_the_newer_methods_cite_equation_numbers():
    """The five methods added in 0.8.0 (issue 67): each has at least one equation number, QAE's included."""
    rows = {row["core function"]: row for row in table("Citations")}
    for function in ("maxrl_advantages", "weighted_reinforce_advantages", "quantile_advantages",
                     "entropy_shaped_advantages"):
        assert rows[function]["equations"] != NONE, function
    assert rows["quantile_advantages"]["equations"] == "Eq. 3, Eq. 4"


# ---------------------------------------------------------------------------- tables that show our values
def test_the_methods_table_marks_our_defaults_and_claims_no_paper_values():
    from exploration_trl.cli import methods_reference

    text = methods_reference.table()
    header = text.splitlines()[0]
    assert "paper values" not in header and "(ours)" in header
    assert "`outcome_batch_coef=0.2` (ours)" in text and "`outcome_ucb_coef=0.2`," in text
    assert "`passk_k=4` (ours)" in text and "`pkpo_k=4` (ours)" in text and "`qae_eps=0.0001` (ours)" in text
    assert "`qae_k=0.4`," in text  # the authors' K, unmarked
    marked = set(re.findall(r"`([a-z_0-9]+)=[^`]*` \(ours\)", text))
    assert marked == {k for info in registered().values() for k in info.chosen}


def test_the_sweeps_published_point_keeps_our_values_and_says_which():
    assert frontier.PUBLISHED["outcome_explore"] == {"outcome_ucb_coef": 0.2, "outcome_ucb_b0": 0.5,
                                                     "outcome_batch_coef": 0.2}
    assert frontier.ours("outcome_explore") == {"outcome_batch_coef": 0.2}
    assert frontier.ours("progrpo") == {} and frontier.ours("dsgrpo") == {"ds_logp_granularity": "token"}
    assert frontier.ours(frontier.ENTROPY_BONUS) == {"entropy_coef": 0.01}
    point = {"accuracy": {"mean": 0.5, "std": 0.0}, "modes": {"mean": 2.0, "std": 0.0}}
    found = {"rule": {"diversity": ["modes"]}, "methods": {
        "outcome_explore": {"best": None, "num_settings": 3, "published": point},
        "progrpo": {"best": None, "num_settings": 3, "published": point}}}
    printed = frontier.format_findings(found, [("accuracy", "accuracy", 3, 1.0), ("modes", "modes", 2, 1.0)])
    lines = {line.split("|")[1].strip(): line for line in printed.splitlines() if line.startswith("| ")}
    assert "published setting (ours: keys no source gives)" in printed
    assert "0.500 / 2.00 (ours: batch_coef=0.2)" in lines["outcome_explore"]
    assert "0.500 / 2.00 " in lines["progrpo"] and "ours" not in lines["progrpo"]
