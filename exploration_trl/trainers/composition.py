"""Methods by name: the registered (trainer, config) pairs (`exploration_trl.methods`, filled by each method's
`@register_method`), and the composition of one advantage-side method with one loss-side method (e.g.
`method: progrpo+casp`), in the spirit of verl's `core_algos` registry: a composition names two strategies, which the
trainer holds side by side.

Order in which a composed pipeline applies (per generation batch, then per micro-batch):
1. TRL's GRPO advantages (group-normalised rewards);
2. the advantage-side method (ProGRPO, DS-GRPO, Pass@k Training, PKPO, the unlikeliness reward, ...);
3. STILL perplexity shaping, then the STILL position bonus (any config);
4. the loss-side method: CaSP / Clip-Cov / entropy_adv change what TRL's loss sees, KL-Cov adds a per-token penalty;
5. TRL's clipped objective and `loss_type` aggregation.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from ..methods import (
    ADVANTAGE_SIDE,
    LOSS_SIDE,
    METHODS,
    parse_method,
    records,
    strategy_of,
    trainer_name,
)
from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer

__all__ = ["METHODS", "ADVANTAGE_SIDE", "LOSS_SIDE", "parse_method", "example_composition", "get_trainer_class",
           "get_config_class"]


def example_composition(name: str) -> str:
    """A valid composition that uses method `name`, for messages: `casp` -> `progrpo+casp`."""
    if name in LOSS_SIDE and ADVANTAGE_SIDE:
        return f"{ADVANTAGE_SIDE[0]}+{name}"
    if name in ADVANTAGE_SIDE and LOSS_SIDE:
        return f"{name}+{LOSS_SIDE[0]}"
    return name


def _field_default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _preset_overrides(configs: list[type]) -> dict:
    """Namespace re-declaring every field whose default a preset changed from `ExplorationGRPOConfig`'s."""
    base = ExplorationGRPOConfig.__dataclass_fields__
    annotations, namespace = {}, {"__module__": __name__}
    for cls in reversed(configs):  # later (lower priority) first, so higher priority overwrites
        for name, f in cls.__dataclass_fields__.items():
            if name in base and _field_default(f) == _field_default(base[name]):
                continue
            annotations[name] = f.type
            namespace[name] = dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                metadata=f.metadata) if f.default_factory is not dataclasses.MISSING \
                else dataclasses.field(default=f.default, metadata=f.metadata)
    namespace["__annotations__"] = annotations
    return namespace


def _compose(parts: tuple[str, ...]) -> tuple[type, type]:
    if len(parts) == 1:
        return METHODS[parts[0]]
    return _composed(tuple(strategy_of(p) for p in parts), parts)


@cache
def _composed(registered: tuple[type, ...], parts: tuple[str, ...]) -> tuple[type, type]:
    """The composed (trainer, config) of the registered strategies of the parsed method `parts`, cached by class: a
    re-registered name composes its new class.

    The trainer is a thin class that names the composition (`method = "progrpo+casp"`); the trainer builds its
    strategies from that name, so nothing of the methods is inherited. The class exists because a composition is
    public API: `get_trainer_class("progrpo+casp")` is subclassed like any trainer and named in cards and logs
    (`ProGRPOCaSPTrainer`).
    """
    # Loss-side config first: where both presets change a default (e.g. KL-Cov's no clipping vs ProGRPO's
    # epsilon_high), the loss side wins. Dataclass inheritance alone would let a preset's *inherited* TRL default
    # mask the other preset's override, so the overridden fields are re-declared explicitly.
    configs = [obj.config_class for obj in reversed(registered)]
    method = "+".join(parts)
    name = trainer_name(records(parts)).removesuffix("Trainer")
    namespace = _preset_overrides(configs)
    namespace["__reduce__"] = _reduce_composed_config
    namespace["composed_method"] = method
    config_cls = dataclasses.dataclass(type(f"{name}Config", tuple(configs), namespace))
    trainer_cls = type(f"{name}Trainer", (ExplorationGRPOTrainer,), {
        "method": method, "method_parts": parts, "method_name": method, "config_class": config_cls,
        "__module__": __name__,
        "__doc__": f"TRL's `GRPOTrainer` with {' and '.join(parts)} (`method: {method}`).",
    })
    return trainer_cls, config_cls


def _reduce_composed_config(config):
    """Pickle a composed config by its method name: the class is rebuilt from the registry when it is loaded (e.g.
    `training_args.bin` in a new process), with the instance's fields as they were (no `__post_init__` again)."""
    return _rebuild_composed_config, (type(config).composed_method, dict(config.__dict__))


def _rebuild_composed_config(method: str, fields: dict):
    config_cls = get_config_class(method)
    config = config_cls.__new__(config_cls)
    config.__dict__.update(fields)
    return config


def get_trainer_class(method: str) -> type:
    """The trainer class for `method` (`'casp'`, `'progrpo+kl_cov'`, ...); its `config_class` is the config."""
    return _compose(parse_method(method))[0]


def get_config_class(method: str) -> type:
    return _compose(parse_method(method))[1]
