"""How a trainer is assembled (issue 45): a method is a strategy held by one thin class, concerns are components, and
one module adapts TRL. Each test names what broke the rule."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import warnings
from pathlib import Path

import pytest
from trl import GRPOTrainer

import exploration_trl
from exploration_trl import methods
from exploration_trl.trainers import ExplorationGRPOTrainer, get_trainer_class
from exploration_trl.trainers.registry import ADVANTAGE_SIDE, LOSS_SIDE

PACKAGE = Path(exploration_trl.__file__).parent
ADAPTER = PACKAGE / "trainers" / "base.py"


def _every_method_and_composition() -> list[str]:
    return list(methods.METHODS) + [f"{a}+{b}" for a in ADVANTAGE_SIDE for b in LOSS_SIDE]


def test_at_most_two_classes_between_a_method_and_trl():
    for method in _every_method_and_composition():
        mro = get_trainer_class(method).__mro__
        between = mro[:mro.index(GRPOTrainer)]
        assert len(between) <= 2 and between[-1] is ExplorationGRPOTrainer, (method, [c.__name__ for c in between])


def test_a_composition_inherits_nothing_of_its_methods():
    cls = get_trainer_class("progrpo+casp")
    assert cls.__bases__ == (ExplorationGRPOTrainer,) and cls.method == "progrpo+casp"
    assert set(cls.__dict__) <= {"method", "method_parts", "method_name", "config_class", "__module__", "__doc__"}


def _package_classes() -> list[type]:
    for module in pkgutil.walk_packages(exploration_trl.__path__, "exploration_trl."):
        framework = module.name.removeprefix("exploration_trl.integrations.")
        if framework != module.name and importlib.util.find_spec(framework) is None:
            continue  # a front end for a framework this environment lacks (verl: .venv-verl), which it imports
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    from exploration_trl.trainers.base import cpu_generation_class

    cpu_generation_class()  # defined on first use (it subclasses TRL's vLLM engine)
    seen: set[type] = set()
    todo = [object]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return [c for c in seen if isinstance(c.__module__, str) and c.__module__.startswith("exploration_trl.")]


#: A custom `PreTrainedModel` must define these (transformers' "Customizing models" guide): the tabular policy of
#: `experiments/tabular.py` is a model, not a trainer, and adapts nothing of TRL's or the Trainer's behaviour.
MODEL_DEFINITION_HOOKS = {"_init_weights", "_no_split_modules", "_supports_default_dynamic_cache"}


def test_one_module_overrides_private_methods_of_trl_or_transformers():
    owners: dict[str, list[str]] = {}
    for cls in _package_classes():
        for base in cls.__mro__[1:]:
            if not str(base.__module__).startswith(("trl", "transformers", "accelerate")):
                continue
            for name in cls.__dict__:
                if (name.startswith("_") and not name.startswith("__") and hasattr(base, name)
                        and name not in MODEL_DEFINITION_HOOKS):
                    owners.setdefault(cls.__module__, []).append(f"{cls.__qualname__}.{name}")
    assert set(owners) == {"exploration_trl.trainers.base"}, owners
    assert "ExplorationGRPOTrainer._generate_and_score_completions" in owners["exploration_trl.trainers.base"]


def _trl_private_attributes() -> set[str]:
    """Every private attribute TRL's GRPOTrainer or transformers' Trainer sets on itself."""
    import transformers.trainer
    import trl.trainer.grpo_trainer

    names: set[str] = set()
    for module in (trl.trainer.grpo_trainer, transformers.trainer):
        names |= set(re.findall(r"self\.(_[a-z][a-z0-9_]*)\s*=", inspect.getsource(module)))
    return names


def test_only_the_adapter_reads_trls_private_attributes():
    private = _trl_private_attributes()
    assert {"_metrics", "_step", "_buffered_inputs", "_logs"} <= private  # the ones 0.7 read in many places
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == ADAPTER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert reads == []


def test_no_warned_flags():
    found = [f"{p.relative_to(PACKAGE)}" for p in PACKAGE.rglob("*.py") if "_warned_" in p.read_text(encoding="utf-8")]
    assert found == []


def test_building_a_trainer_patches_nothing_process_wide(tmp_path):
    """The warnings filter and accelerate's DeepSpeed check are scoped to the calls that need them."""
    from accelerate.utils import other

    from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

    cls = get_trainer_class("casp")
    ckpt = toy_checkpoint(tmp_path / "ckpt")
    filters, deepspeed_check = list(warnings.filters), other.is_deepspeed_available
    trainer = cls(model=ckpt, reward_funcs=letter_reward, train_dataset=toy_dataset(),
                  args=cls.config_class(**grpo_kwargs(tmp_path / "out", max_steps=1)))
    assert warnings.filters == filters and other.is_deepspeed_available is deepspeed_check
    trainer.train()
    assert warnings.filters == filters and other.is_deepspeed_available is deepspeed_check


