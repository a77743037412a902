"""How a trainer is assembled (issues 45 and 54): a method is a strategy held by one thin class, concerns are
components, and one package below `trainers/` and `eval/`, the boundary (`exploration_trl/boundary/`), adapts TRL and
vLLM. Each test names what broke the rule."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
import warnings
from pathlib import Path

import pytest
from trl import GRPOTrainer

import exploration_trl
from exploration_trl import methods
from exploration_trl.trainers import ExplorationGRPOTrainer, get_trainer_class
from exploration_trl.boundary.trl_adapter import TRLAdapter
from exploration_trl.trainers.composition import ADVANTAGE_SIDE, LOSS_SIDE

PACKAGE = Path(exploration_trl.__file__).parent
BOUNDARY = PACKAGE / "boundary"


def _every_method_and_composition() -> list[str]:
    return list(methods.METHODS) + [f"{a}+{b}" for a in ADVANTAGE_SIDE for b in LOSS_SIDE]


def test_at_most_two_classes_between_a_method_and_trl():
    for method in _every_method_and_composition():
        mro = get_trainer_class(method).__mro__
        between = mro[1:mro.index(GRPOTrainer)]  # the public class, then what stands between it and TRL's
        assert len(between) <= 2 and between[-1] is TRLAdapter, (method, [c.__name__ for c in between])
        assert ExplorationGRPOTrainer in mro


def test_a_composition_inherits_nothing_of_its_methods():
    cls = get_trainer_class("progrpo+casp")
    assert cls.__bases__ == (ExplorationGRPOTrainer,) and cls.method == "progrpo+casp"
    abc_bookkeeping = {"__abstractmethods__", "_abc_impl"}  # `abc` writes these on every class of `TrainerSteps`
    assert set(cls.__dict__) - abc_bookkeeping <= {"method", "method_parts", "method_name", "config_class",
                                                   "__module__", "__doc__"}


def _package_classes() -> list[type]:
    for module in pkgutil.walk_packages(exploration_trl.__path__, "exploration_trl."):
        framework = module.name.removeprefix("exploration_trl.integrations.")
        if framework != module.name and importlib.util.find_spec(framework) is None:
            continue  # a front end for a framework this environment lacks (verl: .venv-verl), which it imports
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    from exploration_trl.boundary.vllm_support import cpu_generation_class

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
#: `experiments/research/tabular.py` is a model, not a trainer, and adapts nothing of TRL's or the Trainer's behaviour.
MODEL_DEFINITION_HOOKS = {"_init_weights", "_no_split_modules", "_supports_default_dynamic_cache"}


def test_only_the_boundary_overrides_private_methods_of_trl_or_transformers():
    """Every override of a private method of TRL, transformers or accelerate is written in `boundary/` (the
    trainer's base, `TRLAdapter`, holds TRL's)."""

    owners: dict[str, list[str]] = {}
    for cls in _package_classes():
        for base in cls.__mro__[1:]:
            if not str(base.__module__).startswith(("trl", "transformers", "accelerate")):
                continue
            for name, value in vars(cls).items():
                if (name.startswith("_") and not name.startswith("__") and hasattr(base, name)
                        and name not in MODEL_DEFINITION_HOOKS):
                    owners.setdefault(getattr(value, "__module__", cls.__module__), []).append(
                        f"{cls.__qualname__}.{name}")
    assert all(module.startswith("exploration_trl.boundary.") for module in owners), owners
    assert "TRLAdapter._generate_and_score_completions" in owners[TRLAdapter.__module__]


def _trl_private_attributes() -> set[str]:
    """Every private attribute TRL's GRPOTrainer or transformers' Trainer sets on itself."""
    import transformers.trainer
    import trl.trainer.grpo_trainer

    names: set[str] = set()
    for module in (trl.trainer.grpo_trainer, transformers.trainer):
        names |= set(re.findall(r"self\.(_[a-z][a-z0-9_]*)\s*=", inspect.getsource(module)))
    return names


def _outside_the_boundary() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if BOUNDARY not in path.parents]


def test_only_the_boundary_reads_trls_private_attributes():
    private = _trl_private_attributes()
    assert {"_metrics", "_step", "_buffered_inputs", "_logs"} <= private  # the ones 0.7 read in many places
    reads = []
    for path in _outside_the_boundary():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
            # By name too: getattr(trainer, "_metrics"), hasattr, setattr.
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in private):
                reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id} {node.args[1].value}")
    assert reads == []


#: What the boundary patches of accelerate (`deepspeed_import.py`: `accelerate.utils.other.is_deepspeed_available`)
#: and DeepSpeed itself, which only the boundary decides when to import.
PATCHED = ("accelerate.utils.other", "deepspeed")


def _public_trl_names() -> set[str]:
    import types

    import trl

    return {name for name in trl.__all__ if not isinstance(getattr(trl, name), types.ModuleType)}


def _trl_private_methods() -> set[str]:
    return {name for name in dir(GRPOTrainer) if name.startswith("_") and not name.startswith("__")}


def boundary_violations(root: Path) -> list[str]:
    """Where a module under `root` (outside `boundary/`, the package's one boundary) knows TRL's, vLLM's or
    accelerate's internals.

    The rule: outside the boundary a module may import from TRL only TRL's public top-level names (`from trl import
    GRPOConfig, GRPOTrainer`: names in `trl.__all__` that are no submodule; no `import trl`, no `trl.<submodule>`);
    it imports no vLLM (the evaluation harness's engine is the boundary's too), no DeepSpeed and nothing of
    accelerate that the boundary patches (`PATCHED`); and it neither defines nor names (calls, reads, `super()._x`) a
    private method of TRL's `GRPOTrainer` or transformers' `Trainer` (`_generate`, `_compute_loss`, ...)."""
    public_trl, private_methods = _public_trl_names(), _trl_private_methods()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("boundary/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for module in modules:
                if module == "trl" and isinstance(node, ast.ImportFrom):
                    found += [f"{where} from trl import {a.name}" for a in node.names if a.name not in public_trl]
                elif module == "trl" or module.startswith("trl."):
                    found.append(f"{where} imports {module}")
                elif module == "vllm" or module.startswith("vllm."):
                    found.append(f"{where} imports {module}")
                elif any(module == p or module.startswith(p + ".") for p in PATCHED):
                    found.append(f"{where} imports {module}")
                elif module == "accelerate.utils" and any(a.name == "other" for a in node.names):
                    found.append(f"{where} imports accelerate.utils.other")
            if isinstance(node, ast.Attribute) and node.attr in private_methods:
                found.append(f"{where} names TRL's .{node.attr}")
            if isinstance(node, ast.ClassDef):
                found += [f"{rel}:{f.lineno} overrides TRL's {node.name}.{f.name}" for f in node.body
                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in private_methods
                          and f.name not in MODEL_DEFINITION_HOOKS]
    return found


def test_only_the_boundary_knows_trl_internals():
    assert boundary_violations(PACKAGE) == []


def test_the_boundary_check_sees_a_violation(tmp_path):
    """The checker itself, on planted modules: each kind of violation is reported, the boundary's own are not (nor
    is the old place of the boundary, `trainers/boundary/`, nor the evaluation harness, an exception any more)."""
    for folder in ("boundary", "trainers/boundary", "eval"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "boundary" / "adapter.py").write_text("from trl.trainer.utils import RepeatSampler\nimport vllm\n")
    (tmp_path / "boundary" / "vllm_offline.py").write_text("def start():\n    from vllm import LLM, SamplingParams\n")
    (tmp_path / "trainers" / "boundary" / "adapter.py").write_text("from trl.trainer.utils import RepeatSampler\n")
    (tmp_path / "eval" / "generation.py").write_text("def sample():\n    from vllm import SamplingParams\n")
    (tmp_path / "vllm_engine.py").write_text("import vllm.platforms as platforms\n")
    (tmp_path / "trainers" / "component.py").write_text(
        "from trl import GRPOTrainer, GRPOConfig\n"
        "from trl.models import unwrap_model_for_generation\n"
        "from trl import trainer\n"
        "def f():\n    import vllm.platforms\n    from accelerate.utils import other\n    import deepspeed\n"
        "class Hooked(GRPOTrainer):\n    def _generate(self, prompts):\n        return super()._generate(prompts)\n"
        "    def step(self):\n        return self._get_per_token_logps_and_entropies\n")
    found = boundary_violations(tmp_path)
    assert sorted(line.split(" ", 1)[1] for line in found) == sorted([
        "imports trl.models", "from trl import trainer", "imports vllm.platforms", "imports accelerate.utils.other",
        "imports deepspeed", "overrides TRL's Hooked._generate", "names TRL's ._generate",
        "names TRL's ._get_per_token_logps_and_entropies", "imports trl.trainer.utils", "imports vllm",
        "imports vllm.platforms",
    ]), found
    assert {line.split(":")[0] for line in found} == {
        "trainers/component.py", "trainers/boundary/adapter.py", "eval/generation.py", "vllm_engine.py"}, found


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
    from exploration_trl.trainers import composition

    monkeypatch.setattr(composition, "parse_method", methods.parse_method)
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
            self.ctx.queue_metrics({"halve/factor": (self.args.halve_factor, 1.0)})
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


def test_a_config_pickled_under_its_0_8_path_loads(tmp_path):
    """A checkpoint's `training_args.bin` pickles its config class by module path. 0.8 wrote a method's config as
    `exploration_trl.trainers.<method>.<Name>Config` and a composed one through
    `exploration_trl.trainers.registry._rebuild_composed_config`; such a file still loads, into today's classes."""
    import pickle

    from exploration_trl.trainers import ProGRPOConfig, composition

    config = ProGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], progrpo_alpha=0.5)
    new_module = ProGRPOConfig.__module__
    ProGRPOConfig.__module__ = "exploration_trl.trainers.progrpo"  # as 0.8 pickled it
    try:
        old = pickle.dumps(config)
    finally:
        ProGRPOConfig.__module__ = new_module
    assert b"exploration_trl.trainers.progrpo" in old and b"exploration_trl.trainers.methods" not in old
    loaded = pickle.loads(old)
    assert type(loaded) is ProGRPOConfig and loaded.progrpo_alpha == 0.5

    composed = get_trainer_class("progrpo+casp").config_class(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    rebuild = composition._rebuild_composed_config
    rebuild.__module__ = "exploration_trl.trainers.registry"
    try:
        old = pickle.dumps(composed)
    finally:
        rebuild.__module__ = composition.__name__
    assert b"exploration_trl.trainers.registry" in old
    assert type(pickle.loads(old)) is type(composed)


def _context_members() -> set[str]:
    from exploration_trl.trainers.context import MethodContext

    return {name for name in dir(MethodContext) if not name.startswith("_")}


def context_violations(methods_dir: Path) -> list[str]:
    """Where a method module reaches past its `MethodContext`: it names a trainer (`trainer`, `.trainer`), or reads
    from the context (`ctx.x`, `self.ctx.x`) a member the context does not declare in public."""
    members, found = _context_members(), []
    for path in sorted(methods_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if (isinstance(node, ast.Name) and node.id == "trainer"
                    or isinstance(node, ast.arg) and node.arg == "trainer"):
                found.append(f"{where} names trainer")
            elif isinstance(node, ast.Attribute) and node.attr == "trainer":
                found.append(f"{where} reads .trainer")
            elif isinstance(node, ast.Attribute):
                value = node.value
                on_ctx = (isinstance(value, ast.Name) and value.id == "ctx"
                          or isinstance(value, ast.Attribute) and value.attr == "ctx")
                if on_ctx and node.attr not in members:
                    found.append(f"{where} reads ctx.{node.attr}")
    return found


def test_a_method_sees_only_its_context():
    """Item 3 of the fifth architecture pass: a strategy reads its run through `MethodContext` only."""
    methods_dir = PACKAGE / "trainers" / "methods"
    assert len(list(methods_dir.glob("*.py"))) >= 12
    assert context_violations(methods_dir) == []


def test_the_context_check_sees_a_violation(tmp_path):
    (tmp_path / "planted.py").write_text(
        "class S:\n"
        "    def __init__(self, trainer):\n"
        "        self.n = trainer.accelerator.num_processes\n"
        "    def advantages(self, batch, advantages):\n"
        "        ctx = self.ctx\n"
        "        ctx.queue_metrics({})\n"
        "        mask = ctx._trainer._loss_mask(batch)\n"
        "        return self.trainer.args, self.ctx.rollout_buffer()\n")
    found = context_violations(tmp_path)
    assert sorted(line.split(" ", 1)[1] for line in found) == sorted([
        "names trainer", "names trainer", "reads ctx._trainer", "reads .trainer", "reads ctx.rollout_buffer",
    ]), found


def test_a_strategy_has_no_trainer_attribute():
    from exploration_trl.trainers.methods.progrpo import ProGRPO

    with pytest.raises(AttributeError, match=r"ProGRPO\.trainer: a strategy no longer holds its trainer .* self\.ctx"):
        _ = ProGRPO(ctx=None).trainer


def test_a_0_8_path_names_where_anything_else_moved():
    """The 0.8-path stand-ins hold the config classes only; any other name fails with the new module's path."""
    import importlib

    old = importlib.import_module("exploration_trl.trainers.passk")
    assert old.PasskConfig is importlib.import_module("exploration_trl.trainers.methods.passk").PasskConfig
    with pytest.raises(AttributeError, match=r"exploration_trl\.trainers\.passk is only kept so that 0\.8 checkpoints "
                                             r"load; 'Passk' is not there: import it from "
                                             r"exploration_trl\.trainers\.methods\.passk"):
        _ = old.Passk


def test_the_0_8_stand_in_modules_go_in_the_release_the_changelog_announces():
    """The 0.8 pickle paths are kept until `PICKLED_PATHS_REMOVED_IN`: from that version on this fails until they go."""
    from packaging.version import Version

    import exploration_trl
    from exploration_trl import trainers

    changelog = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()
    assert f"keep 0.8 checkpoints loading go in {trainers.PICKLED_PATHS_REMOVED_IN}" in changelog
    assert "exploration_trl.trainers.registry" in sys.modules  # the stand-ins are there today
    assert Version(exploration_trl.__version__) < Version(trainers.PICKLED_PATHS_REMOVED_IN), (
        "remove trainers._keep_pickled_paths and its stand-in modules: their announced release has come")


# ----------------------------------------------------------------------------------- private names (issue 64, item 5)
def _room(module: str) -> str:
    """A module's room: the package directly under `exploration_trl` (`trainers`, `core`, ...), or the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "exploration_trl"


def private_imports_across_rooms(root: Path, package: str = "exploration_trl") -> list[str]:
    """`path:line names` of every import, at the top or inside a function, of a `_`-name (a module or an attribute;
    not a dunder) that lives in another room than the importer's."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        here = ".".join(parts[:-1])  # the importer's package
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if not target.startswith(f"{package}."):
                    continue
                names = target.split(".")
                private = next((i for i, n in enumerate(names) if n.startswith("_") and not n.startswith("__")), None)
                owner = ".".join(names[:private + 1]) if private is not None else None
                if owner and _room(owner) != _room(module):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {target}")
    return found


def test_no_private_name_is_imported_across_rooms():
    assert private_imports_across_rooms(PACKAGE) == []


def test_the_private_import_check_sees_a_violation(tmp_path):
    for folder in ("core", "trainers/methods", "rewards"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "core" / "_utils.py").write_text("def masked_sum(x):\n    return x\n")
    (tmp_path / "core" / "losses.py").write_text("from ._utils import masked_sum\n")  # the same room: fine
    (tmp_path / "rewards" / "base.py").write_text("def _grade(x):\n    return x\n")
    (tmp_path / "trainers" / "methods" / "m.py").write_text(
        "from ...core._utils import masked_sum\nfrom exploration_trl.rewards.base import _grade\n"
        "def f():\n    import exploration_trl.core._utils\n    from ...rewards import base, __doc__\n")
    assert private_imports_across_rooms(tmp_path) == [
        "trainers/methods/m.py:1 exploration_trl.core._utils.masked_sum",
        "trainers/methods/m.py:2 exploration_trl.rewards.base._grade",
        "trainers/methods/m.py:4 exploration_trl.core._utils",
    ]


# ------------------------------------------------------------------------------- the registry (issue 64, item 4)
def test_the_registry_is_complete_whatever_is_imported_first():
    """A fresh process that reads the registry before anything imports the trainers sees every built-in method, in
    the order the trainers register them, and can build a trainer from it (the entry point in setup.cfg)."""
    import subprocess

    code = ("import sys\nfrom exploration_trl.methods import ADVANTAGE_SIDE, METHODS, method_info\n"
            "assert 'exploration_trl.trainers' not in sys.modules\n"
            "print(','.join(METHODS)); print(','.join(ADVANTAGE_SIDE)); print(method_info('casp').display)\n"
            "print(METHODS['casp'][0].__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    names, advantage, casp, trainer = out.stdout.split("\n")[:4]
    assert names.split(",") == list(methods.METHODS) and advantage.split(",") == list(ADVANTAGE_SIDE)
    assert casp == methods.method_info("casp").display and trainer == "CaSPTrainer"


def test_a_method_module_that_fails_to_import_is_named(monkeypatch):
    """An entry point of another package whose module does not import: one error naming the module and the entry
    point (the package's own modules are loaded already and are not imported again)."""
    from importlib.metadata import EntryPoint

    declared = EntryPoint(name="mine", value="my_package_that_is_not_installed.methods", group="exploration_trl.methods")
    monkeypatch.setattr(methods, "_MODULES", None)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [declared])
    with pytest.raises(ImportError, match=r"^the method module my_package_that_is_not_installed\.methods \(entry "
                                          r"point 'mine' of exploration_trl\.methods\) failed to import: "
                                          r"ModuleNotFoundError: No module named 'my_package_that_is_not_installed'$"):
        list(methods.METHODS)


# ------------------------------------------------------------------ the boundary's calls up (issue 64, item 1)
#: The names the boundary uses for the trainer it serves: `self` inside `TRLAdapter`, else these.
_TRAINER_NAMES = {"trainer", "t"}


def reads_through(tree: ast.AST, member: str, names: tuple[str, ...] | set[str]) -> list[tuple[int, str]]:
    """`(line, name)` of every attribute read or set through a holder: `self.<member>.X`, or `X` of a local named one
    of `names` (the boundary's trainer, a component's view)."""
    def through(holder: ast.AST) -> bool:
        if isinstance(holder, ast.Attribute):
            return holder.attr == member and getattr(holder.value, "id", "") == "self"
        return isinstance(holder, ast.Name) and holder.id in names

    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and through(node.value)]


def _trainer_reads(path: Path) -> list[tuple[int, str]]:
    """`(line, name)` of every attribute a boundary module reads or writes on the trainer."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") in ("GRPOTrainer", "TrainerSteps")
                                                  for b in node.bases):
            found += [(n.lineno, n.attr) for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "self"]
    return found + reads_through(tree, "trainer", _TRAINER_NAMES)


def _package_trainer_names(trainers_dir: Path) -> set[str]:
    """What `trainers/` adds to a trainer: its classes' members and what their methods set on `self`."""
    names = set()
    for path in trainers_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and "Trainer" in node.name:
                names |= {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                names |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                          if isinstance(t, ast.Name)}
                names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                          and getattr(n.value, "id", "") == "self"}
    return names


def calls_up_outside_trainer_steps(boundary: Path, trainers_dir: Path) -> list[str]:
    """`path:line name` of every member of the package's trainer a boundary module uses that `TrainerSteps` does not
    declare (TRL's own members and the boundary's are fine)."""
    from exploration_trl.boundary.steps import TrainerSteps

    declared = set(TrainerSteps.__abstractmethods__)
    boundary_own = {name for cls in (TRLAdapter,) for name in vars(cls)} | set(TRLAdapter.__annotations__)
    package = _package_trainer_names(trainers_dir) - boundary_own - set(dir(GRPOTrainer))
    return [f"{path.relative_to(boundary.parent)}:{line} {name}" for path in sorted(boundary.rglob("*.py"))
            for line, name in sorted(set(_trainer_reads(path))) if name in package and name not in declared]


def test_the_boundary_calls_up_only_through_trainer_steps():
    """Everything the boundary asks of `ExplorationGRPOTrainer` is one abstract method of `boundary.steps.TrainerSteps`
    (or the boundary's own member, or TRL's): no component, strategy or private step is reached from below."""
    assert calls_up_outside_trainer_steps(BOUNDARY, PACKAGE / "trainers") == []
    assert not ExplorationGRPOTrainer.__abstractmethods__  # the trainer writes every declared step


def test_only_the_adapter_writes_its_state():
    own = set(TRLAdapter.__annotations__)
    assert {"_capture", "_ds_replay", "_loss_inputs", "_loss_state", "lm_head", "vllm"} <= own
    writes = [f"{path.relative_to(PACKAGE)}:{n.lineno} {n.attr}" for path in sorted((PACKAGE / "trainers").rglob("*.py"))
              for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr in own]
    assert writes == []


def test_the_calls_up_check_sees_a_violation(tmp_path):
    (tmp_path / "boundary").mkdir()
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "base.py").write_text(
        "class MyTrainer:\n    def __init__(self):\n        self.rollout = None\n"
        "    def _set_advantages(self, output, capture):\n        return output\n"
        "    def _secret_step(self):\n        pass\n")
    (tmp_path / "boundary" / "adapter.py").write_text(
        "class A(GRPOTrainer):\n    def f(self):\n        self._set_advantages(1, 2)\n        self._secret_step()\n"
        "        self.args\n"
        "class Helper:\n    def g(self):\n        t = self.trainer\n        t.rollout.finish()\n"
        "        self.trainer.rollout\n        t.accelerator\n")
    assert calls_up_outside_trainer_steps(tmp_path / "boundary", tmp_path / "trainers") == [
        "boundary/adapter.py:4 _secret_step", "boundary/adapter.py:9 rollout", "boundary/adapter.py:10 rollout"]


# --------------------------------------------------------- what each component sees (issue 64, item 2)
def _viewed_classes() -> list[type]:
    """Every component and callback that `ExplorationGRPOTrainer` builds with a view of itself."""
    from exploration_trl.trainers.callbacks.correctness_guard import CorrectnessGuard
    from exploration_trl.trainers.callbacks.divergence import DivergenceCallback
    from exploration_trl.trainers.callbacks.entropy_band import EntropyBandController
    from exploration_trl.trainers.components.dynamic_sampling import DynamicSampling
    from exploration_trl.trainers.components.heldout_eval import HeldoutEval
    from exploration_trl.trainers.components.metrics_logging import ExplorationMetrics
    from exploration_trl.trainers.components.resume import Resume
    from exploration_trl.trainers.components.rollout import Rollout

    return [Rollout, DynamicSampling, Resume, ExplorationMetrics, HeldoutEval, CorrectnessGuard, DivergenceCallback,
            EntropyBandController]


def view_reads(path: Path) -> set[str]:
    """The attributes a module reads or sets on its view: `self.view.X`, and `X` of a local `t`/`view`/`trainer`."""
    return {name for _, name in reads_through(ast.parse(path.read_text(encoding="utf-8")), "view",
                                              ("t", "view", "trainer"))}


def test_each_component_declares_exactly_what_it_reads_of_the_trainer():
    """A component's `READS` (and `WRITES`) is the list of what its module's code reads of the trainer, no more and
    no less; the trainer builds it with that view, never with itself (`trainers/view.py`)."""
    for cls in _viewed_classes():
        path = Path(inspect.getsourcefile(cls))
        declared = set(cls.READS) | set(getattr(cls, "WRITES", ()))
        assert view_reads(path) == declared, (cls.__name__, sorted(view_reads(path) ^ declared))
    base = (PACKAGE / "trainers" / "base.py").read_text(encoding="utf-8")
    for cls in _viewed_classes():
        assert f"{cls.__name__}(view_of(self, {cls.__name__})" in base, cls.__name__
        assert f"{cls.__name__}(self" not in base, cls.__name__


def test_a_view_gives_only_what_its_class_declares():
    from types import SimpleNamespace

    from exploration_trl.trainers.components.resume import Resume
    from exploration_trl.trainers.view import view_of

    class Fake:
        READS, WRITES = ("args",), ("entropy_coef",)

    trainer = SimpleNamespace(args="the args", state="the state", entropy_coef=0.0)
    view = view_of(trainer, Fake)
    assert view.args == "the args"
    view.entropy_coef = 0.5
    assert trainer.entropy_coef == 0.5
    with pytest.raises(AttributeError, match=r"^Fake reads only args, entropy_coef of its trainer, not 'state': "
                                             r"add it to Fake\.READS$"):
        view.state
    with pytest.raises(AttributeError, match=r"^Fake may not set 'args' on its trainer: add it to Fake\.WRITES$"):
        view.args = None
    assert "rollout_buffer" in Resume.READS and "model" not in Resume.READS

    class OneName:
        READS = ("args")

    with pytest.raises(TypeError, match=r"^OneName\.READS is the string 'args'; write a tuple: \('args',\)$"):
        view_of(trainer, OneName)
