"""The README is a landing page and the docs site behind it builds: links, anchors, navigation and copied examples.

`mkdocs build --strict` (with the warnings `mkdocs.yml` turns on) fails on a link to a missing page or anchor and on
a page left out of the navigation. The README and the pages are also read on GitHub, whose anchors differ from
MkDocs's, so every relative link in them is checked here against the files and GitHub's heading anchors.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

import exploration_trl

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"
README_MAX_LINES = 300
RECIPE = "configs/methods/casp_qwen2.5-0.5b.yaml"

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str, blank_code_spans: bool = True) -> list[str]:
    """The lines outside fenced code blocks, inline code spans blanked out (a link there is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(_CODE_SPAN.sub("``", line) if blank_code_spans else line)
    return out


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    anchors, seen = set(), {}
    for line in prose_lines(path.read_text(encoding="utf-8"), blank_code_spans=False):
        m = _HEADING.match(line)
        if m:
            slug = github_anchor(m.group(2))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_relative_links(page: Path) -> list[str]:
    """Relative links of a Markdown file whose target file (or heading anchor) does not exist."""
    broken = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors_of(dest)):
                broken.append(f"{target} (no heading with anchor #{anchor})")
    return broken


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          check=False, cwd=root, capture_output=True, text=True, timeout=120)


def table_rows(text: str, first_header: str) -> list[str]:
    """The rows of the first Markdown table whose header row starts with `first_header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def yaml_block(text: str, first_line: str) -> dict:
    """The fenced YAML block whose first line is `first_line`, parsed."""
    m = re.search(r"```yaml\n" + re.escape(first_line) + r"\n(.*?)```", text, re.DOTALL)
    assert m, f"no YAML block starting with {first_line!r}"
    return yaml.safe_load(m.group(1))


def fenced_commands(text: str) -> list[str]:
    return [c.strip() for c in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)]


def nav_pages() -> list[str]:
    """The pages of `mkdocs.yml`'s nav, as paths under docs/ (`api/core.md`), in nav order."""
    nav = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return re.findall(r"[\w/-]+\.md", str(nav))