def test_a_method_string_is_parsed_once_from_the_class_to_the_card(tmp_path, monkeypatch):
    """get_trainer_class parses it; the trainer's strategies and its card read the class's `method_parts`."""
    from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

    calls = []
    original = methods.parse_method
    monkeypatch.setattr(methods, "parse_method", lambda method: calls.append(method) or original(method))
    from exploration_trl.trainers import registry

    monkeypatch.setattr(registry, "parse_method", methods.parse_method)
    cls = get_trainer_class("kl_cov+progrpo")
    assert calls == ["kl_cov+progrpo"] and cls.method_parts == ("progrpo", "kl_cov")
    trainer = cls(model=toy_checkpoint(tmp_path / "ckpt"), reward_funcs=letter_reward, train_dataset=toy_dataset(),
                  args=cls.config_class(**grpo_kwargs(tmp_path / "out", max_steps=1)))
    assert [s.name for s in trainer.strategies] == ["progrpo", "kl_cov"]
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "The trainer is `ProGRPOKLCovTrainer` from" in card
    assert calls == ["kl_cov+progrpo"] and ExplorationGRPOTrainer.method_parts == ()  # GRPO: no strategy


def test_writing_a_card_parses_the_method_string_once(tmp_path, monkeypatch):
    from exploration_trl.hub import write_model_card
    from exploration_trl.toy import build_toy, save_toy

    config = get_trainer_class("progrpo+casp").config_class(output_dir="unused", use_cpu=True, report_to=[],
                                                             ppl_shaping_alpha=0.1)
    folder = save_toy(*build_toy("abc", seed=0), tmp_path / "model")
    calls = []
    original = methods.parse_method
    monkeypatch.setattr(methods, "parse_method", lambda method: calls.append(method) or original(method))
    card = write_model_card(folder, "casp+progrpo", "Qwen/Qwen2.5-0.5B-Instruct", training_args=config).read_text()
    assert "The trainer is `ProGRPOCaSPTrainer` from" in card and "`casp_alpha`" in card  # it read the records
    assert calls == ["casp+progrpo"]


def test_a_strategy_registered_outside_the_package_trains_and_composes(tmp_path):
    """The strategy form end to end, from a module of the user's own: registered, bound by a thin class built for
    it, composed with a loss-side method, and acting on every step (its hook is checked)."""
    from dataclasses import dataclass, field

    from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

    from exploration_trl.trainers.config import ExplorationGRPOConfig
    from exploration_trl.trainers.strategy import AdvantageStrategy

    @dataclass
    class HalveConfig(ExplorationGRPOConfig):
        halve_factor: float = field(default=0.5, metadata={"help": "Multiplies every advantage."})

    seen = []

    @methods.register_method(methods.MethodInfo(
        name="halve", side="advantage", display="Halve", summary="Halve: every advantage times a factor",
        description="Scales every advantage.",
        paper=methods.arxiv_paper("doe2099halve", "Halving", "Doe, 2099", ["Jane Doe"], 2099, "9999.99998"),
        config_prefixes=("halve_",), metric_prefixes=("halve/",), coefficients={"halve_factor": 0},
    ))
    class Halve(AdvantageStrategy):
        config_class = HalveConfig

        def advantages(self, batch, advantages):
            seen.append(advantages)
            self.trainer.queue_metrics({"halve/factor": (self.args.halve_factor, 1.0)})
            return advantages * self.args.halve_factor

    try:
        cls = get_trainer_class("halve")
        assert cls.__name__ == "HalveTrainer" and cls.config_class is HalveConfig and cls.hook == ("advantage", "halve")
        composed = get_trainer_class("halve+kl_cov")
        assert composed.__name__ == "HalveKLCovTrainer"
        ckpt = toy_checkpoint(tmp_path / "ckpt")
        trainer = composed(model=ckpt, reward_funcs=letter_reward, train_dataset=toy_dataset(),
                           args=composed.config_class(**grpo_kwargs(tmp_path / "out", max_steps=2, halve_factor=0.25,
                                                                    steps_per_generation=1)))
        trainer.train()
        assert len(seen) == 2 and trainer._expected_hooks("advantage") == ["halve"]
        assert [h["halve/factor"] for h in trainer.state.log_history if "halve/factor" in h] == [0.25, 0.25]
        with pytest.raises(ValueError, match="args is ExplorationGRPOConfig; build args with HalveTrainer.config_class"):
            cls(model=ckpt, reward_funcs=letter_reward, train_dataset=toy_dataset(),
                args=ExplorationGRPOConfig(**grpo_kwargs(tmp_path / "plain", max_steps=1)))
    finally:
        methods.unregister("halve")
