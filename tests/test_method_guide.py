"""The worked example of `docs/writing_a_method.md` runs as written: its three files (the core function, the method
module, its test) are all a method needs, and the method's own test passes."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from exploration_trl import methods

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing_a_method.md"
FILES = ("exploration_trl/core/weighted_positive.py", "exploration_trl/trainers/methods/weighted_positive.py",
         "tests/test_weighted_positive.py")


def guide_files() -> dict[str, str]:
    """`{path: code}` of the guide's python blocks that start with a `# <path>` line."""
    blocks = re.findall(r"```python\n# (\S+\.py)\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    return dict(blocks)


@pytest.fixture(scope="module")
def example():
    """The guide's files as the modules they name (held in `sys.modules`, nothing written into the package)."""
    import exploration_trl.trainers  # noqa: F401  (the package the method module extends)

    modules = {}
    for path, code in guide_files().items():
        name = path.removesuffix(".py").replace("/", ".")
        module = types.ModuleType(name)
        module.__file__ = str(GUIDE)
        sys.modules[name] = module
        exec(compile(code, f"{GUIDE}: {path}", "exec"), module.__dict__)
        modules[path] = module
    try:
        yield modules
    finally:
        methods.unregister("weighted_positive")
        for path in modules:
            sys.modules.pop(path.removesuffix(".py").replace("/", "."), None)


def test_the_guide_lists_exactly_three_files():
    assert tuple(guide_files()) == FILES
    text = GUIDE.read_text(encoding="utf-8")
    for pattern in ("core/<method>.py", "trainers/methods/<method>.py", "tests/test_<method>.py"):
        assert re.search(rf"\| `(exploration_trl/)?{re.escape(pattern)}` \|", text), pattern


def test_the_method_registers_from_its_module(example, capsys):
    from exploration_trl.cli import main
    from exploration_trl.trainers import get_trainer_class

    trainer = example["exploration_trl/trainers/methods/weighted_positive.py"].WeightedPositiveTrainer
    assert get_trainer_class("weighted_positive") is trainer and trainer.hook == ("advantage", "weighted_positive")
    assert get_trainer_class("weighted_positive+kl_cov").__name__ == "WeightedPositiveKLCovTrainer"
    assert main(["train", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "W-REINFORCE: positive advantages down-weighted, negative ones kept (advantage side)" in help_text


def test_the_methods_own_test_passes(example, tmp_path):
    test_module = example["tests/test_weighted_positive.py"]
    test_module.test_positive_advantages_are_scaled_and_negative_ones_kept()
    test_module.test_weight_one_is_grpo_and_a_smaller_weight_is_not(tmp_path)


def test_the_config_rejects_a_negative_weight(example, tmp_path):
    config = example["exploration_trl/trainers/methods/weighted_positive.py"].WeightedPositiveConfig
    with pytest.raises(ValueError, match="positive_weight is -1"):
        config(output_dir=str(tmp_path), positive_weight=-1.0)
