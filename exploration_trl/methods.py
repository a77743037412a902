"""The method registry: one record per method (`MethodInfo`), declared once, next to the method's trainer and config.

A method module under `exploration_trl/trainers/` decorates its strategy class with `@register_method(MethodInfo(...))`
(the worked example: `docs/writing_a_method.md`). Every table that lists methods reads this registry: the trainers'
`METHODS` and sides and their composition (`trainers/composition.py`), `exploration-trl train --help`, model cards (the
trainer's name, the method section, the citations, the hyperparameter table) and the experiments' setting labels and
default settings (the sourced values, `published`, and ours, `chosen`, kept apart). `parse_method` is the one parser
of method strings such as `progrpo+casp`.

This module imports nothing from the package but a name of its root, so that every layer may read it, the model
cards below the trainers included (a trainer writes its card). It is complete whatever was imported first: its first
read imports the package's method modules (`exploration_trl.METHOD_MODULES`, named by the package root) and those
other installed packages declare under the entry-point group `exploration_trl.methods`; each registers its methods on
import.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SIDES", "MethodInfo", "Paper", "arxiv_paper", "register_method", "register_shaping", "unregister", "bind_trainer",
    "strategy_of", "trainer_class", "set_trainer_factory", "load_method_modules", "ENTRY_POINT_GROUP",
    "METHODS", "ADVANTAGE_SIDE", "LOSS_SIDE", "method_info", "method_infos", "records", "parse_method", "trainer_name",
    "base_method", "shapings", "registered_papers",
]

#: What a method changes: "advantage" (the advantages, before the loss), "loss" (the per-token loss) or "none" (the
#: plain GRPO trainer every method builds on). One advantage-side and one loss-side method compose.
SIDES = ("none", "advantage", "loss")


@dataclass(frozen=True)
class Paper:
    """A paper as cards cite it."""

    key: str  #: BibTeX key
    title: str
    short: str  #: how the card names it in prose ("Cui et al., 2025")
    url: str
    bibtex: str


def arxiv_paper(key: str, title: str, short: str, authors: Sequence[str], year: int, eprint: str,
                primary: str | None = None) -> Paper:
    """A `Paper` for an arXiv preprint, with its `@misc` BibTeX entry (only fields checked against the listing)."""
    url = f"https://arxiv.org/abs/{eprint}"
    lines = [
        f"@misc{{{key},",
        f"  title         = {{{{{title}}}}},",
        f"  author        = {{{' and '.join(authors)}}},",
        f"  year          = {{{year}}},",
        f"  eprint        = {{{eprint}}},",
        "  archivePrefix = {arXiv},",
    ]
    if primary:
        lines.append(f"  primaryClass  = {{{primary}}},")
    lines += [f"  url           = {{{url}}}", "}"]
    return Paper(key, title, short, url, "\n".join(lines))


@dataclass(frozen=True)
class MethodInfo:
    """Everything outside a method's trainer says about it.

    `coefficients` maps the config keys that set the method's strength to +1 when raising the key raises the policy's
    entropy (the keys the entropy controller may move, `entropy_band_knob`), or 0 when it is not one-signed.
    """

    name: str  #: the `method:` value
    side: str  #: one of `SIDES`; "shaping" for a shaping (`register_shaping`)
    display: str  #: the card's name for it, e.g. "ProGRPO (ARM)"
    summary: str  #: one line for `exploration-trl train --help`
    description: str  #: the card's sentence on what it does
    paper: Paper
    config_prefixes: tuple[str, ...] = ()  #: prefixes of its own config keys (cards, experiment labels)
    metric_prefixes: tuple[str, ...] = ()  #: prefixes of the metrics it logs, e.g. ("casp/",)
    coefficients: Mapping[str, int] = field(default_factory=dict)
    #: Its own keys as a source states them (the paper, or its authors' code or scripts), nothing else: each value and
    #: its source are listed in docs/math.md, "Published settings and their sources" (a test compares the two).
    published: Mapping[str, Any] = field(default_factory=dict)
    #: Our setting of its own keys where no source gives one, or where we keep another value than the source's (QAE's
    #: eps); never a paper's value. Each is listed with its reason in the table that follows the published one in
    #: docs/math.md, "Sources" (a test compares the two); the methods table marks them "(ours)".
    chosen: Mapping[str, Any] = field(default_factory=dict)
    where: str = ""  #: where in the paper, for the methods table: "Eq. 4, Sec. 3.2, Alg. 1"
    changes: str = ""  #: what it changes, for the methods table (Markdown; default: `description`)
    knobs_note: str = ""  #: said after its keys in the methods table, e.g. where other presets live

    def __post_init__(self):
        both = sorted(set(self.published) & set(self.chosen))
        if both:
            raise ValueError(f"method {self.name!r}: {', '.join(both)} both published and chosen; a key is either a "
                             "source's value (published) or ours (chosen)")

    def setting(self) -> dict[str, Any]:
        """Its setting as the experiments run it by default: the sourced values (`published`) completed by ours
        (`chosen`). Tables that show it say which keys are ours."""
        return {**self.published, **self.chosen}


_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
_METHODS: dict[str, tuple[MethodInfo, type]] = {}  # name -> (record, strategy or trainer class), in registration order
_TRAINERS: dict[str, type] = {}  # name -> its public trainer class
_SHAPINGS: dict[str, MethodInfo] = {}
#: Builds the thin trainer class of a strategy that no class binds (`set_trainer_factory`, by the trainers).
_TRAINER_FACTORY = None
#: The entry-point group under which another installed package declares its method modules (docs/writing_a_method.md).
ENTRY_POINT_GROUP = "exploration_trl.methods"
_LOADED: set[str] = set()  # the method modules imported (or being imported) so far
_MODULES: list[tuple[str, str]] | None = None  # (module, what declared it)
_OWNERS: dict[str, str] = {}  # name -> what registered it ("module.Class", or "shaping")


def set_trainer_factory(factory) -> None:
    """Declare how a strategy that no class binds gets its public trainer class (`factory(name) -> type`): the
    trainers do, when imported; the registry cannot build a trainer itself (it sits below them)."""
    global _TRAINER_FACTORY
    _TRAINER_FACTORY = factory


def _initializing(module: str) -> bool:
    """Whether `module` or a package above it is being imported right now (then its registrations are under way)."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        found = sys.modules.get(".".join(parts[:i]))
        if found is not None and getattr(getattr(found, "__spec__", None), "_initializing", False):
            return True
    return False


