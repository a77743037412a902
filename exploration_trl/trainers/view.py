"""`TrainerView`: what one component or callback sees of its trainer, the names it declares and nothing else.

A strategy sees its run through `MethodContext` (`context.py`); a component (`components/`) or a callback
(`callbacks/`) through a view of the trainer limited to the names its class declares once, in `READS` (and, for the
one that acts on the run, `WRITES`). The view reads them live (the trainer's `state`, `model` and TRL's settings
change as it trains), so it copies nothing; any other name fails with the class's name and the fix. So what each
component depends on is one list in its own file, and `tests/test_architecture.py` checks that the list is what its
code reads.
"""
from __future__ import annotations

from typing import Any

__all__ = ["TrainerView", "view_of"]


class TrainerView:
    """The trainer as one component sees it: `reads` to get, `writes` to set (module docstring)."""

    __slots__ = ("_trainer", "_reads", "_writes", "_owner")

    def __init__(self, trainer: Any, reads: tuple[str, ...], writes: tuple[str, ...], owner: str):
        object.__setattr__(self, "_trainer", trainer)
        object.__setattr__(self, "_reads", frozenset(reads) | frozenset(writes))
        object.__setattr__(self, "_writes", frozenset(writes))
        object.__setattr__(self, "_owner", owner)

    def __getattr__(self, name: str) -> Any:
        if name in self._reads:
            return getattr(self._trainer, name)
        raise AttributeError(f"{self._owner} reads only {', '.join(sorted(self._reads))} of its trainer, not "
                             f"{name!r}: add it to {self._owner}.READS")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._writes:
            raise AttributeError(f"{self._owner} may not set {name!r} on its trainer: add it to {self._owner}.WRITES")
        setattr(self._trainer, name, value)

    def __repr__(self) -> str:
        return f"<{self._owner}'s view of {type(self._trainer).__name__}: {', '.join(sorted(self._reads))}>"


def view_of(trainer: Any, cls: type) -> TrainerView:
    """The view of `trainer` that `cls` declares (`cls.READS`, `cls.WRITES`)."""
    reads, writes = cls.READS, getattr(cls, "WRITES", ())
    for key, names in (("READS", reads), ("WRITES", writes)):
        if isinstance(names, str):  # `("name")` is a string, not a tuple: its letters would be the names
            raise TypeError(f"{cls.__name__}.{key} is the string {names!r}; write a tuple: ({names!r},)")
    return TrainerView(trainer, tuple(reads), tuple(writes), cls.__name__)
