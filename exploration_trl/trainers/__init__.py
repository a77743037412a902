"""Trainers: `ExplorationGRPOTrainer` (TRL GRPO + the methods' hooks) and one config+trainer pair per method.

The folder has wings, each importing only those below it: `methods/` (one module per method: its strategy, config
and record) stand on the trainer (`base.py`), its vocabulary (`config.py`, `strategy.py`) and its `components/` and
`callbacks/`, which stand on `exploration_trl.boundary` (below this folder), the only place that knows TRL's and
vLLM's internals. `composition.py`
builds the `advantage+loss` trainers. Each method's module registers its strategy with
`@register_method(MethodInfo(...))` (`exploration_trl.methods`) when `methods/` is imported, and defines its public
trainer, a thin class that binds it (`method = "<name>"`); a new method's module registers without a line here
(`docs/writing_a_method.md`).
"""

import sys as _sys
import types as _types

from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch
from . import methods as _method_modules  # noqa: F401  (each method's module registers it and binds its trainer)
from .composition import METHODS, get_config_class, get_trainer_class, parse_method
from .. import methods as _methods
from ..methods import MethodInfo, Paper, arxiv_paper, register_method


def _thin_trainer(name: str) -> type:
    """The public trainer of a strategy that no class binds (e.g. one registered from a notebook)."""
    strategy = _methods.strategy_of(name)
    return type(f"{strategy.__name__.removesuffix('Trainer')}Trainer", (ExplorationGRPOTrainer,),
                {"method": name, "__module__": strategy.__module__})


_methods.set_trainer_factory(_thin_trainer)

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "METHODS", "get_trainer_class",
    "get_config_class", "parse_method", "MethodInfo", "Paper", "arxiv_paper", "register_method",
]


# Every registered method's trainer and config is importable from here (and as `exploration_trl.<Name>`), read from
# the registry: a method module added to `methods/` needs no line here.
for _trainer_cls, _config_cls in list(METHODS.values()):
    for _cls in (_trainer_cls, _config_cls):
        globals().setdefault(_cls.__name__, _cls)
        if _cls.__name__ not in __all__:
            __all__.append(_cls.__name__)


#: The release that drops the 0.8 stand-in modules below (announced in the CHANGELOG; a test fails from it on).
PICKLED_PATHS_REMOVED_IN = "1.0.0"


def _keep_pickled_paths() -> None:
    """A checkpoint's `training_args.bin` pickles its config class by module path. Until 0.8 the method configs lived
    in `exploration_trl.trainers.<method>` and a composed config pickled as
    `exploration_trl.trainers.registry._rebuild_composed_config`: those paths still name the same objects (and only
    those), so such a checkpoint loads and resumes, until `PICKLED_PATHS_REMOVED_IN`."""
    from . import composition, methods
    from .config import ExplorationGRPOConfig

    for name in ("progrpo", "dsgrpo", "casp", "cov", "passk", "maxrl", "wreinforce", "qae", "entropy_adv",
                 "outcome_explore"):
        module = getattr(methods, name)
        configs = {key: value for key, value in vars(module).items() if isinstance(value, type)
                   and issubclass(value, ExplorationGRPOConfig) and value.__module__ == module.__name__}
        _pickled_path(name, module.__name__, configs)
    _pickled_path("registry", composition.__name__,
                  {"_rebuild_composed_config": composition._rebuild_composed_config})


def _pickled_path(old: str, new: str, names: dict) -> None:
    """A stand-in module at the 0.8 path `old` holding `names` only; any other name read from it fails loudly with
    where it lives now (a dynamic `import_module` of the old path would otherwise find a half-empty module)."""
    module = _types.ModuleType(f"{__name__}.{old}", f"The 0.8 path of what {new} defines now, for old pickles.")
    vars(module).update(names)

    def moved(name: str):
        raise AttributeError(f"{module.__name__} is only kept so that 0.8 checkpoints load; {name!r} is not there: "
                             f"import it from {new}")

    module.__getattr__ = moved
    _sys.modules.setdefault(module.__name__, module)


_keep_pickled_paths()