def _method_modules() -> list[tuple[str, str]]:
    """`(module, what declared it)`: the package's own, then each installed entry point of `ENTRY_POINT_GROUP`."""
    global _MODULES
    if _MODULES is None:
        from importlib.metadata import entry_points

        from . import METHOD_MODULES  # the package root names them: this module sits below them

        declared = entry_points(group=ENTRY_POINT_GROUP)
        _MODULES = [(m, "exploration-trl's own methods") for m in METHOD_MODULES] + [
            (ep.module, f"entry point {ep.name!r} of {ENTRY_POINT_GROUP}") for ep in declared]
    return _MODULES


def load_method_modules() -> None:
    """Import, once, the package's method modules and those other packages declare (each registers its methods on
    import), so that every read of the registry sees them whatever was imported first. A module whose import is
    under way is left to finish (it registers as it goes). Called by every read; registering never calls it."""
    import importlib

    for module, source in _method_modules():
        if module in _LOADED or _initializing(module):
            continue
        _LOADED.add(module)
        try:
            importlib.import_module(module)
        except Exception as e:
            raise ImportError(f"the method module {module} ({source}) failed to import: "
                              f"{type(e).__name__}: {e}") from e


def _check_name(name: str, owner: str) -> None:
    """Check `name`: its form, and that no other owner registered it (the same owner again, a reloaded module, may
    replace its record)."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"method name {name!r} must be lower-case letters, digits and '_' (it is a `method:` value, "
                         "composed with '+')")
    if _OWNERS.get(name, owner) != owner:
        raise ValueError(f"method name {name!r} is already registered (by {_OWNERS[name]}); choose another name")


def _claim(name: str, owner: str) -> None:
    """Check `name` and record who registered it."""
    _check_name(name, owner)
    _OWNERS[name] = owner


def register_method(info: MethodInfo):
    """Class decorator: register a method under `info.name`.

    The class is the method's strategy (`trainers.strategy.Strategy`: its `config_class`, what it needs and its
    hooks); `register_method` gives it its record, name and side. Its public trainer (a thin `ExplorationGRPOTrainer`
    subclass that binds it, `method = "<name>"`) registers itself when its class is defined (`bind_trainer`).
    Only GRPO, which changes nothing (side "none"), is a trainer class registered directly (`ExplorationGRPOTrainer`).
    Registering the same class again (a reloaded module) replaces the record.
    """
    if info.side not in SIDES:
        raise ValueError(f"method {info.name!r}: side is {info.side!r}; choose one of {', '.join(SIDES)}")

    def decorate(cls: type) -> type:
        if getattr(cls, "config_class", None) is None:
            raise ValueError(f"method {info.name!r}: {cls.__name__} has no `config_class`; set it to the method's "
                             "config dataclass")
        strategy = getattr(cls, "is_strategy", False)
        _check_name(info.name, f"{cls.__module__}.{cls.__qualname__}")
        if not strategy and info.side != "none":
            raise ValueError(f"method {info.name!r}: {cls.__name__} is not a strategy; register an AdvantageStrategy "
                             "or LossStrategy subclass (exploration_trl.trainers.strategy; docs/writing_a_method.md) "
                             "and bind it with `class <Name>Trainer(ExplorationGRPOTrainer): method = \"<name>\"`")
        _claim(info.name, f"{cls.__module__}.{cls.__qualname__}")
        if strategy:
            cls.info, cls.name, cls.side = info, info.name, info.side
        else:  # GRPO's trainer
            cls.method_name = info.name
            _TRAINERS[info.name] = cls
        _METHODS[info.name] = (info, cls)
        return cls

    return decorate


def bind_trainer(name: str, cls: type) -> None:
    """Record `cls` as the public trainer of the registered strategy `name` (done by the class's definition: an
    `ExplorationGRPOTrainer` subclass with `method = "<name>"`)."""
    if name not in _METHODS:
        raise ValueError(f"{cls.__name__} binds method {name!r}, which is not registered; register its strategy "
                         "(@register_method) before the trainer class")
    _TRAINERS[name] = cls


def strategy_of(name: str) -> type | None:
    """The strategy class of a registered method (None for GRPO, the one trainer class registered directly)."""
    load_method_modules()
    obj = _METHODS[name][1]
    return obj if getattr(obj, "is_strategy", False) else None


def register_shaping(info: MethodInfo) -> MethodInfo:
    """Register advantage shaping that any method may switch on with its config keys (no trainer of its own; its
    `coefficients` switch it on when one is not 0). Cards cite it when it was on."""
    if info.side != "shaping":
        raise ValueError(f"shaping {info.name!r}: side is {info.side!r}; a shaping's side is 'shaping'")
    _claim(info.name, "shaping")
    _SHAPINGS[info.name] = info
    return info


def unregister(name: str) -> None:
    """Remove a method (or shaping) from the registry: for tests and notebooks that register a throwaway one."""
    _METHODS.pop(name, None)
    _TRAINERS.pop(name, None)
    _SHAPINGS.pop(name, None)
    _OWNERS.pop(name, None)


def trainer_class(name: str) -> type:
    """The public trainer class of a registered method (a strategy that no class binds gets a thin one)."""
    load_method_modules()
    if name not in _TRAINERS:
        if _TRAINER_FACTORY is None:
            raise ValueError(f"method {name!r} has no trainer class: no trainer factory is declared yet (the "
                             "trainers declare it when imported); read the registry after that import finishes")
        _TRAINERS[name] = _TRAINER_FACTORY(name)
    return _TRAINERS[name]


# ---------------------------------------------------------------------------------------------- reading it
class _Methods(Mapping):
    """`{name: (trainer class, config class)}` of the registered methods, in registration order; always current."""

    def __getitem__(self, name: str) -> tuple[type, type]:
        load_method_modules()
        obj = _METHODS[name][1]
        return trainer_class(name), obj.config_class

    def __iter__(self) -> Iterator[str]:
        load_method_modules()
        return iter(list(_METHODS))

    def __len__(self) -> int:
        load_method_modules()
        return len(_METHODS)

    def __repr__(self) -> str:
        return f"METHODS({', '.join(_METHODS)})"


class _Side(Sequence):
    """The names of the registered methods of one side, in registration order; always current."""

    def __init__(self, side: str):
        self.side = side

    def _names(self) -> list[str]:
        load_method_modules()
        return [name for name, (info, _) in _METHODS.items() if info.side == self.side]

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self))


METHODS: Mapping[str, tuple[type, type]] = _Methods()
ADVANTAGE_SIDE: Sequence[str] = _Side("advantage")
LOSS_SIDE: Sequence[str] = _Side("loss")


def _need_registered() -> None:
    load_method_modules()
    if not _METHODS:
        raise ValueError("no method is registered: the registry was read while the package's method modules were "
                         "being imported (exploration_trl.METHOD_MODULES); read it after that import finishes")


def _example() -> str:
    adv, loss = list(ADVANTAGE_SIDE), list(LOSS_SIDE)
    return f"{adv[0]}+{loss[0]}" if adv and loss else "ADVANTAGE+LOSS"


def parse_method(method: str) -> tuple[str, ...]:
    """Split `'progrpo+casp'` into its parts, checking names and that at most one of each side is used.

    Returns the parts in canonical order (advantage side first); a `none`-side method (GRPO) stands alone.
    """
    _need_registered()
    parts = tuple(p.strip().lower() for p in str(method).split("+") if p.strip())
    allowed = f"{', '.join(_METHODS)} (or advantage+loss, e.g. {_example()})"
    if not parts:
        raise ValueError(f"method is empty; choose one of: {allowed}")
    for p in parts:
        if p not in _METHODS:
            raise ValueError(f"unknown method '{p}'; choose one of: {allowed}")
    plain = [p for p in parts if _METHODS[p][0].side == "none"]
    if plain and len(parts) > 1:
        raise ValueError(f"method '{plain[0]}' cannot be combined; name the methods to compose, e.g. {_example()}")
    adv = [p for p in parts if p in ADVANTAGE_SIDE]
    loss = [p for p in parts if p in LOSS_SIDE]
    if len(adv) > 1 or len(loss) > 1:
        raise ValueError(
            f"method '{method}' combines {len(adv)} advantage-side and {len(loss)} loss-side methods; use at most one "
            f"of {', '.join(ADVANTAGE_SIDE)} and one of {', '.join(LOSS_SIDE)}"
        )
    return tuple(adv + loss) or tuple(plain)


def method_info(name: str) -> MethodInfo:
    """The record of one registered method or shaping (`name` has no '+')."""
    load_method_modules()
    if name in _SHAPINGS:
        return _SHAPINGS[name]
    if name not in _METHODS:  # parse_method's one-line error (unknown name, or a composition: no single record)
        parse_method(name)
        raise ValueError(f"method {name!r} is a composition; read its parts' records with method_infos({name!r})")
    return _METHODS[name][0]


def method_infos(method: str | Sequence[MethodInfo] | None) -> list[MethodInfo]:
    """The records of a method string's parts, in canonical order: `'casp+progrpo'` -> [ProGRPO's, CaSP's];
    None is the base method. Records already looked up are returned as they are, so that a caller that reads the
    method in several places (a model card) parses its string once."""
    if method is None:
        return [base_method()]
    if not isinstance(method, str):
        return list(method)
    return [_METHODS[p][0] for p in parse_method(method)]


def trainer_name(method: str | Sequence[MethodInfo]) -> str:
    """The trainer class name of `method` (a string, or its records from `method_infos`); a composition joins its
    parts' names (`ProGRPOCaSPTrainer`), as `trainers.composition` names the composed class."""
    names = [_name_of(info.name) for info in method_infos(method)]
    if len(names) == 1:
        return names[0]
    return "".join(n.removesuffix("Trainer") for n in names) + "Trainer"


def _name_of(name: str) -> str:
    if name in _TRAINERS:
        return _TRAINERS[name].__name__
    obj = _METHODS[name][1]
    return obj.__name__ if obj.__name__.endswith("Trainer") else f"{obj.__name__}Trainer"


def records(parts: Sequence[str]) -> list[MethodInfo]:
    """The records of method parts already parsed (a trainer class's `method_parts`), without parsing them again;
    () is the base method."""
    load_method_modules()
    return [_METHODS[p][0] for p in parts] if parts else [base_method()]


def base_method() -> MethodInfo:
    """The plain trainer every method builds on (the first registered: each method's module imports it first)."""
    _need_registered()
    return next(iter(_METHODS.values()))[0]


def shapings() -> list[MethodInfo]:
    """The registered shapings, in registration order."""
    load_method_modules()
    return list(_SHAPINGS.values())


def registered_papers() -> dict[str, Paper]:
    """`{BibTeX key: Paper}` of every registered method and shaping."""
    load_method_modules()
    infos = [info for info, _ in _METHODS.values()] + list(_SHAPINGS.values())
    return {info.paper.key: info.paper for info in infos}
