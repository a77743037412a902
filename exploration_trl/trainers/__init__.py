"""Trainers: `ExplorationGRPOTrainer` (TRL GRPO + the methods' hooks) and one config+trainer pair per method.

Each method's module registers its strategy with `@register_method(MethodInfo(...))` (`exploration_trl.methods`) when
it is imported, and defines its public trainer, a thin class that binds it (`method = "<name>"`). The built-in methods are imported below in the order `train --help`, errors and cards list them; every
other module of this folder is imported after them, so a new method's module registers without a line here
(`docs/writing_a_method.md`).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch
from .progrpo import ProGRPOConfig, ProGRPOTrainer
from .dsgrpo import DSGRPOConfig, DSGRPOTrainer
from .casp import CaSPConfig, CaSPTrainer
from .cov import ClipCovConfig, ClipCovTrainer, KLCovConfig, KLCovTrainer
from .passk import PasskConfig, PasskTrainer, PKPOConfig, PKPOTrainer, UnlikelyConfig, UnlikelyTrainer
from .maxrl import MaxRLConfig, MaxRLTrainer
from .wreinforce import WReinforceConfig, WReinforceTrainer
from .qae import QAEConfig, QAETrainer
from .entropy_adv import EntropyAdvConfig, EntropyAdvTrainer
from .outcome_explore import OutcomeExploreConfig, OutcomeExploreTrainer
from .registry import METHODS, get_config_class, get_trainer_class, parse_method
from .. import methods as _methods
from ..methods import MethodInfo, Paper, arxiv_paper, register_method


def _thin_trainer(name: str) -> type:
    """The public trainer of a strategy that no class binds (e.g. one registered from a notebook)."""
    strategy = _methods.strategy_of(name)
    return type(f"{strategy.__name__.removesuffix('Trainer')}Trainer", (ExplorationGRPOTrainer,),
                {"method": name, "__module__": strategy.__module__})


_methods._TRAINER_FACTORY = _thin_trainer

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "ProGRPOConfig", "ProGRPOTrainer",
    "DSGRPOConfig", "DSGRPOTrainer", "CaSPConfig", "CaSPTrainer", "KLCovConfig", "KLCovTrainer",
    "ClipCovConfig", "ClipCovTrainer", "PasskConfig", "PasskTrainer", "PKPOConfig", "PKPOTrainer", "UnlikelyConfig",
    "UnlikelyTrainer", "METHODS", "get_trainer_class", "get_config_class", "parse_method", "MethodInfo", "Paper",
    "arxiv_paper", "register_method",
]

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_module.name}")

# Every registered method's trainer and config is importable from here (and as `exploration_trl.<Name>`), those of
# a method module added to this folder included.
for _trainer_cls, _config_cls in list(METHODS.values()):
    for _cls in (_trainer_cls, _config_cls):
        globals().setdefault(_cls.__name__, _cls)
        if _cls.__name__ not in __all__:
            __all__.append(_cls.__name__)
