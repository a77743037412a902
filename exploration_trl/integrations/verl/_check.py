"""Checking a verl run's `etrl` settings before verl starts anything: a whole composed config, in one call.

verl gives a plugin no hook before its first advantage step (by then the model is loaded, the rollout servers are up
and a batch has been generated), so the checks run here instead, two ways:

* ``python -m exploration_trl.integrations.verl check <the run's Hydra overrides>`` composes verl's `ppo_trainer`
  config (or ``--config-path``/``--config-name``, a YAML on top of it) with the overrides and checks it;
* ``+hydra.callbacks.etrl_check._target_=exploration_trl.integrations.verl.CheckOptions`` on verl's own command line
  checks the composed config in the driver, before `main_ppo` runs (before Ray starts), and stops the run with the
  one-line error.

What is checked is what the estimators check at their first call (every key, type and value; the KL penalty in the
rewards; `rollout.n` against k and against groups of one), plus what only the whole config shows (MaxRL's
unbiasedness conditions). What only a batch shows (agent loops with several outputs per session) stays with the
first call.
"""

from __future__ import annotations

import argparse
import sys

from ..verl_reference import REDIRECTS, REGISTERED, UNAVAILABLE, unavailable_message
from ._estimators import ESTIMATORS, _rollout_n, estimator_options, maxrl_conditions, preflight
from ._options import SECTION, get, section

__all__ = ["check_config", "CheckOptions", "main"]

PROG = "python -m exploration_trl.integrations.verl"


def _check_one(name: str, cfg, notes: list[str]) -> dict:
    algorithm = cfg.algorithm
    n = _rollout_n(cfg)
    options = estimator_options(name, algorithm, n)
    preflight(name, algorithm, cfg, n)
    if name == "etrl_maxrl":
        said = maxrl_conditions(cfg)
        if said:
            notes.append(said)
    if name in ("etrl_pkpo", "etrl_qae") and get(algorithm, "use_kl_in_reward", False):
        notes.append(f"{name}: algorithm.use_kl_in_reward=true: the rewards {name} transforms carry the KL penalty, "
                     "as verl's grpo's do (docs/verl.md)")
    return vars(options)


def check_config(cfg) -> list[str]:
    """Check verl's whole composed config (`algorithm`, `actor_rollout_ref`, `data`, ...) as the `etrl_*`
    estimators will, and more: a one-line `ValueError` on what would fail; the warnings, as lines, otherwise."""
    algorithm = get(cfg, "algorithm")
    if algorithm is None or get(algorithm, "adv_estimator") is None:
        raise ValueError("the config has no algorithm.adv_estimator: is it verl's ppo_trainer config?")
    estimator = get(algorithm, "adv_estimator")
    name = str(getattr(estimator, "value", estimator))
    notes: list[str] = []
    if name in UNAVAILABLE or name in REDIRECTS:
        raise ValueError(unavailable_message(name))
    if name not in ESTIMATORS:
        if name.startswith("etrl_"):
            raise ValueError(f"algorithm.adv_estimator={name} is no estimator of exploration-trl's verl plugin; its "
                             f"estimators: {', '.join(REGISTERED)}")
        if section(algorithm):
            notes.append(f"algorithm.{SECTION} is set, but algorithm.adv_estimator={name} is no etrl_* estimator: "
                         "nothing reads it")
        return notes
    options = _check_one(name, cfg, notes)
    base = options.get("position_bonus_base")
    if base in ESTIMATORS:
        _check_one(base, cfg, notes)
    agent = get(get(get(cfg, "actor_rollout_ref"), "rollout"), "agent")
    if get(agent, "agent_loop_config_path"):
        notes.append(f"{name}: custom agent loops (agent_loop_config_path): one that returns several outputs per "
                     "session is refused at the first advantage step (verl passes an estimator no session ids)")
    return notes


class CheckOptions:
    """A Hydra callback that checks the composed config before verl's `main_ppo` runs, on verl's command line::

        +hydra.callbacks.etrl_check._target_=exploration_trl.integrations.verl.CheckOptions

    A bad setting stops the run with the one-line error (exit status 1), before Ray starts; warnings go to stderr.
    (Hydra turns an exception raised in a callback into a warning and goes on, hence the `SystemExit`.)"""

    def on_job_start(self, config, **kwargs) -> None:
        try:
            notes = check_config(config)
        except ValueError as e:
            raise SystemExit(f"exploration-trl: {e}") from e
        for note in notes:
            print(f"exploration-trl: warning: {note}", file=sys.stderr, flush=True)

    def on_run_start(self, config, **kwargs) -> None:
        pass

    def on_run_end(self, config, **kwargs) -> None:
        pass

    def on_multirun_start(self, config, **kwargs) -> None:
        pass

    def on_multirun_end(self, config, **kwargs) -> None:
        pass

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        pass


def compose(overrides: list[str], config_path: str | None = None, config_name: str = "ppo_trainer"):
    """verl's `ppo_trainer` config (or `config_name` in the directory `config_path`) with Hydra `overrides`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    if config_path:
        from pathlib import Path

        init = initialize_config_dir(config_dir=str(Path(config_path).resolve()), version_base=None)
    else:
        init = initialize_config_module(config_module="verl.trainer.config", version_base=None)
    with init:
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Check a verl run's etrl_* settings before starting it: give the run's Hydra "
        "overrides, exactly as on verl's command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compose verl's config with the overrides and check it")
    check.add_argument("--config-path", default=None, help="a directory holding your YAML (as verl's --config-path)")
    check.add_argument("--config-name", default="ppo_trainer", help="the config's name (default: verl's ppo_trainer)")
    check.add_argument("overrides", nargs="*", help="e.g. algorithm.adv_estimator=etrl_pkpo +algorithm.etrl.pkpo_k=4")
    args = parser.parse_args(argv)
    try:
        cfg = compose(args.overrides, args.config_path, args.config_name)
    except Exception as e:  # noqa: BLE001 - Hydra's errors (a key verl's config lacks, a bad override): one line
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    try:
        notes = check_config(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    name = str(cfg.algorithm.adv_estimator)
    if name in ESTIMATORS:
        spec = ESTIMATORS[name]
        unused = {"num_generations", *(spec.unsupported or {})} | (set() if spec.uses_correct else
                                                                   {"correct_reward_threshold"})
        options = estimator_options(name, cfg.algorithm, _rollout_n(cfg))
        shown = ", ".join(f"{k}={v}" for k, v in sorted(vars(options).items()) if k not in unused)
        print(f"ok: {name} ({shown}; actor_rollout_ref.rollout.n={_rollout_n(cfg)})")
    else:
        print(f"ok: {name} is not an etrl_* estimator; nothing of exploration-trl's to check")
    return 0
