"""Method registry: names -> (trainer, config) pairs, and composition of one advantage-side method with one
loss-side method (e.g. `method: progrpo+casp`), in the spirit of verl's `core_algos` registry.

Order in which a composed pipeline applies (per generation batch, then per micro-batch):
1. TRL's GRPO advantages (group-normalised rewards);
2. the advantage-side method (ProGRPO, DS-GRPO, Pass@k Training, PKPO or the unlikeliness reward);
3. STILL perplexity shaping, then the STILL position bonus (any config);
4. the loss-side method: CaSP / Clip-Cov change the importance ratio, KL-Cov adds its per-token penalty;
5. TRL's clipped objective and `loss_type` aggregation.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from .base import ExplorationGRPOConfig, ExplorationGRPOTrainer
from .casp import CaSPConfig, CaSPTrainer
from .cov import ClipCovConfig, ClipCovTrainer, KLCovConfig, KLCovTrainer
from .dsgrpo import DSGRPOConfig, DSGRPOTrainer
from .passk import PasskConfig, PasskTrainer, PKPOConfig, PKPOTrainer, UnlikelyConfig, UnlikelyTrainer
from .progrpo import ProGRPOConfig, ProGRPOTrainer

METHODS: dict[str, tuple[type, type]] = {
    "grpo": (ExplorationGRPOTrainer, ExplorationGRPOConfig),
    "progrpo": (ProGRPOTrainer, ProGRPOConfig),
    "dsgrpo": (DSGRPOTrainer, DSGRPOConfig),
    "casp": (CaSPTrainer, CaSPConfig),
    "kl_cov": (KLCovTrainer, KLCovConfig),
    "clip_cov": (ClipCovTrainer, ClipCovConfig),
    "passk": (PasskTrainer, PasskConfig),
    "pkpo": (PKPOTrainer, PKPOConfig),
    "unlikely": (UnlikelyTrainer, UnlikelyConfig),
}
ADVANTAGE_SIDE = ("progrpo", "dsgrpo", "passk", "pkpo", "unlikely")
LOSS_SIDE = ("casp", "kl_cov", "clip_cov")


def parse_method(method: str) -> tuple[str, ...]:
    """Split `'progrpo+casp'` into its parts, checking names and that at most one of each side is used."""
    parts = tuple(p.strip().lower() for p in str(method).split("+") if p.strip())
    allowed = ", ".join(METHODS)
    if not parts:
        raise ValueError(f"method is empty; choose one of: {allowed} (or advantage+loss, e.g. progrpo+casp)")
    for p in parts:
        if p not in METHODS:
            raise ValueError(f"unknown method '{p}'; choose one of: {allowed} (or advantage+loss, e.g. progrpo+casp)")
    if len(parts) > 1 and "grpo" in parts:
        raise ValueError("method 'grpo' cannot be combined; name the methods to compose, e.g. progrpo+casp")
    adv = [p for p in parts if p in ADVANTAGE_SIDE]
    loss = [p for p in parts if p in LOSS_SIDE]
    if len(adv) > 1 or len(loss) > 1:
        raise ValueError(
            f"method '{method}' combines {len(adv)} advantage-side and {len(loss)} loss-side methods; use at most one "
            f"of {', '.join(ADVANTAGE_SIDE)} and one of {', '.join(LOSS_SIDE)}"
        )
    # Canonical order: advantage side first.
    return tuple(adv + loss) or ("grpo",)


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


@cache
def _compose(parts: tuple[str, ...]) -> tuple[type, type]:
    if len(parts) == 1:
        return METHODS[parts[0]]
    trainers = [METHODS[p][0] for p in parts]
    # Loss-side config first: where both presets change a default (e.g. KL-Cov's no clipping vs ProGRPO's
    # epsilon_high), the loss side wins. Dataclass inheritance alone would let a preset's *inherited* TRL default
    # mask the other preset's override, so the overridden fields are re-declared explicitly.
    configs = [METHODS[p][1] for p in reversed(parts)]
    name = "".join(t.__name__.removesuffix("Trainer") for t in trainers)
    config_cls = dataclasses.dataclass(type(f"{name}Config", tuple(configs), _preset_overrides(configs)))
    trainer_cls = type(
        f"{name}Trainer", tuple(trainers),
        {"config_class": config_cls, "method_name": "+".join(parts), "__module__": __name__},
    )
    return trainer_cls, config_cls


def __getattr__(name: str):
    """Resolve composed class names (e.g. `ProGRPOCaSPConfig`) so pickled training args load in a new process."""
    for adv in ADVANTAGE_SIDE:
        for loss in LOSS_SIDE:
            for cls in _compose((adv, loss)):
                if cls.__name__ == name:
                    return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_trainer_class(method: str) -> type:
    """The trainer class for `method` (`'casp'`, `'progrpo+kl_cov'`, ...); its `config_class` is the config."""
    return _compose(parse_method(method))[0]


def get_config_class(method: str) -> type:
    return _compose(parse_method(method))[1]
