"""The methods table (README.md and docs/methods.md) and the methods section of the API reference
(docs/api/trainers.md), generated from the method registry: a method registered in its own module appears in all
three once this runs, without an edit to any of them.

Each method's row comes from its `MethodInfo` (`where`, `changes`, `knobs_note`, its paper, and `chosen`: the defaults
marked ours) and its config class: the keys it adds and the defaults it changes relative to `ExplorationGRPOConfig`,
at their defaults. The generated text sits between marker comments; `tests/test_methods_reference.py` regenerates it
and fails when a file differs.

Regenerate from the repository root with `python -m exploration_trl.cli.methods_reference` (`--check` only compares).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMAND = "python -m exploration_trl.cli.methods_reference"
TABLE_START, TABLE_END = "<!-- methods-table:start -->", "<!-- methods-table:end -->"
API_START, API_END = "<!-- methods-api:start -->", "<!-- methods-api:end -->"
#: The knobs column's header: the defaults are not all a paper's. "(ours)" marks `MethodInfo.chosen`; docs/math.md
#: lists each sourced value (`MethodInfo.published`) with its source; docs/methods.md explains the other options.
KNOBS_HEADER = ("key knobs (defaults; \"(ours)\": our value where the paper gives none or another; the sourced values "
                "with their sources: docs/math.md; the choices the papers leave open: docs/methods.md)")
#: After a knob whose default is ours (`MethodInfo.chosen`).
OURS = "(ours)"
#: Files and the blocks generated in them, relative to the repository root.
FILES = {"README.md": ("table",), "docs/methods.md": ("table",), "docs/api/trainers.md": ("api",)}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def knobs(config: type, prefixes: tuple[str, ...] = (), base: type | None = None) -> list[str]:
    """`key=default` for the keys `config` adds to `base` (default `ExplorationGRPOConfig`) or whose default it changes;
    with `base` None on the base config itself, its keys that start with `prefixes`."""
    from ..trainers import ExplorationGRPOConfig
    from .config_reference import default_of, format_default, own_and_changed

    if base is None and config is ExplorationGRPOConfig:
        chosen = [f for f in config.__dataclass_fields__.values() if f.name.startswith(prefixes)]
    else:
        own, changed = own_and_changed(config, base or ExplorationGRPOConfig)
        chosen = own + [f for f, _ in changed]
    return [f"`{f.name}={format_default(default_of(f))}`" for f in chosen]


def table() -> str:
    """The methods table: every registered method in registration order, then the shapings."""
    from ..methods import METHODS, method_info, shapings
    from ..trainers import ExplorationGRPOConfig

    rows = [f"| `method` | paper | what it changes | {KNOBS_HEADER} |", "|---|---|---|---|"]

    def row(name: str, info, keys: list[str]) -> str:
        paper = f"{info.display}: [{info.paper.short}]({info.paper.url})"
        where = f", {info.where}" if info.where else ""
        keys = [f"{k} {OURS}" if k.startswith("`") and k[1:].split("=", 1)[0] in info.chosen else k for k in keys]
        listed = ", ".join(keys) + (f" {info.knobs_note}" if keys and info.knobs_note else info.knobs_note)
        return (f"| {name} | {_cell(paper + where)} | {_cell(info.changes or info.description)} | "
                f"{_cell(listed or '-')} |")

    for name, (_, config) in METHODS.items():
        info = method_info(name)
        keys = [] if config is ExplorationGRPOConfig else knobs(config)
        rows.append(row(f"`{name}`", info, keys))
    for info in shapings():
        rows.append(row("any config", info, knobs(ExplorationGRPOConfig, info.config_prefixes)))
    return "\n".join(rows) + "\n"


def api() -> str:
    """One `:::` section per registered method (its config, its strategy with its hooks, its trainer), for
    mkdocstrings."""
    from ..methods import METHODS, method_info, strategy_of
    from ..trainers import ExplorationGRPOTrainer

    out = []
    for name, (trainer, config) in METHODS.items():
        if trainer is ExplorationGRPOTrainer:
            continue
        out += [f"### {method_info(name).display}", ""]
        strategy = strategy_of(name)
        for cls in (config, strategy, trainer):
            if cls is None:
                continue
            members = "[advantages, transform_logps, extra_loss]" if cls is strategy else "false"
            out += [f"::: {cls.__module__}.{cls.__qualname__}", "    options:", "      heading_level: 4",
                    f"      members: {members}", ""]
    return "\n".join(out)


def fill(text: str, start: str, end: str, body: str, path: str) -> str:
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{path}: needs exactly one {start} and one {end} line around the generated text")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}{end}{tail}"


def render(root: Path) -> dict[str, str]:
    """`{path: new text}` of the files with generated blocks."""
    blocks = {"table": (TABLE_START, TABLE_END, table()), "api": (API_START, API_END, api())}
    out = {}
    for rel, kinds in FILES.items():
        text = (root / rel).read_text(encoding="utf-8")
        for kind in kinds:
            start, end, body = blocks[kind]
            text = fill(text, start, end, body, rel)
        out[rel] = text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Write the methods table (README.md, docs/methods.md) "
                                     "and the API reference's methods from the method registry.")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in render(args.root).items():
        path = args.root / rel
        if path.read_text(encoding="utf-8") != text:
            stale.append(rel)
            if not args.check:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path}")
    if args.check and stale:
        print(f"{', '.join(stale)} out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
