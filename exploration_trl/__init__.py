"""exploration-trl: exploration-preserving RLVR methods for Hugging Face TRL.

Trainer and config classes are imported lazily so that `import exploration_trl` (and the pure
`exploration_trl.core` math) stays cheap and never pulls in TRL until a trainer is used.
"""

__version__ = "0.4.0"  # the one place the version is set (setup.cfg reads it)
#: Where the project lives (setup.cfg's `url`; tests/test_wheel.py checks they agree). Cards link here.
PROJECT_URL = "https://github.com/exploration-trl/exploration-trl"

_LAZY = {
    "ExplorationGRPOConfig": "exploration_trl.trainers.base",
    "ExplorationGRPOTrainer": "exploration_trl.trainers.base",
    "ProGRPOConfig": "exploration_trl.trainers",
    "ProGRPOTrainer": "exploration_trl.trainers",
    "DSGRPOConfig": "exploration_trl.trainers",
    "DSGRPOTrainer": "exploration_trl.trainers",
    "CaSPConfig": "exploration_trl.trainers",
    "CaSPTrainer": "exploration_trl.trainers",
    "KLCovConfig": "exploration_trl.trainers",
    "KLCovTrainer": "exploration_trl.trainers",
    "ClipCovConfig": "exploration_trl.trainers",
    "ClipCovTrainer": "exploration_trl.trainers",
    "PasskConfig": "exploration_trl.trainers",
    "PasskTrainer": "exploration_trl.trainers",
    "PKPOConfig": "exploration_trl.trainers",
    "PKPOTrainer": "exploration_trl.trainers",
    "UnlikelyConfig": "exploration_trl.trainers",
    "UnlikelyTrainer": "exploration_trl.trainers",
    "get_trainer_class": "exploration_trl.trainers",
    "get_config_class": "exploration_trl.trainers",
    "METHODS": "exploration_trl.trainers",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'exploration_trl' has no attribute {name!r}")
