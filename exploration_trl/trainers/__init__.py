"""Trainers: `ExplorationGRPOTrainer` (TRL GRPO + hooks) and one config+trainer pair per method."""

from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch
from .casp import CaSPConfig, CaSPTrainer
from .cov import ClipCovConfig, ClipCovTrainer, KLCovConfig, KLCovTrainer
from .dsgrpo import DSGRPOConfig, DSGRPOTrainer
from .passk import PasskConfig, PasskTrainer, PKPOConfig, PKPOTrainer, UnlikelyConfig, UnlikelyTrainer
from .progrpo import ProGRPOConfig, ProGRPOTrainer
from .registry import METHODS, get_config_class, get_trainer_class, parse_method

__all__ = [
    "ExplorationGRPOConfig", "ExplorationGRPOTrainer", "RolloutBatch", "ProGRPOConfig", "ProGRPOTrainer",
    "DSGRPOConfig", "DSGRPOTrainer", "CaSPConfig", "CaSPTrainer", "KLCovConfig", "KLCovTrainer",
    "ClipCovConfig", "ClipCovTrainer", "PasskConfig", "PasskTrainer", "PKPOConfig", "PKPOTrainer", "UnlikelyConfig",
    "UnlikelyTrainer", "METHODS", "get_trainer_class", "get_config_class", "parse_method",
]
