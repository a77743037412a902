"""The README is a landing page and the docs site behind it builds: links, anchors, navigation and copied examples.

`mkdocs build --strict` (with the warnings `mkdocs.yml` turns on) fails on a link to a missing page or anchor and on
a page left out of the navigation. The README and the pages are also read on GitHub, whose anchors differ from
MkDocs's, so every relative link in them is checked here against the files and GitHub's heading anchors.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

import exploration_trl
from helpers import builtin_methods

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = REPO_ROOT / "tests"
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once (`mkdocs build --strict`) for every test here that reads a built page."""
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = mkdocs_build(REPO_ROOT, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def page_html(site: Path, page: str) -> str:
    """The HTML of a built page, by its path under docs/ without `.md` (`api/core`)."""
    return (site / page / "index.html").read_text(encoding="utf-8")


def html_element(html: str, marker: str, tag: str = "p") -> str:
    """The inner HTML of the first `<tag>` element of a built page whose HTML contains `marker`."""
    for m in re.finditer(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL):
        if marker in m.group(1):
            return m.group(1)
    raise AssertionError(f"no <{tag}> containing {marker!r}")


def codes(html: str) -> list[str]:
    """The texts of the inline code spans of an HTML fragment."""
    return re.findall(r"<code>([^<]*)</code>", html)


def module_literal(path: Path, name: str):
    """A module-level `NAME = <literal>` of a Python file (a test's parametrisation), read without importing it."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id == name for n in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no module-level `{name} = <literal>`")


def test_site_builds_strictly(site):
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
    assert demo.endswith("exploration-trl demo") and tests.endswith("python -m pytest -q -n 2 --dist loadfile")
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


# ------------------------------------------------------------------------------------------------------------------
# Lists of methods and core functions on the built site: each comes from the registry or the tests it describes, so
# that a method or a core function added later cannot be left out of one.


def public_names_defined_in(module) -> list[str]:
    """A module's `__all__`, or else the public functions, classes and constants its own source defines."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = []
    for node in ast.parse(Path(module.__file__).read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for n in targets if isinstance(n, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def test_api_reference_renders_every_public_core_name(site):
    """Every name of `exploration_trl.core.__all__`, and every public name of each public core module, has its
    entry (an anchor `id`) in the built API reference: a new core module needs its `:::` block on docs/api/core.md."""
    import exploration_trl.core as core

    ids = set()
    for page in site.joinpath("api").rglob("index.html"):
        ids |= set(re.findall(r'id="(exploration_trl\.core\.[\w.]+)"', page.read_text(encoding="utf-8")))
    missing = []
    for name in core.__all__:
        module = getattr(getattr(core, name), "__module__", None)
        found = f"{module}.{name}" in ids if module else any(i.endswith(f".{name}") for i in ids)
        if not found:
            missing.append(f"{name} (from {module or 'exploration_trl.core'})")
    assert not missing, f"exploration_trl.core.__all__ names missing from the built API reference: {missing}"
    modules = [m.name for m in pkgutil.iter_modules(core.__path__) if not m.name.startswith("_")]
    assert {"advantages", "passk", "estimators", "bonuses", "losses"} <= set(modules)
    for mod in modules:
        module = importlib.import_module(f"exploration_trl.core.{mod}")
        absent = [n for n in public_names_defined_in(module) if f"exploration_trl.core.{mod}.{n}" not in ids]
        assert not absent, (f"exploration_trl.core.{mod}: {absent} not in the built API reference; add "
                            f"`::: exploration_trl.core.{mod}` to docs/api/core.md")


def _string_constants(module_name: str) -> set[str]:
    tree = ast.parse(Path(sys.modules[module_name].__file__).read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_metrics_page_documents_every_metric_a_method_logs(site):
    """Each registered method's metrics (the string constants under its `metric_prefixes` in the modules of its
    strategy and trainer) have a row on the built Training-time metrics page, and every prefix has at least one."""
    from exploration_trl.methods import method_info, strategy_of

    documented = set(codes(page_html(site, "metrics")))
    missing = []
    for name in builtin_methods():
        modules = {cls.__module__ for cls in (strategy_of(name), exploration_trl.METHODS[name][0]) if cls is not None}
        constants = set().union(*(_string_constants(m) for m in modules))
        for prefix in method_info(name).metric_prefixes:
            logged = {c for c in constants if re.fullmatch(re.escape(prefix) + r"[a-z0-9_]+", c)}
            missing += sorted(logged - documented)
            if not any(d.startswith(prefix) for d in documented):
                missing.append(f"{prefix}* (method {name})")
    assert not missing, f"docs/metrics.md: add a row for {missing}"


def _method_names(fragment: str, known: set[str]) -> set[str]:
    """The code spans of an HTML fragment that name a method or a composition of methods."""
    return {c for c in codes(fragment) if c in known or (c.count("+") == 1 and set(c.split("+")) <= known)}


def test_distributed_page_lists_what_the_multiprocess_tests_run(site):
    """docs/distributed.md says tests/test_multiprocess.py launches every registered method: its METHODS must hold
    each of them, and the page must name exactly what it runs (and the LoRA methods as LORA_METHODS)."""
    from mp_driver import cases

    mp_methods = cases()
    lora = module_literal(TESTS / "test_multiprocess.py", "LORA_METHODS")
    registered = builtin_methods()
    missing = [m for m in registered if m not in mp_methods]
    assert not missing, (f"tests/test_multiprocess.py's METHODS lacks {missing}: docs/distributed.md says it runs "
                         "every registered method")
    html = page_html(site, "distributed")
    para = html_element(html, "launches every registered method")
    # The single methods come from the registry (the page names none); the compositions are chosen, so named.
    composed = {m for m in mp_methods if "+" in m}
    named = _method_names(para, set(registered))
    assert named == composed, (f"docs/distributed.md names {sorted(named - composed)} that tests/test_multiprocess.py "
                               f"does not run and leaves out {sorted(composed - named)} that it runs")
    if any(m.endswith("-global") for m in mp_methods):
        assert "cov_selection: global" in para
    assert _method_names(html_element(html, "LoRA (PEFT) under DDP", "td"), set(registered)) == set(lora)


def test_vllm_page_names_exactly_the_methods_the_vllm_tests_run(site):
    """docs/vllm.md claims vLLM colocate training only for the methods tests/test_vllm_colocate.py runs."""
    colocate = set(module_literal(TESTS / "test_vllm_colocate.py", "METHODS"))
    html = page_html(site, "vllm")
    registered = set(builtin_methods())
    para = html_element(html, "Which methods were run through vLLM")
    assert _method_names(para, registered) == colocate
    table = html[html.index("active: max"):]
    table = table[:table.index("</table>")]
    assert set(re.findall(r"<tr>\s*<td>([^<]+)</td>", table)) == colocate
    assert "trains every method" not in html


def test_pages_name_every_method_that_reads_rollout_statistics(site):
    """The vLLM and GPU-recipe pages say which methods read the rollout's statistics (and so TRL's or vLLM's
    log-probs): every registered strategy that asks for them is named there."""
    from exploration_trl.methods import method_info, strategy_of
    from exploration_trl.trainers.strategy import Strategy

    needs = ("needs_rollout_logps", "needs_prompt_logps", "needs_rollout_candidates")
    readers = [name for name in builtin_methods() if strategy_of(name) is not None
               and any(getattr(strategy_of(name), n) is not getattr(Strategy, n) for n in needs)]
    assert {"progrpo", "casp"} <= set(readers)
    for page, marker in (("vllm", "reuse it: no added forward"), ("gpu_recipes", "rollout statistics come from")):
        text = re.sub(r"<[^>]+>", "", html_element(page_html(site, page), marker)).lower()
        missing = [n for n in readers if method_info(n).display.split(" (")[0].lower() not in text]
        assert not missing, f"docs/{page}.md: name {missing} among the methods that read the rollout's statistics"


def test_recipes_row_matches_the_shipped_recipes(site):
    recipes = REPO_ROOT / "configs" / "methods"
    missing = [m for m in builtin_methods() if not (recipes / f"{m}_qwen2.5-0.5b.yaml").exists()]
    assert not missing, f"docs/gpu_recipes.md says every method has a 0.5B recipe; {missing} has none"
    html = page_html(site, "gpu_recipes")
    big = {p.name.removesuffix("_qwen2.5-7b.yaml") for p in recipes.glob("*_qwen2.5-7b.yaml")}
    assert set(codes(html_element(html, "Qwen2.5-7B (CaSP math", "td"))) == big


def test_configuration_page_lists_the_sides_and_knobs_of_the_registry(site):
    from exploration_trl.methods import ADVANTAGE_SIDE, LOSS_SIDE
    from exploration_trl.trainers.callbacks.entropy_band import KNOBS

    # The sides are the registry's (the methods table): the page lists none by hand, so a new method needs no edit
    # here; the loss side's examples are loss-side methods.
    registered = builtin_methods()
    html = page_html(site, "configuration")
    advantage = html_element(html, "the advantage-side method", "li")
    assert "methods table" in advantage and _method_names(advantage, set(registered)) == set()
    loss = html_element(html, "the loss-side method", "li")
    assert _method_names(loss, set(registered)) <= set(LOSS_SIDE) and 'side="loss"' in loss.replace("&quot;", '"')
    assert set(ADVANTAGE_SIDE) & set(registered) and set(LOSS_SIDE) & set(registered)
    para = html_element(html, "Knobs: ")
    listed = para[para.index("Knobs: "):para.index("The knob is logged")]
    assert set(codes(listed)) - {"MethodInfo.coefficients"} == set(KNOBS)


def intro(text: str) -> str:
    """The paragraph under a page's title, its lines joined."""
    return " ".join(text.split("\n\n")[1].split())


def test_intro_counts_no_methods_and_points_to_the_table():
    """The first paragraph of README.md and docs/index.md (one text) names the method families, not a count that a
    new method would make stale, and links the methods table, which the registry generates."""
    readme = intro(README.read_text(encoding="utf-8"))
    index = intro((DOCS / "index.md").read_text(encoding="utf-8"))
    assert "[methods table](#methods)" in readme and "[methods table](methods.md#the-methods)" in index
    assert readme == index.replace("(methods.md#the-methods)", "(#methods)")
    numbers = r"one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\d+"
    assert not re.search(rf"\b({numbers})\s+(\w+\s+)?(fixes|methods|estimators|bonuses)\b", readme, re.IGNORECASE)


def test_no_list_is_swallowed_into_a_paragraph(site):
    """Python-Markdown (unlike GitHub) needs a blank line before a list and 4-space indents inside a list item;
    without them a list renders as one paragraph with literal "- " markers. Checked on the user pages (the API
    reference renders docstrings)."""
    swallowed = []
    for page in site.rglob("index.html"):
        if "api" in page.relative_to(site).parts:
            continue
        for para in re.findall(r"<p>(.*?)</p>", page.read_text(encoding="utf-8"), re.DOTALL):
            for m in re.finditer(r"\n(?:[-*]|\d+\.) ", para):
                text = re.sub(r"<[^>]+>", "", para[m.start():m.start() + 60]).strip()
                swallowed.append(f"{page.parent.relative_to(site)}: {text!r}")
    assert not swallowed, swallowed
