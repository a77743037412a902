"""The `etrl` section of verl's algorithm config: the keys, their defaults and types (the TRL configs'), and the checks
that turn a bad value into a one-line error naming the key, the value and what it takes.

The defaults and types are read from the TRL config classes' fields, on first use (it imports TRL once), so that a
default changed there is the plugin's default too. A few keys are the plugin's own (`PLUGIN_KEYS`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from omegaconf import OmegaConf

__all__ = ["SECTION", "SCALES", "PLUGIN_KEYS", "FALLBACK_DEFAULTS", "get", "section", "root_of", "trl_keys",
           "check_type"]

#: The algorithm config's section the options live in: `algorithm.etrl.<key>`.
SECTION = "etrl"
#: The values of `scale_rewards` (TRL's: the std of the group, of the batch, or no division).
SCALES = ("group", "batch", "none")

#: The plugin's own keys: `(default, type, what it is)`. `scale_rewards`' default is verl's
#: `algorithm.norm_adv_by_std_in_grpo` ("group" when true, "none" when false), filled in per call.
PLUGIN_KEYS: dict[str, tuple[Any, str, str]] = {
    "scale_rewards": (None, "str", "TRL's scale_rewards: group, batch or none"),
    "position_bonus_base": ("grpo", "str", "the estimator whose advantages etrl_position_bonus shapes"),
}
#: Defaults of keys a TRL config may not have (yet): used only when its field is missing.
FALLBACK_DEFAULTS: dict[str, Any] = {"qae_eps": 1e-4}


def get(config, key: str, default=None):
    if config is None:
        return default
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


def section(config) -> dict[str, Any]:
    """The algorithm config's `etrl` section as a plain dict (empty when absent)."""
    value = get(config, SECTION)
    if value is None:
        return {}
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise ValueError(f"algorithm.{SECTION} is {value!r} but must be a mapping of options, e.g. "
                         f"+algorithm.{SECTION}.passk_k=4")
    return dict(value)


def root_of(config):
    """verl's whole config, when the algorithm config is its `algorithm` node (how verl's trainers pass it:
    `config=self.config.algorithm`); None for a config made on its own. OmegaConf keeps a node's parent; it has no
    public accessor for it, so its `_get_parent` is used, and anything unexpected reads as None."""
    if not OmegaConf.is_config(config):
        return None
    try:
        parent = config._get_parent()
    except Exception:  # noqa: BLE001 - an OmegaConf without the accessor: no whole config
        return None
    if parent is None or not OmegaConf.is_dict(parent) or "actor_rollout_ref" not in parent:
        return None
    return parent


@functools.cache
def trl_keys(method: str, prefixes: tuple[str, ...]) -> dict[str, tuple[Any, str]]:
    """`{key: (default, type)}` of the TRL config of `method` for the keys that start with `prefixes`, plus
    `correct_reward_threshold`, plus `FALLBACK_DEFAULTS` of those prefixes that the config lacks."""
    from ...trainers import get_config_class

    out = {}
    for f in fields(get_config_class(method)):
        if f.name.startswith(prefixes) or f.name == "correct_reward_threshold":
            default = f.default if f.default is not MISSING else f.default_factory()
            out[f.name] = (default, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)))
    for key, default in FALLBACK_DEFAULTS.items():
        if key.startswith(prefixes) and key not in out:
            out[key] = (default, type(default).__name__)
    return out


_TAKES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


def _accepts(kind: str, value) -> bool:
    if kind == "int":  # a float such as 2.5 passes here; the method's own check says it must be an integer
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not _is_nan(value)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not _is_nan(value)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    return True  # a type this check does not know: the method's own check decides


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _what(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if _is_nan(value):
        return "NaN"
    return {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}.get(
        type(value), type(value).__name__)


def check_type(name: str, key: str, value, annotation: str) -> None:
    """A one-line `ValueError` when `value` is not of `annotation` (a TRL field type such as `float` or `int | None`),
    naming the estimator, the key, the value and what the key takes."""
    kinds = [part.strip() for part in annotation.split("|")]
    optional = "None" in kinds
    kinds = [k for k in kinds if k != "None"]
    if value is None and optional:
        return
    if value is not None and any(_accepts(kind, value) for kind in kinds):
        return
    takes = " or ".join(_TAKES.get(kind, kind) for kind in kinds) + (" or null" if optional else "")
    raise ValueError(f"{name}: algorithm.{SECTION}.{key}={value!r} is {_what(value)}, but {key} takes {takes} "
                     f"({annotation})")