def test_site_builds_strictly(tmp_path):
    proc = mkdocs_build(REPO_ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    built = {str(p.parent.relative_to(site)) for p in site.rglob("index.html")}
    pages = {str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md")} - {"index"}
    pages = {p.removesuffix("/index") for p in pages}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"
    methods = (site / "methods" / "index.html").read_text(encoding="utf-8")
    # the hook (docs/_hooks/table_pipes.py): GitHub's escaped pipe in a table's code span renders as a plain pipe
    assert "<code>A − γp·log π_old(y|x)</code>" in methods and "\\|" not in methods
    # mkdocs-material with navigation tabs, a copy button on code blocks and search
    config = json.loads(re.search(r'<script id="__config" type="application/json">(.*?)</script>', methods).group(1))
    assert {"content.code.copy", "navigation.tabs"} <= set(config["features"])
    assert 'class="md-tabs"' in methods
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert any("group_advantages" in doc["location"] for doc in index["docs"])
    # the API reference, rendered from the docstrings (mkdocstrings), Sphinx roles dropped (docs/_hooks/rst_roles.py)
    core = (site / "api" / "core" / "index.html").read_text(encoding="utf-8")
    assert 'id="exploration_trl.core.advantages.group_advantages"' in core
    assert "GRPO group-relative advantage" in core
    trainers = (site / "api" / "trainers" / "index.html").read_text(encoding="utf-8")
    assert 'id="exploration_trl.trainers.base.ExplorationGRPOTrainer._compute_advantages"' in trainers
    confirm = (site / "api" / "confirmatory" / "index.html").read_text(encoding="utf-8")
    assert 'id="exploration_trl.experiments.confirmatory.analysis.analyse"' in confirm
    for page in site.joinpath("api").rglob("index.html"):
        assert not re.search(r":(func|mod|class|meth):<code>", page.read_text(encoding="utf-8")), page


def test_strict_build_fails_on_a_broken_link_a_missing_anchor_and_a_page_outside_nav(tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", root)
    (root / "exploration_trl").symlink_to(REPO_ROOT / "exploration_trl")  # the API reference's source
    with open(root / "docs" / "methods.md", "a", encoding="utf-8") as f:
        f.write("\nSee [gone](gone.md) and [Evaluation](evaluation.md#no-such-heading).\n")
    (root / "docs" / "orphan.md").write_text("# Not in nav\n", encoding="utf-8")
    proc = mkdocs_build(root, tmp_path / "site")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "'gone.md'" in out and "'#no-such-heading'" in out and "orphan.md" in out, out


def test_readme_relative_links_resolve():
    assert broken_relative_links(README) == []
    links = [t for line in prose_lines(README.read_text(encoding="utf-8")) for t in _LINK.findall(line)]
    to_docs = {t.partition("#")[0].removeprefix("docs/") for t in links
               if t.startswith("docs/") and t.partition("#")[0].endswith(".md")}
    # every page of the site but the home page, and the API reference through its index
    expected = {p for p in nav_pages() if not p.startswith("api/")} - {"index.md"} | {"api/index.md"}
    assert to_docs == expected, "the README links every page of the site"


def test_api_reference_documents_every_registered_method():
    """docs/api/trainers.md renders every registered method's trainer and config, from the module defining each."""
    text = (DOCS / "api" / "trainers.md").read_text(encoding="utf-8")
    for name, classes in exploration_trl.METHODS.items():
        for cls in (c for c in classes if c.__module__.startswith("exploration_trl.")):  # not a test's own method
            assert f"::: {cls.__module__}.{cls.__qualname__}\n" in text, (
                f"docs/api/trainers.md: add `::: {cls.__module__}.{cls.__qualname__}` (method {name})")


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")))
def test_docs_links_resolve_on_github(page):
    assert broken_relative_links(DOCS / page) == []


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "a.md").write_text("# Title: the `one`\n\n## Two, three\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#title-the-one) [ok](a.md#two-three) [x](a.md#two) [y](c.md) `[z](d.md)`\n"
                    "[web](https://example.org/x.md)\n", encoding="utf-8")
    assert broken_relative_links(page) == ["a.md#two (no heading with anchor #two)", "c.md (no such file)"]


def test_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    demo, tests = fenced_commands(text)[:2]
    assert demo.endswith("exploration-trl demo") and tests.endswith("python -m pytest -q")
    # CI runs the README's own test command, and the install page repeats both commands word for word
    assert tests in (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert fenced_commands((DOCS / "install.md").read_text(encoding="utf-8"))[:2] == [demo, tests]


def test_methods_table_lists_every_method_in_readme_and_docs():
    readme = table_rows(README.read_text(encoding="utf-8"), "| `method` |")
    docs = table_rows((DOCS / "methods.md").read_text(encoding="utf-8"), "| `method` |")
    assert readme == docs, "the README's methods table and docs/methods.md's are one table: edit both"
    names = [re.match(r"\| `([\w+]+)` \|", row) for row in readme]
    assert {m.group(1) for m in names if m} == set(exploration_trl.METHODS)


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_yaml_example_is_the_recipe(page):
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    example = yaml_block(text, f"# {RECIPE} (excerpt)")
    recipe_text = (REPO_ROOT / RECIPE).read_text(encoding="utf-8")
    recipe = yaml.safe_load(recipe_text)
    assert len(example) >= 10 and {k: recipe.get(k) for k in example} == example
    if page == "README.md":  # its launch command is the one the recipe's header gives
        launch = next(c for c in fenced_commands(text) if c.startswith("accelerate launch"))
        assert f"#   {launch}" in recipe_text.splitlines()


def test_docs_numbers_are_dated():
    """A number on a docs page carries the date it was measured, never "today" (the README's demo says when)."""
    for page in DOCS.glob("*.md"):
        assert not re.search(r"\btoday\b", page.read_text(encoding="utf-8"), re.IGNORECASE), page.name
