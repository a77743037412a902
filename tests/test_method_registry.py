"""One method, one place: each method's record (`exploration_trl.methods.MethodInfo`) sits next to its trainer, and
every table that lists methods reads the registry.

* No module outside `trainers/` (the methods), `experiments/` (experiment settings), `core/` (each method's pure
  function) and `integrations/` (the methods registered in another framework) names a registered method in its code.
* A method written in a temporary module, with no other edit, shows in `train --help`, in a model card (the trainer
  sentence, the method section, the citations, the hyperparameter table) and in the frontier tables.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

import exploration_trl.trainers  # noqa: F401  (registers the built-in methods)
from exploration_trl import methods

PACKAGE_ROOT = Path(exploration_trl.__file__).resolve().parent
#: Where naming a method is the point: the methods themselves, the experiments' settings, each method's core function,
#: and the front ends that register chosen methods under another framework's names (`integrations/verl/`).
ALLOWED = ("trainers", "experiments", "core", "integrations")
#: `grpo` is TRL's algorithm and the base every method builds on: TRL's own names carry it (`GRPOTrainer`,
#: `GRPOConfig`, `loss_type: grpo`) and so do the card's tags and the hyperparameter table of TRL's GRPO settings.
GENERIC = {"grpo"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose: a paper cited by name is not a table of methods)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _code_words(source: str) -> list[tuple[int, str]]:
    """`(line, text)` of the identifiers and (non-docstring) string constants of a module."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((line, node.value))
        elif isinstance(node, ast.Name):
            out.append((line, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((line, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((line, node.name))
        elif isinstance(node, ast.arg):
            out.append((line, node.arg))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((line, node.arg))
        elif isinstance(node, ast.alias):
            out.append((line, node.asname or node.name.rsplit(".", 1)[-1]))
    return out


def method_mentions(root: Path = PACKAGE_ROOT) -> list[str]:
    """`path:line: text` for each identifier or string outside `ALLOWED` that names a registered method: its name as a
    word (`casp`, `kl_cov_ratio`, `"pkpo/k"`) or its trainer's or config's class name."""
    names = [n for n in methods.METHODS if n not in GENERIC]
    word = re.compile(r"(?<![a-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![a-z0-9])")
    classes = {c.__name__ for n in names for c in methods.METHODS[n]}
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ALLOWED:
            continue
        for line, text in _code_words(path.read_text(encoding="utf-8")):
            if word.search(text.lower()) or any(c in text for c in classes):
                found.append(f"{rel}:{line}: {text!r}")
    return found


def test_no_module_outside_the_methods_names_one():
    assert len(methods.METHODS) >= 9
    assert method_mentions() == []


def test_the_check_sees_a_method_named_in_code(tmp_path):
    """The checker itself: a table keyed by a method name, a config key and a class name are found; prose is not."""
    pkg = tmp_path / "hub"
    pkg.mkdir()
    (pkg / "table.py").write_text(textwrap.dedent('''
        """Cards for CaSP models (a docstring: prose)."""
        NAMES = {"casp": "CaSPTrainer"}
        KEYS = ("kl_cov_ratio",)
        def f(pkpo_k): return ProGRPOConfig
        TAGS = ("grpo", "rlvr", "cascade")
    '''))
    found = method_mentions(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == ["'casp'", "'CaSPTrainer'", "'kl_cov_ratio'", "'pkpo_k'",
                                                    "'ProGRPOConfig'"]


# --------------------------------------------------------------------------------------------- a new method
THROWAWAY = '''
from dataclasses import dataclass, field

from exploration_trl.methods import MethodInfo, arxiv_paper, register_method
from exploration_trl.trainers.base import ExplorationGRPOConfig, ExplorationGRPOTrainer
from exploration_trl.trainers.strategy import AdvantageStrategy


@dataclass
class ThrowawayConfig(ExplorationGRPOConfig):
    throwaway_shift: float = field(default=0.5, metadata={"help": "Added to every advantage."})


@register_method(MethodInfo(
    name="throwaway", side="advantage", display="Throwaway shift",
    summary="Throwaway: a constant added to every advantage",
    description="Adds a constant to every advantage.",
    paper=arxiv_paper("doe2099throwaway", "A Throwaway Method", "Doe, 2099", ["Jane Doe"], 2099, "9999.99999"),
    config_prefixes=("throwaway_",), metric_prefixes=("throwaway/",),
    coefficients={"throwaway_shift": 1}, published={"throwaway_shift": 0.25},
))
class Throwaway(AdvantageStrategy):
    config_class = ThrowawayConfig

    def advantages(self, batch, advantages):
        return advantages + self.args.throwaway_shift


class ThrowawayTrainer(ExplorationGRPOTrainer):
    method = "throwaway"
'''


@pytest.fixture
def throwaway(tmp_path):
    """A method module written to a temporary folder and imported: nothing else in the package is edited."""
    (tmp_path / "throwaway_method.py").write_text(THROWAWAY)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("throwaway_method")
    finally:
        methods.unregister("throwaway")
        sys.modules.pop("throwaway_method", None)
        sys.path.remove(str(tmp_path))


def test_a_new_method_module_is_everywhere_without_another_edit(throwaway, tmp_path, capsys):
    from exploration_trl.cli import main
    from exploration_trl.experiments import _common
    from exploration_trl.experiments.research import frontier
    from exploration_trl.hub import write_model_card
    from exploration_trl.hub.tables import extract_hyperparameters
    from exploration_trl.toy import build_toy, save_toy
    from exploration_trl.trainers import get_trainer_class

    assert "throwaway" in methods.ADVANTAGE_SIDE and methods.METHODS["throwaway"][0] is throwaway.ThrowawayTrainer
    assert throwaway.ThrowawayTrainer.hook == ("advantage", "throwaway")
    assert get_trainer_class("casp+throwaway").__name__ == "ThrowawayCaSPTrainer"
    assert _common.validate_method("throwaway+casp") == "throwaway+casp"

    # train --help: its line under `methods`, its keys
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    line = f"\n  {'throwaway':<38}Throwaway: a constant added to every advantage (advantage side)\n"
    assert line in out
    assert "throwaway keys (method: throwaway):\n  throwaway_shift = 0.5" in out

    # the model card: the trainer sentence, the method section, the citation, the tags and the hyperparameter table
    config = throwaway.ThrowawayConfig(output_dir="unused", use_cpu=True, report_to=[])
    folder = save_toy(*build_toy("abc", seed=0), tmp_path / "model")
    card = write_model_card(folder, "throwaway", "Qwen/Qwen2.5-0.5B-Instruct", training_args=config).read_text()
    assert "The trainer is `ThrowawayTrainer` from" in card
    assert "## Method: Throwaway shift" in card and "Adds a constant to every advantage." in card
    assert "[Doe, 2099](https://arxiv.org/abs/9999.99999)" in card and "@misc{doe2099throwaway," in card
    assert "- throwaway\n" in card
    assert extract_hyperparameters("throwaway", config)["method"] == [("throwaway_shift", "0.5")]
    assert "| `throwaway_shift` | 0.5 |" in card
    composed = write_model_card(folder, "throwaway+kl_cov", training_args=config).read_text()
    assert "The trainer is `ThrowawayKLCovTrainer` from" in composed
    assert "## Method: Throwaway shift + KL-Cov" in composed

    # the frontier and curve tables: its published setting, its setting labels
    assert frontier.PUBLISHED["throwaway"] == {"throwaway_shift": 0.25}
    assert frontier.setting_label({"throwaway_shift": 0.25}) == "shift=0.25"
    row = {"method": "throwaway", "setting": {"throwaway_shift": 0.25}, "seeds": [0], "acc": {"mean": 0.5, "std": 0.0}}
    assert "| throwaway | shift=0.25 | 1     | 50.0  |" in frontier.format_table([row], [("acc", "acc %", 1, 100.0)])


def test_registering_checks_the_record():
    from exploration_trl.trainers import ExplorationGRPOTrainer

    from exploration_trl.trainers.strategy import LossStrategy

    info = methods.method_info("casp")
    config = methods.METHODS["casp"][1]
    with pytest.raises(ValueError, match="method name 'casp' is already registered"):
        methods.register_method(info)(type("OtherCaSP", (LossStrategy,), {"config_class": config}))
    # A trainer class registered directly (the 0.7 form) is refused for any method that changes something
    new = methods.MethodInfo(**{**info.__dict__, "name": "trainerform"})
    with pytest.raises(ValueError, match=r"method 'trainerform': TrainerForm is not a strategy; register an "
                                         r"AdvantageStrategy or LossStrategy subclass"):
        methods.register_method(new)(type("TrainerForm", (ExplorationGRPOTrainer,), {"config_class": config}))
    assert "trainerform" not in methods.METHODS
    with pytest.raises(ValueError, match="side is 'both'; choose one of none, advantage, loss"):
        methods.register_method(methods.MethodInfo(**{**info.__dict__, "name": "x", "side": "both"}))
    with pytest.raises(ValueError, match="must be lower-case letters"):
        methods.register_method(methods.MethodInfo(**{**info.__dict__, "name": "a+b"}))(ExplorationGRPOTrainer)
    assert "a+b" not in methods.METHODS and methods.METHODS["casp"][0].__name__ == "CaSPTrainer"


def test_each_record_matches_its_trainer():
    """What a built-in record says is what its trainer does: it logs metrics under its metric prefixes, its config has
    keys under its config prefixes, and its published setting, its own values and coefficients are keys of its
    config."""
    for name, (trainer, config) in methods.METHODS.items():
        info = methods.method_info(name)
        source = Path(sys.modules[trainer.__module__].__file__).read_text()
        keys = set(config.__dataclass_fields__)
        for prefix in info.metric_prefixes:  # `"casp/forking_frac"`, or the prefix handed to a helper (`"kl_cov"`)
            assert f'"{prefix}' in source or f'"{prefix.rstrip("/")}"' in source, (name, prefix)
        assert all(any(k.startswith(p) for k in keys) for p in info.config_prefixes), name
        assert set(info.published) | set(info.chosen) | set(info.coefficients) <= keys, name
        assert info.side == "none" or info.metric_prefixes, name
