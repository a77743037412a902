"""The package's advantage-side methods as verl advantage estimators (verl 0.9.x; docs/verl.md).

Importing this module registers five names with verl's `register_adv_est` (`verl/trainer/ppo/core_algos.py`):

==================== ====================================================================================
``etrl_passk``       Pass@k Training's analytic advantages (`core.passk_advantages`)
``etrl_pkpo``        PKPO's unbiased pass@k / max@k transform, then the std division (`core.pkpo_advantages`)
``etrl_maxrl``       MaxRL's mean-normalised advantages (`core.maxrl_advantages`)
``etrl_wreinforce``  W-REINFORCE's +lambda / -1 advantages (`core.weighted_reinforce_advantages`)
``etrl_qae``         QAE's K-quantile baseline (`core.quantile_advantages`)
==================== ====================================================================================

verl imports it by itself: the package declares it as a `verl.plugins` entry point (setup.cfg), which `import verl`
loads unless `VERL_USE_EXTERNAL_PLUGINS=none`. verl's trainer then calls an estimator as
`fn(token_level_rewards=(B, T), response_mask=(B, T), config=<the algorithm config>, index=<uids>)` and keeps the
`(advantages, returns)` it returns, both `(B, T)`. The rows arrive in any order (verl balances the batch across
workers first), so the completions of one prompt are found by their uid, and groups may differ in size; each group is
padded to the largest one with unscored rows, which the core functions leave out of every statistic and give 0.

Not registered, because verl has them already (docs/verl.md compares the numbers): GRPO (verl's `grpo` estimator),
KL-Cov and Clip-Cov (verl's `kl_cov` and `clip_cov` policy losses) and PKPO at k = G, unnormalised (verl's
`grpo_passk`). The other methods need inputs an estimator or a policy loss does not receive (log-probs, entropies,
logits, final answers); docs/verl.md lists them.

Options are read from the algorithm config's `etrl` section (`+algorithm.etrl.passk_k=4`). Their names, defaults
and checks are the TRL configs' (`PasskConfig`, `PKPOConfig`, `MaxRLConfig`, `WReinforceConfig`, `QAEConfig`;
`correct_reward_threshold` from `ExplorationGRPOConfig`); `scale_rewards` defaults to verl's own
`algorithm.norm_adv_by_std_in_grpo` ("group" when true, "none" when false). The config classes are read on the first
call, not at import, so that registering costs no TRL import in every verl worker. Nothing here re-implements a
method: every number comes from `exploration_trl.core`.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

from ..core import estimators as core_est
from ..core import passk as core_pk
from ..rewards._base import is_correct

__all__ = [
    "ESTIMATORS", "SECTION", "UidGroups", "estimator_options", "reset_warnings",
    "compute_etrl_passk_advantage", "compute_etrl_pkpo_advantage", "compute_etrl_maxrl_advantage",
    "compute_etrl_wreinforce_advantage", "compute_etrl_qae_advantage",
]

logger = logging.getLogger(__name__)

#: The algorithm config's section the options live in: `algorithm.etrl.<key>`.
SECTION = "etrl"
#: The values of `scale_rewards` (TRL's: the std of the group, of the batch, or no division).
SCALES = ("group", "batch", "none")


class UidGroups:
    """The rows of a verl batch grouped by uid (the prompt each completion answers), in any row order and group size.

    `rows` is `(n_groups, size)`: the batch rows of each group in the order they come, `-1` past a group's end.
    `pad` lays per-row values out as the core functions expect them (`n_groups * size` rows, each group contiguous);
    `unpad` takes the core's per-row result back to the batch's order."""

    def __init__(self, index, n_rows: int):
        uids = index.tolist() if hasattr(index, "tolist") else list(index)
        if len(uids) != n_rows:
            raise ValueError(f"index holds {len(uids)} uids for {n_rows} rows: verl passes one uid per row")
        members: dict[Any, list[int]] = {}
        for row, uid in enumerate(uids):
            members.setdefault(uid, []).append(row)
        self.n_rows = n_rows
        self.size = max((len(m) for m in members.values()), default=1)
        self.rows = torch.full((len(members), self.size), -1, dtype=torch.long)
        for g, m in enumerate(members.values()):
            self.rows[g, :len(m)] = torch.tensor(m, dtype=torch.long)
        self._flat = self.rows.reshape(-1)
        #: True on the padded layout's real rows.
        self.valid = self._flat >= 0

    @property
    def sizes(self) -> list[int]:
        return (self.rows >= 0).sum(dim=1).tolist()

    def pad(self, per_row: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full(self._flat.shape, fill, dtype=per_row.dtype)
        out[self.valid] = per_row.cpu()[self._flat[self.valid]]
        return out

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.n_rows, dtype=padded.dtype)
        out[self._flat[self.valid]] = padded.cpu()[self.valid]
        return out


@dataclass(frozen=True)
class Estimator:
    """One registered name: the package method it runs and how."""

    method: str  #: the package's method name (its TRL config holds the keys and defaults)
    display: str
    check: str  #: the function of `exploration_trl.trainers.methods.<method module>` that checks the method's keys
    compute: Callable[..., torch.Tensor]  #: `(options, rewards, correct, valid, size) -> advantages`, padded layout
    uses_scale: bool = False  #: reads `scale_rewards`
    uses_correct: bool = True  #: reads `correct_reward_threshold`
    guard: str | None = None  #: what the method does when every completion is judged alike (warned once)
    zero_batch: str | None = None  #: why a batch's advantages can all be 0 (warned once)
    #: keys of the TRL config that verl cannot honour here, and why
    unsupported: Mapping[str, str] | None = None


def _passk(o, rewards, correct, valid, size):
    return core_pk.passk_advantages(correct, size, o.passk_k, valid=valid, scale=o.scale_rewards != "none")


def _pkpo(o, rewards, correct, valid, size):
    return core_pk.pkpo_advantages(rewards, size, o.pkpo_k, o.pkpo_estimator, scale=o.scale_rewards)


def _maxrl(o, rewards, correct, valid, size):
    return core_est.maxrl_advantages(correct, size, valid=valid, eps=o.maxrl_eps)


def _wreinforce(o, rewards, correct, valid, size):
    return core_est.weighted_reinforce_advantages(correct, valid, o.wreinforce_lambda, o.wreinforce_mode)


def _qae(o, rewards, correct, valid, size):
    return core_est.quantile_advantages(rewards, size, k=o.qae_k, method=o.qae_quantile_method, scale=o.scale_rewards)


_NO_STEP = ("k annealing needs the training step, which verl does not pass to an advantage estimator; leave it "
            "unset (a fixed pkpo_k)")

#: The registered names and what each runs.
ESTIMATORS: dict[str, Estimator] = {
    "etrl_passk": Estimator(
        "passk", "Pass@k Training", "passk:check_passk_options", _passk, uses_scale=True,
        guard="Pass@k Training's advantages are all 0 and it learns nothing"),
    "etrl_pkpo": Estimator(
        "pkpo", "PKPO", "passk:check_pkpo_options", _pkpo, uses_scale=True, uses_correct=False,
        unsupported={"pkpo_k_final": _NO_STEP}),
    "etrl_maxrl": Estimator(
        "maxrl", "MaxRL", "maxrl:check_maxrl_options", _maxrl,
        guard="MaxRL's advantages are all 0 and it learns nothing",
        zero_batch="every group was all correct or all wrong, so MaxRL's advantages were all 0 and the batch taught "
                   "nothing. Harder or easier prompts, or a larger actor_rollout_ref.rollout.n, give mixed groups"),
    "etrl_wreinforce": Estimator(
        "wreinforce", "W-REINFORCE", "wreinforce:check_wreinforce_options", _wreinforce,
        guard="W-REINFORCE gives every completion the same advantage, so it moves the likelihood of every sample "
              "alike",
        zero_batch="its advantages were all 0 (wreinforce_mode psr without a correct completion, nsr without a "
                   "wrong one, or weighted with only correct ones and wreinforce_lambda 0) and the batch taught "
                   "nothing"),
    "etrl_qae": Estimator(
        "qae", "QAE", "qae:check_qae_options", _qae, uses_scale=True, uses_correct=False,
        zero_batch="every group had equal rewards, so QAE's advantages were all 0 and the batch taught nothing. "
                   "verl's algorithm.filter_groups (DAPO's dynamic sampling) drops such groups"),
}


@functools.cache
def _defaults(method: str) -> dict[str, Any]:
    """The method's own keys and their defaults, read from its TRL config class (the keys its `config_prefixes`
    name), plus `correct_reward_threshold`."""
    from ..methods import method_info
    from ..trainers import get_config_class

    prefixes = method_info(method).config_prefixes
    out = {}
    for f in fields(get_config_class(method)):
        if f.name.startswith(prefixes) or f.name == "correct_reward_threshold":
            out[f.name] = f.default if f.default is not MISSING else f.default_factory()
    return out


def _known_keys() -> set[str]:
    return {"scale_rewards"}.union(*(_defaults(e.method) for e in ESTIMATORS.values()))


def _get(config, key: str, default=None):
    if config is None:
        return default
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


def _section(config) -> dict[str, Any]:
    section = _get(config, SECTION)
    if section is None:
        return {}
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    if not isinstance(section, Mapping):
        raise ValueError(f"algorithm.{SECTION} is {section!r} but must be a mapping of options, e.g. "
                         f"+algorithm.{SECTION}.passk_k=4")
    return dict(section)


def estimator_options(name: str, config=None, num_generations: int | None = None) -> SimpleNamespace:
    """The options estimator `name` runs with: the algorithm config's `etrl` section over the TRL config's defaults,
    checked as the TRL config checks them (`num_generations`: the largest group, for the checks on k). Raises a
    one-line `ValueError` on an unknown key, a bad value, or a key verl cannot honour."""
    spec = ESTIMATORS[name]
    given = _section(config)
    unknown = sorted(set(given) - _known_keys())
    if unknown:
        raise ValueError(f"{name}: unknown key(s) algorithm.{SECTION}.{', '.join(unknown)}; the keys are "
                         f"{', '.join(sorted(_known_keys()))}")
    values = dict(_defaults(spec.method))
    values.update({k: v for k, v in given.items() if k in values})
    for key, why in (spec.unsupported or {}).items():
        if given.get(key) is not None:
            raise ValueError(f"{name}: algorithm.{SECTION}.{key} is not available in verl: {why}")
    if spec.uses_scale:
        default = "group" if _get(config, "norm_adv_by_std_in_grpo", True) else "none"
        values["scale_rewards"] = given.get("scale_rewards", default)
    options = SimpleNamespace(**values, num_generations=num_generations)
    module, function = spec.check.split(":")
    from importlib import import_module

    check = getattr(import_module(f"exploration_trl.trainers.methods.{module}"), function)
    try:
        check(options)
        if spec.uses_scale and options.scale_rewards not in SCALES:
            raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}; got {options.scale_rewards!r}")
    except ValueError as e:
        raise ValueError(f"{name}: {e} (verl: algorithm.{SECTION}.<key>; num_generations is the largest uid group, "
                         "actor_rollout_ref.rollout.n)") from e
    return options


#: Per process and name: the correctness flags so far (see `trainers.callbacks.correctness_guard.group_flags`) and what was said.
_STATE: dict[str, dict[str, Any]] = {}


def reset_warnings() -> None:
    """Forget what was warned (each warning is given once per process and name)."""
    _STATE.clear()


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=4)


def _warn_once(name: str, spec: Estimator, options, rewards, correct, advantages, size: int) -> None:
    state = _STATE.setdefault(name, {"flags": None, "guard_done": False, "zero_done": False})
    threshold = getattr(options, "correct_reward_threshold", None)
    if spec.guard and not state["guard_done"]:
        from ..trainers.callbacks.correctness_guard import group_flags

        flags = group_flags(rewards, correct, size)
        state["flags"] = flags if state["flags"] is None else state["flags"] | flags
        mixed, varied, _, any_wrong = state["flags"].tolist()
        if mixed:
            state["guard_done"] = True  # the threshold splits this reward: nothing to say
        elif varied and not any_wrong:
            state["guard_done"] = True
            _warn(f"{name}: correct_reward_threshold={threshold} splits no group: every completion so far was judged "
                  f"correct (total reward > {threshold}) although the rewards varied within groups, so "
                  f"{spec.guard}. With a graded reward (a length or similarity score, or accuracy plus a format "
                  f"bonus), set +algorithm.{SECTION}.correct_reward_threshold to the value a correct completion's "
                  "reward exceeds (e.g. 0.5 for accuracy 1 plus a 0.1 format bonus). Warned once.")
    if spec.zero_batch and not state["zero_done"] and bool((advantages == 0).all()):
        state["zero_done"] = True
        where = f" (correct: total reward > {threshold})" if spec.uses_correct else ""
        n = int((~torch.isnan(rewards)).sum())
        _warn(f"{name}: in a batch of {n} completions{where}, {spec.zero_batch}. Warned once.")


def _advantages(name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, config):
    spec = ESTIMATORS[name]
    if index is None:
        raise ValueError(f"{name} compares the completions of one prompt: it needs their uids as `index` (verl passes "
                         "non_tensor_batch['uid']), and none was given")
    with torch.no_grad():
        scores = token_level_rewards.detach().sum(dim=-1).float()
        groups = UidGroups(index, scores.shape[0])
        options = estimator_options(name, config, groups.size)
        rewards = groups.pad(scores, float("nan"))
        threshold = getattr(options, "correct_reward_threshold", 0.0)
        correct = is_correct(rewards, threshold) & groups.valid
        padded = spec.compute(options, rewards, correct, groups.valid, groups.size)
        _warn_once(name, spec, options, rewards, correct, padded, groups.size)
        per_row = groups.unpad(padded).to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
        advantages = per_row.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_etrl_passk_advantage(token_level_rewards, response_mask, index=None, config=None, **unused):
    """`etrl_passk`: Pass@k Training (Chen et al. 2025), `core.passk_advantages` on each uid group's correct count.
    Options: `passk_k` (<= the group size), `correct_reward_threshold`, `scale_rewards`."""
    return _advantages("etrl_passk", token_level_rewards, response_mask, index, config)


def compute_etrl_pkpo_advantage(token_level_rewards, response_mask, index=None, config=None, **unused):
    """`etrl_pkpo`: PKPO (Walder & Karkhanis 2025), `core.pkpo_advantages` on each uid group's rewards.
    Options: `pkpo_k`, `pkpo_estimator`, `scale_rewards` (no k annealing: verl passes no step)."""
    return _advantages("etrl_pkpo", token_level_rewards, response_mask, index, config)


def compute_etrl_maxrl_advantage(token_level_rewards, response_mask, index=None, config=None, **unused):
    """`etrl_maxrl`: MaxRL (Tajwar et al. 2026), `core.maxrl_advantages` on each uid group's correctness.
    Options: `maxrl_eps`, `correct_reward_threshold`."""
    return _advantages("etrl_maxrl", token_level_rewards, response_mask, index, config)


def compute_etrl_wreinforce_advantage(token_level_rewards, response_mask, index=None, config=None, **unused):
    """`etrl_wreinforce`: W-REINFORCE (Zhu et al. 2025), `core.weighted_reinforce_advantages` on each row's
    correctness. Options: `wreinforce_lambda`, `wreinforce_mode`, `correct_reward_threshold`."""
    return _advantages("etrl_wreinforce", token_level_rewards, response_mask, index, config)


def compute_etrl_qae_advantage(token_level_rewards, response_mask, index=None, config=None, **unused):
    """`etrl_qae`: QAE (Wu et al. 2025), `core.quantile_advantages` on each uid group's rewards.
    Options: `qae_k`, `qae_quantile_method`, `scale_rewards`."""
    return _advantages("etrl_qae", token_level_rewards, response_mask, index, config)


def _register(name: str, fn) -> None:
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if existing is not None and getattr(existing, "__module__", None) == __name__:
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = fn  # this module imported again (a reload): replace our own
    else:
        core_algos.register_adv_est(name)(fn)  # raises if another package holds the name


for _name in ESTIMATORS:
    _register(_name, globals()[f"compute_{_name}_advantage"])
