"""The package's advantage-side methods as verl advantage estimators (verl 0.9.x; docs/verl.md).

Importing this package registers these names with verl's `register_adv_est` (`verl/trainer/ppo/core_algos.py`):

======================== ================================================================================
``etrl_passk``           Pass@k Training's analytic advantages (`core.passk_advantages`)
``etrl_pkpo``            PKPO's unbiased pass@k / max@k transform, then the std division (`core.pkpo_advantages`)
``etrl_maxrl``           MaxRL's mean-normalised advantages (`core.maxrl_advantages`)
``etrl_wreinforce``      W-REINFORCE's +lambda / -1 advantages (`core.weighted_reinforce_advantages`)
``etrl_qae``             QAE's K-quantile baseline (`core.quantile_advantages`)
``etrl_position_bonus``  STILL's position bonus on another estimator's advantages (`core.position_bonus_advantages`)
======================== ================================================================================

and, under the `etrl_<method>` names of the methods verl cannot carry (`verl_reference.UNAVAILABLE`) or has already
(`verl_reference.REDIRECTS`), estimators that raise the one-line reason, so that `adv_estimator=etrl_progrpo` says why.

verl imports it by itself: the package declares it as a `verl.plugins` entry point (setup.cfg), which `import verl`
loads unless `VERL_USE_EXTERNAL_PLUGINS=none`. verl's trainer then calls an estimator as
`fn(token_level_rewards=(B, T), response_mask=(B, T), config=<the algorithm config>, index=<uids>)` and keeps the
`(advantages, returns)` it returns, both `(B, T)`. The rows arrive in any order (verl balances the batch across
workers first), so the completions of one prompt are found by their uid (`UidGroups`, no loop over groups), and
groups may differ in size.

The import is cheap (verl's `core_algos`, which verl's trainer and actors import anyway, and the package's pure-torch
core; no TRL) and loud when it fails: verl's loader swallows a plugin's import error (a debug log line), so this
module prints the error to stderr and registers every name as an estimator that raises it, instead of verl's later
"Unknown advantage estimator". Options are read and checked at an estimator's first call (which imports TRL once, for
the TRL configs' defaults), or before the run with `python -m exploration_trl.integrations.verl check ...` or the
Hydra callback `CheckOptions` (`_check.py`).
"""

from __future__ import annotations

import sys

from ..verl_reference import REDIRECTS, REGISTERED, UNAVAILABLE, unavailable_message

_FAILED = "exploration-trl's verl plugin (exploration_trl.integrations.verl) failed to import"

try:
    from verl.trainer.ppo import core_algos
except Exception as _error:  # verl itself is broken: nothing can be registered; say so where it is seen
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        raise ImportError("exploration_trl.integrations.verl needs verl: pip install -e \".[verl]\"") from _error
    print(f"{_FAILED}: importing verl's core_algos raised {_error!r}; no etrl_* estimator is registered",
          file=sys.stderr, flush=True)
    raise

try:
    from ._check import CheckOptions, check_config
    from ._estimators import (
        ESTIMATORS,
        compute_etrl_maxrl_advantage,
        compute_etrl_passk_advantage,
        compute_etrl_pkpo_advantage,
        compute_etrl_position_bonus_advantage,
        compute_etrl_qae_advantage,
        compute_etrl_wreinforce_advantage,
        estimator_options,
        position_bonus_in_place,
        reset_warnings,
    )
    from ._groups import UidGroups
    from ._options import SCALES, SECTION
except Exception as _error:
    _message = f"{_FAILED}: {type(_error).__name__}: {_error}"
    print(f"{_message}. Every etrl_* estimator will raise this error.", file=sys.stderr, flush=True)

    def _broken(*args, _message=_message, **kwargs):
        raise RuntimeError(_message)

    for _name in REGISTERED:
        core_algos.ADV_ESTIMATOR_REGISTRY.setdefault(_name, _broken)
    raise

__all__ = [
    "ESTIMATORS", "SECTION", "SCALES", "UidGroups", "estimator_options", "reset_warnings", "check_config",
    "CheckOptions", "compute_etrl_passk_advantage", "compute_etrl_pkpo_advantage", "compute_etrl_maxrl_advantage",
    "compute_etrl_wreinforce_advantage", "compute_etrl_qae_advantage", "compute_etrl_position_bonus_advantage",
    "position_bonus_in_place",
]


def _refuse(name: str):
    message = unavailable_message(name)

    def refuse(*args, **kwargs):
        raise ValueError(message)

    refuse.__name__ = refuse.__qualname__ = f"refuse_{name}"
    refuse.__module__ = __name__
    return refuse


def _register(name: str, fn) -> None:
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if existing is not None and getattr(existing, "__module__", "").startswith(__name__):
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = fn  # this package imported again (a reload): replace our own
    else:
        core_algos.register_adv_est(name)(fn)  # raises if another package holds the name


for _name in REGISTERED:
    _register(_name, globals()[f"compute_{_name}_advantage"])
for _name in (*UNAVAILABLE, *REDIRECTS):
    _register(_name, _refuse(_name))
