"""The methods: one module per method, holding its strategy (`strategy.py`'s `AdvantageStrategy` or `LossStrategy`),
its config class and keys, its registered record (`@register_method(MethodInfo(...))`) and its thin public trainer.

A method module stands on the trainer (`base.py`), its vocabulary and the wings below (components, callbacks, the
boundary's `Capture`), never on another method (but `cov` on its own `cov_global`). The built-in methods are imported below in the order
`train --help`, errors and cards list them; every other module of this folder is imported after them, so a new method's
module registers without a line here (`docs/writing_a_method.md`).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from . import progrpo, dsgrpo, casp, cov, passk, maxrl, wreinforce, qae, entropy_adv, outcome_explore  # noqa: F401

for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_module.name}")
