"""exploration-trl: exploration-preserving RLVR methods for Hugging Face TRL.

Trainer and config classes are imported lazily so that `import exploration_trl` (and the pure
`exploration_trl.core` math) stays cheap and never pulls in TRL until a trainer is used.
"""

__version__ = "0.9.0"  # the one place the version is set (setup.cfg reads it)
#: Where the project lives (setup.cfg's `url`; tests/test_wheel.py checks they agree). Cards link here.
PROJECT_URL = "https://github.com/exploration-trl/exploration-trl"

#: Names `import exploration_trl` resolves on first use, from the module that defines them: the base trainer and
#: config, and everything `exploration_trl.trainers` exports (every method's trainer and config, `get_trainer_class`,
#: `get_config_class`, `METHODS`).
_LAZY = {
    "ExplorationGRPOConfig": "exploration_trl.trainers.base",
    "ExplorationGRPOTrainer": "exploration_trl.trainers.base",
}
_TRAINERS = "exploration_trl.trainers"
#: The modules whose import registers the package's own methods: the registry (`exploration_trl.methods`, which sits
#: below them) imports them on its first read. Named here, where names may point at any layer, as those above do.
METHOD_MODULES = ("exploration_trl.trainers.methods",)

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name.endswith(("Trainer", "Config")) or name in ("get_trainer_class", "get_config_class", "METHODS"):
        trainers = importlib.import_module(_TRAINERS)
        if name in trainers.__all__:
            return getattr(trainers, name)
    raise AttributeError(f"module 'exploration_trl' has no attribute {name!r}")
