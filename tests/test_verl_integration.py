"""The methods inside verl (`exploration_trl.integrations.verl`, docs/verl.md), on a CPU with verl installed.

The tests marked `verl` run in .venv-verl (`bash scripts/install_verl_cpu.sh`, then
`.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_integration.py`; CI's stage 3); the main suite deselects
them. What they prove:
- a plain `import verl` registers every `etrl_*` name (the `verl.plugins` entry point), in a fresh interpreter;
- each estimator, called through verl's own `compute_advantage` on a `DataProto` whose rows are shuffled (as verl's
  batch balancing leaves them), returns the package core's numbers, also for groups of unequal size, and the
  hand-worked values of each paper's formula;
- options, defaults, errors and warnings are the TRL configs';
- verl's built-ins agree with the package where both have the method: `grpo` with the core's GRPO advantage at
  eps 1e-6, the `kl_cov` and seeded `clip_cov` policy losses in value and gradient, `grpo_passk` with PKPO at k = G
  (`sloo_minus_one`, unnormalised); each test prints the largest difference it measured (docs/verl.md's table);
- a Hydra compose of verl's `ppo_trainer` config with the overrides a user writes reaches the estimator.
The test without the marker runs in the main suite and needs no verl.
"""

from __future__ import annotations

import configparser
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMES = ["etrl_passk", "etrl_pkpo", "etrl_maxrl", "etrl_wreinforce", "etrl_qae"]
verl_only = pytest.mark.verl


def test_the_package_declares_the_plugin_and_the_extra():
    """Installing the package is enough: setup.cfg names the module as a `verl.plugins` entry point, and the `verl`
    extra pins verl 0.9.x (main suite, no verl needed)."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    plugins = [line.strip() for line in cfg["options.entry_points"]["verl.plugins"].strip().splitlines()]
    assert plugins == ["exploration_trl = exploration_trl.integrations.verl"]
    assert (REPO_ROOT / "exploration_trl" / "integrations" / "verl.py").is_file()
    assert cfg["options.extras_require"]["verl"].split() == ["verl>=0.9,<0.10"]
    run = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ".venv-verl/bin/python -m pytest -q -m verl tests/test_verl_integration.py" in run


def test_the_docs_defaults_are_the_trl_configs():
    """docs/verl.md's table of names gives each option's default as the TRL config's field default (main suite)."""
    import dataclasses
    import re

    from exploration_trl.trainers import get_config_class

    text = (REPO_ROOT / "docs" / "verl.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `etrl_")]
    assert [re.match(r"\| `(etrl_\w+)`", row).group(1) for row in rows] == NAMES
    for row in rows:
        name = re.match(r"\| `(etrl_\w+)`", row).group(1)
        defaults = {f.name: f.default for f in dataclasses.fields(get_config_class(name.removeprefix("etrl_")))}
        given = re.findall(r"`(\w+)=([^`]+)`", row.split("|")[-2])
        assert given and all(str(defaults[key]) == value for key, value in given), (name, given)


# ----------------------------------------------------------------------------------------------------------------
# Helpers (verl is imported inside them, so that the main suite collects this file without verl).


@pytest.fixture(autouse=True)
def _fresh_warnings(request):
    if request.node.get_closest_marker("verl"):
        from exploration_trl.integrations import verl as etrl_verl

        etrl_verl.reset_warnings()
    yield


def algorithm_config(**etrl):
    """verl's algorithm config as the trainer passes it (a DictConfig), with an `etrl` section when options are
    given; `norm_adv_by_std_in_grpo` may be passed too."""
    from omegaconf import OmegaConf

    norm = etrl.pop("norm_adv_by_std_in_grpo", True)
    cfg = {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": norm}
    if etrl:
        cfg["etrl"] = etrl
    return OmegaConf.create(cfg)


def outcome_batch(scores: list[list[float]], seed: int = 0, width: int = 6):
    """Token-level rewards and masks for groups of completions with these outcome scores (the score on a row's
    last valid token, as verl's reward managers put it), rows contiguous per group; returns
    `(token_level_rewards, response_mask, uids, flat_scores)`."""
    g = torch.Generator().manual_seed(seed)
    flat = [float(s) for group in scores for s in group]
    uids = [f"prompt-{i}" for i, group in enumerate(scores) for _ in group]
    lengths = torch.randint(1, width + 1, (len(flat),), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    rewards = torch.zeros(len(flat), width)
    rewards[torch.arange(len(flat)), lengths - 1] = torch.tensor(flat)
    return rewards, mask, np.array(uids, dtype=object), torch.tensor(flat, dtype=torch.float32)


def through_verl(name, rewards, mask, uids, config, seed: int = 1):
    """Shuffle the rows, call verl's own `compute_advantage` on a `DataProto` exactly as its trainer does, and
    return the per-row advantages (the value on each row's first token) in the original row order, plus the full
    `(B, T)` tensors."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    perm = torch.randperm(rewards.shape[0], generator=torch.Generator().manual_seed(seed))
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards[perm], "response_mask": mask[perm]},
                               non_tensors={"uid": uids[perm.numpy()]})
    out = compute_advantage(data, adv_estimator=name, gamma=1.0, lam=1.0, num_repeat=1,
                            norm_adv_by_std_in_grpo=bool(config.get("norm_adv_by_std_in_grpo", True)), config=config)
    adv = torch.empty_like(out.batch["advantages"])
    ret = torch.empty_like(out.batch["returns"])
    adv[perm], ret[perm] = out.batch["advantages"], out.batch["returns"]
    return adv[:, 0], adv, ret


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# ----------------------------------------------------------------------------------------------------------------
# Registration


@verl_only
def test_a_plain_import_verl_registers_every_name_in_a_fresh_interpreter():
    code = ("import sys, verl\n"
            "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\n"
            "print(sorted(n for n in R if n.startswith('etrl_')))\n"
            "print(R['etrl_maxrl'].__module__, 'exploration_trl.trainers' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         timeout=300).stdout.splitlines()
    assert out[-2] == str(sorted(NAMES))
    # registered by this package's module; the TRL side is not imported until an estimator is first called
    assert out[-1] == "exploration_trl.integrations.verl False"


@verl_only
def test_with_plugins_off_verls_external_modules_route_registers_them():
    """`VERL_USE_EXTERNAL_PLUGINS=none` turns entry points off; `VERL_USE_EXTERNAL_MODULES` (also what
    `actor_rollout_ref.model.external_lib` does in the workers) is the other route, and registers the same names."""
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\n"
            "print(sorted(n for n in R if n.startswith('etrl_')))\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         env={**base, "VERL_USE_EXTERNAL_PLUGINS": "none"}).stdout.splitlines()
    assert off[-1] == "[]"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                        env={**base, "VERL_USE_EXTERNAL_PLUGINS": "none",
                             "VERL_USE_EXTERNAL_MODULES": "exploration_trl.integrations.verl"}).stdout.splitlines()
    assert on[-1] == str(sorted(NAMES))


@verl_only
def test_the_names_resolve_through_verls_registry_and_collide_with_nothing_of_verls():
    import importlib

    import verl  # noqa: F401
    from verl.trainer.ppo import core_algos

    from exploration_trl.integrations import verl as etrl_verl

    assert set(etrl_verl.ESTIMATORS) == set(NAMES)
    builtin = {e.value for e in core_algos.AdvantageEstimator}
    assert not builtin & set(NAMES) and {"grpo", "grpo_passk"} <= builtin
    for name in NAMES:
        assert core_algos.get_adv_estimator_fn(name) is getattr(etrl_verl, f"compute_{name}_advantage")
    importlib.reload(etrl_verl)  # importing it again replaces its own entries, and raises for nobody
    assert core_algos.get_adv_estimator_fn("etrl_qae") is etrl_verl.compute_etrl_qae_advantage
    assert {"kl_cov", "clip_cov"} <= set(core_algos.POLICY_LOSS_REGISTRY)  # verl's own, not registered again


# ----------------------------------------------------------------------------------------------------------------
# The estimators against the package core, shuffled, through verl's compute_advantage

#: Mixed groups of G = 8 (0/1 rewards plus one graded group, above the default threshold 0 when right).
SCORES = [
    [1, 0, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [0.9, 0.1, 0.0, 1.1, 0.0, 0.1, 1.0, 0.0],
]


def core_expected(name: str, scores: torch.Tensor, g: int, options) -> torch.Tensor:
    """The package core's advantages for contiguous groups of `g` (the TRL trainers' layout)."""
    from exploration_trl import core
    from exploration_trl.rewards import is_correct

    correct = is_correct(scores, options.correct_reward_threshold)
    if name == "etrl_passk":
        return core.passk_advantages(correct, g, options.passk_k, scale=options.scale_rewards != "none")
    if name == "etrl_pkpo":
        return core.pkpo_advantages(scores, g, options.pkpo_k, options.pkpo_estimator, scale=options.scale_rewards)
    if name == "etrl_maxrl":
        return core.maxrl_advantages(correct, g, eps=options.maxrl_eps)
    if name == "etrl_wreinforce":
        return core.weighted_reinforce_advantages(correct, None, options.wreinforce_lambda, options.wreinforce_mode)
    return core.quantile_advantages(scores, g, k=options.qae_k, method=options.qae_quantile_method,
                                    scale=options.scale_rewards)


@verl_only
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("etrl", [{}, {"scale_rewards": "none", "correct_reward_threshold": 0.5},
                                  {"norm_adv_by_std_in_grpo": False}, {"scale_rewards": "batch"}])
def test_each_estimator_through_verls_compute_advantage_matches_the_core(name, etrl):
    from exploration_trl.integrations.verl import estimator_options

    config = algorithm_config(**etrl)
    rewards, mask, uids, scores = outcome_batch(SCORES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the all-wrong / all-right groups may warn; tested below
        per_row, adv, ret = through_verl(name, rewards, mask, uids, config)
    options = estimator_options(name, config, 8)
    expected = core_expected(name, scores, 8, options)
    torch.testing.assert_close(per_row, expected, atol=2e-6, rtol=1e-6)
    assert torch.equal(adv, per_row.unsqueeze(-1) * mask) and torch.equal(ret, adv)  # masked, returns = advantages
    assert adv.dtype == torch.float32 and adv.shape == rewards.shape


@verl_only
@pytest.mark.parametrize("name", NAMES)
def test_groups_of_unequal_size_are_found_by_uid(name):
    """Groups of 6, 4, 3 and 2 interleaved in any order: each gets what the core gives that group alone."""
    from exploration_trl.integrations.verl import estimator_options

    groups = [[1, 0, 0, 1, 0, 0], [0.5, 0.0, 1.0, 0.0], [1, 1, 0], [0, 1]]
    config = algorithm_config(passk_k=4, pkpo_k=4)
    rewards, mask, uids, scores = outcome_batch(groups, seed=3)
    per_row, _, _ = through_verl(name, rewards, mask, uids, config, seed=7)
    options = estimator_options(name, config, 6)
    start = 0
    for group in groups:
        rows = slice(start, start + len(group))
        expected = core_expected(name, scores[rows], len(group), options)
        torch.testing.assert_close(per_row[rows], expected, atol=2e-6, rtol=1e-6)
        start += len(group)


@verl_only
def test_the_v1_trainers_entry_point_delegates_to_the_same_call():
    """verl's v1 trainer (`trainer.use_v1`, the default) calls `compute_advantage_for_multi_trajectories`, which
    hands every estimator but GRPO to `compute_advantage`: the same numbers."""
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    rewards, mask, uids, _ = outcome_batch(SCORES)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    keys = [f"{u}_0_{i}" for i, u in enumerate(uids)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compute_advantage_for_multi_trajectories(data, keys, "etrl_maxrl", config=algorithm_config())
        per_row, _, _ = through_verl("etrl_maxrl", rewards, mask, uids, algorithm_config())
    assert torch.equal(out.batch["advantages"][:, 0], per_row)


# ----------------------------------------------------------------------------------------------------------------
# Hand-worked values (each paper's formula on a small group)


def _per_row(name, groups, **etrl):
    rewards, mask, uids, _ = outcome_batch(groups, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return through_verl(name, rewards, mask, uids, algorithm_config(**etrl), seed=11)[0].tolist()


@verl_only
def test_hand_worked_values():
    # MaxRL (Alg. 1, eps 0): K = 1 correct of G = 4 -> G/K - 1 = 3 for it, -1 for the wrong ones; no correct -> 0
    assert _per_row("etrl_maxrl", [[1, 0, 0, 0], [0, 0, 0, 0]], maxrl_eps=0.0) == [3, -1, -1, -1, 0, 0, 0, 0]
    # W-REINFORCE: +lambda / -1 (paper's lambda 0.1), PSR +1 / 0, NSR 0 / -1; no group statistic
    assert _per_row("etrl_wreinforce", [[1, 0], [1, 1]]) == pytest.approx([0.1, -1, 0.1, 0.1])
    assert _per_row("etrl_wreinforce", [[1, 0]], wreinforce_mode="psr") == [1, 0]
    assert _per_row("etrl_wreinforce", [[1, 0]], wreinforce_mode="nsr") == [0, -1]
    # Pass@k Training, N = 4, N_neg = 2, k = 2: R = 1 - C(2,2)/C(4,2) = 5/6; A_pos = 1 - R = 1/6,
    # A_neg = 1 - R - C(1,1)/C(3,1) = -1/6 (unscaled); divided by sigma = sqrt(R(1-R)) = sqrt(5)/6: +-1/sqrt(5)
    assert _per_row("etrl_passk", [[1, 0, 1, 0]], passk_k=2, scale_rewards="none") == pytest.approx(
        [1 / 6, -1 / 6, 1 / 6, -1 / 6], abs=1e-7)
    assert _per_row("etrl_passk", [[1, 0, 1, 0]], passk_k=2) == pytest.approx(
        [1 / math.sqrt(5), -1 / math.sqrt(5)] * 2, abs=1e-5)
    # PKPO at k = G, sloo_minus_one, unnormalised: max(g) - max(g without i), so only the best sample moves
    assert _per_row("etrl_pkpo", [[0.2, 0.9, 0.5, 0.7]], pkpo_k=4, scale_rewards="none") == pytest.approx(
        [0, 0.2, 0, 0], abs=1e-7)
    # QAE, K = 0.4, inverted CDF, G = 5: one correct -> b_K = 0, only it moves; four correct -> b_K = 1, only the
    # wrong one moves
    assert _per_row("etrl_qae", [[1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], scale_rewards="none") == [1, 0, 0, 0, 0,
                                                                                              0, 0, 0, 0, -1]


# ----------------------------------------------------------------------------------------------------------------
# Options, defaults, errors and warnings: the TRL configs'


def _trl_config(method: str, tmp_path, **kwargs):
    from exploration_trl.trainers import get_config_class

    return get_config_class(method)(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


@verl_only
def test_defaults_are_the_trl_configs(tmp_path):
    from exploration_trl.integrations.verl import ESTIMATORS, estimator_options

    for name, spec in ESTIMATORS.items():
        trl = _trl_config(spec.method, tmp_path)
        options = vars(estimator_options(name, algorithm_config(), 8))
        own = {k: v for k, v in options.items() if k not in ("num_generations", "scale_rewards")}
        assert own and own == {k: getattr(trl, k) for k in own}, name
        if "scale_rewards" in options:  # verl's norm_adv_by_std_in_grpo (default true) is TRL's default "group"
            assert options["scale_rewards"] == trl.scale_rewards == "group"
    assert estimator_options("etrl_qae", algorithm_config(norm_adv_by_std_in_grpo=False), 8).scale_rewards == "none"


#: (estimator, bad options, the group size verl sees = TRL's num_generations)
BAD = [
    ("etrl_passk", {"passk_k": 0}, 8),
    ("etrl_passk", {"passk_k": 16}, 8),
    ("etrl_pkpo", {"pkpo_k": 2.5}, 8),
    ("etrl_pkpo", {"pkpo_estimator": "loo"}, 8),
    ("etrl_pkpo", {"pkpo_estimator": "sloo", "pkpo_k": 8}, 8),
    ("etrl_maxrl", {"maxrl_eps": -1e-6}, 8),
    ("etrl_wreinforce", {"wreinforce_lambda": -0.1}, 8),
    ("etrl_wreinforce", {"wreinforce_mode": "both"}, 8),
    ("etrl_qae", {"qae_k": 1.0}, 8),
    ("etrl_qae", {"qae_quantile_method": "nearest"}, 8),
]


@verl_only
@pytest.mark.parametrize("name,bad,g", BAD, ids=[f"{n}-{'-'.join(b)}" for n, b, _ in BAD])
def test_a_bad_option_raises_the_trl_configs_error(name, bad, g, tmp_path):
    from exploration_trl.integrations.verl import ESTIMATORS

    with pytest.raises(ValueError) as trl_error:
        _trl_config(ESTIMATORS[name].method, tmp_path, num_generations=g, **bad)
    rewards, mask, uids, _ = outcome_batch([[1, 0] * (g // 2)])
    with pytest.raises(ValueError) as verl_error:
        through_verl(name, rewards, mask, uids, algorithm_config(**bad))
    assert str(trl_error.value) in str(verl_error.value) and str(verl_error.value).startswith(f"{name}: ")


@verl_only
def test_unknown_keys_and_what_verl_cannot_honour_are_errors():
    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 1]])
    with pytest.raises(ValueError, match=r"unknown key\(s\) algorithm.etrl.pass_k; the keys are .*passk_k"):
        through_verl("etrl_passk", rewards, mask, uids, algorithm_config(pass_k=2))
    with pytest.raises(ValueError, match="pkpo_k_final is not available in verl: k annealing needs the training step"):
        through_verl("etrl_pkpo", rewards, mask, uids, algorithm_config(pkpo_k_final=1))
    with pytest.raises(ValueError, match="needs their uids as `index`"):
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        get_adv_estimator_fn("etrl_maxrl")(token_level_rewards=rewards, response_mask=mask, config=algorithm_config())
    # another method's key is accepted (one etrl section serves every estimator) and ignored
    per_row, _, _ = through_verl("etrl_maxrl", rewards, mask, uids, algorithm_config(passk_k=4, maxrl_eps=0.0))
    assert per_row.tolist() == [1, -1, -1, 1]


@verl_only
def test_warnings_are_given_once_as_the_trl_trainers_give_them():
    # every completion judged correct while the rewards vary: the threshold splits nothing (the correctness guard)
    graded = [[0.2, 0.4, 0.9, 0.3]]
    rewards, mask, uids, _ = outcome_batch(graded)
    with pytest.warns(UserWarning, match=r"etrl_passk: correct_reward_threshold=0.0 splits no group: every "
                                         r"completion so far was judged correct .* Pass@k Training's advantages are "
                                         r"all 0 and it learns nothing.*\+algorithm.etrl.correct_reward_threshold"):
        through_verl("etrl_passk", rewards, mask, uids, algorithm_config(passk_k=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        through_verl("etrl_passk", rewards, mask, uids, algorithm_config(passk_k=2))  # once
        through_verl("etrl_passk", rewards, mask, uids,  # a threshold that splits the groups says nothing
                     algorithm_config(passk_k=2, correct_reward_threshold=0.5))
    # a batch whose advantages are all 0 (MaxRL: every group all wrong or all right), once per process
    rewards, mask, uids, _ = outcome_batch([[0, 0, 0, 0], [1, 1, 1, 1]])
    with pytest.warns(UserWarning, match="etrl_maxrl: in a batch of 8 completions .correct: total reward > 0.0., "
                                         "every group was all correct or all wrong"):
        through_verl("etrl_maxrl", rewards, mask, uids, algorithm_config())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        through_verl("etrl_maxrl", rewards, mask, uids, algorithm_config())
    with pytest.warns(UserWarning, match="etrl_qae: in a batch of 8 completions, every group had equal rewards"):
        through_verl("etrl_qae", rewards, mask, uids, algorithm_config())


# ----------------------------------------------------------------------------------------------------------------
# Parity with verl's built-ins (docs/verl.md's table prints what these measure)


def _report(what: str, value: float) -> None:
    print(f"[parity] {what}: {value:.3g}")


@verl_only
@pytest.mark.parametrize("norm", [True, False])
def test_verls_grpo_is_the_cores_group_advantage_at_eps_1e6(norm):
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    from exploration_trl.core import group_advantages

    g = torch.Generator().manual_seed(0)
    graded = (torch.rand(32, 8, generator=g) * (torch.rand(32, 8, generator=g) > 0.4)).tolist()
    for scores_list in (SCORES, graded):
        rewards, mask, uids, scores = outcome_batch(scores_list)
        config = algorithm_config(norm_adv_by_std_in_grpo=norm)
        per_row, _, _ = through_verl(AdvantageEstimator.GRPO, rewards, mask, uids, config)
        expected = group_advantages(scores, 8, scale="group" if norm else "none", eps=1e-6)
        diff = max_diff(per_row, expected)
        _report(f"grpo (norm_adv_by_std_in_grpo={norm}) vs core.group_advantages eps=1e-6", diff)
        assert diff <= 1e-6


@verl_only
@pytest.mark.parametrize("ties", [False, True])
def test_verls_grpo_passk_is_pkpo_at_k_equal_g_sloo_minus_one_unnormalised(ties):
    from exploration_trl.core import pkpo_advantages

    g = torch.Generator().manual_seed(1)
    scores_list = (torch.randint(0, 3, (16, 8), generator=g) / 2 if ties else torch.rand(16, 8, generator=g)).tolist()
    rewards, mask, uids, scores = outcome_batch(scores_list)
    per_row, _, _ = through_verl("grpo_passk", rewards, mask, uids, algorithm_config(norm_adv_by_std_in_grpo=False))
    expected = pkpo_advantages(scores, 8, k=8, estimator="sloo_minus_one", scale="none")
    diff = max_diff(per_row, expected)
    _report(f"grpo_passk vs core.pkpo_advantages k=G sloo_minus_one scale=none ({'ties' if ties else 'no ties'})",
            diff)
    assert diff <= 1e-6
    ours, _, _ = through_verl("etrl_pkpo", rewards, mask, uids, algorithm_config(pkpo_k=8, scale_rewards="none"))
    assert max_diff(ours, per_row) <= 1e-6


def _policy_batch(seed: int, b: int = 12, t: int = 20):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, t + 1, (b,), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    old = -1 - torch.rand(b, t, generator=g) * 3  # continuous log-probs: no two tokens' covariances tie
    logp = old + 0.3 * torch.randn(b, t, generator=g)
    adv = (torch.randn(b, 1, generator=g) * 2).expand(b, t).contiguous() * mask
    return old, logp, adv, mask


def _actor_config(**policy_loss):
    """verl's actor config as its loss functions read it (`policy_loss.*`, the clip ratios, `global_batch_info`)."""
    from omegaconf import OmegaConf

    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                             "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0,
                                             "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1,
                                             **policy_loss},
                             "global_batch_info": {}})


def _value_and_grad(fn, logp):
    x = logp.clone().requires_grad_(True)
    loss = fn(x)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


@verl_only
@pytest.mark.parametrize("ratio,coef", [(0.0002, 0.1), (0.05, 1.0), (0.2, 0.5)])
def test_verls_kl_cov_is_the_packages_loss_in_value_and_gradient(ratio, coef):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from exploration_trl.core import kl_cov_per_token_loss, kl_cov_select, masked_mean

    worst_value = worst_grad = 0.0
    for seed in range(5):
        old, logp, adv, mask = _policy_batch(seed)
        config = _actor_config(loss_mode="kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef)
        v_loss, v_grad = _value_and_grad(
            lambda x, old=old, adv=adv, mask=mask, config=config:
            get_policy_loss_fn("kl_cov")(old, x, adv, mask, "token-mean", config)[0], logp)
        p_loss, p_grad = _value_and_grad(
            lambda x, old=old, adv=adv, mask=mask:
            masked_mean(kl_cov_per_token_loss(x, old, adv, mask, kl_cov_ratio=ratio, kl_coef=coef), mask), logp)
        assert kl_cov_select(logp, adv, mask, ratio).sum() >= 1
        worst_value = max(worst_value, abs(float(v_loss) - float(p_loss)))
        worst_grad = max(worst_grad, max_diff(v_grad, p_grad))
    _report(f"kl_cov ratio={ratio} coef={coef}: loss value", worst_value)
    _report(f"kl_cov ratio={ratio} coef={coef}: gradient", worst_grad)
    assert worst_value <= 1e-6 and worst_grad <= 1e-7


@verl_only
def test_with_tied_covariances_kl_cov_may_pick_other_tokens_among_the_tied_ones():
    """Log-probs clamped at 0 tie many covariances (same row, same advantage): both take the same number of tokens,
    but `torch.topk` breaks the tie over a different layout (verl: the valid tokens packed; the package: the padded
    grid), so the chosen tokens, and the loss, may differ there. The only difference found between the two."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from exploration_trl.core import kl_cov_per_token_loss, masked_mean

    worst = 0.0
    for seed in range(5):
        old, logp, adv, mask = _policy_batch(seed)
        logp = logp.clamp(max=-1.0)  # ties: every clamped token of a row has the same covariance
        config = _actor_config(loss_mode="kl_cov", kl_cov_ratio=0.05, ppo_kl_coef=1.0)
        v = get_policy_loss_fn("kl_cov")(old, logp, adv, mask, "token-mean", config)[0]
        p = masked_mean(kl_cov_per_token_loss(logp, old, adv, mask, kl_cov_ratio=0.05, kl_coef=1.0), mask)
        worst = max(worst, abs(float(v) - float(p)))
    _report("kl_cov with tied covariances: loss value", worst)
    assert worst < 1e-2


@verl_only
@pytest.mark.parametrize("ratio", [0.0002, 0.05, 0.3])
def test_verls_clip_cov_with_the_same_seed_is_the_packages_loss_in_value_and_gradient(ratio):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from exploration_trl.core import clip_cov_per_token_loss, clip_cov_select, masked_mean

    worst_value = worst_grad = 0.0
    for seed in range(5):
        old, logp, adv, mask = _policy_batch(seed)
        config = _actor_config(loss_mode="clip_cov", clip_cov_ratio=ratio)

        def verl_loss(x, old=old, adv=adv, mask=mask, config=config, seed=seed):
            torch.manual_seed(100 + seed)  # verl draws its tokens with torch's global generator
            return get_policy_loss_fn("clip_cov")(old, x, adv, mask, "token-mean", config)[0]

        def package_loss(x, old=old, adv=adv, mask=mask, seed=seed):
            gen = torch.Generator().manual_seed(100 + seed)
            return masked_mean(clip_cov_per_token_loss(x, old, adv, mask, clip_cov_ratio=ratio, epsilon_low=0.2,
                                                       epsilon_high=0.28, generator=gen), mask)

        v_loss, v_grad = _value_and_grad(verl_loss, logp)
        p_loss, p_grad = _value_and_grad(package_loss, logp)
        cut = clip_cov_select(logp, old, adv, mask, ratio, epsilon_low=0.2, epsilon_high=0.28,
                              generator=torch.Generator().manual_seed(100 + seed))
        assert cut.sum() >= 1  # some token's gradient is cut, so the draw matters
        worst_value = max(worst_value, abs(float(v_loss) - float(p_loss)))
        worst_grad = max(worst_grad, max_diff(v_grad, p_grad))
    _report(f"clip_cov ratio={ratio} (same seed): loss value", worst_value)
    _report(f"clip_cov ratio={ratio} (same seed): gradient", worst_grad)
    assert worst_value <= 1e-6 and worst_grad <= 1e-7


# ----------------------------------------------------------------------------------------------------------------
# Hydra: verl's ppo_trainer config with a user's overrides, and a user's YAML on top of it


def _compose(overrides, config_dir: Path | None = None, name: str = "ppo_trainer"):
    from hydra import compose, initialize_config_dir, initialize_config_module

    init = (initialize_config_dir(config_dir=str(config_dir), version_base=None) if config_dir
            else initialize_config_module(config_module="verl.trainer.config", version_base=None))
    with init:
        return compose(config_name=name, overrides=overrides)


def _as_the_trainer_calls_it(cfg, rewards, mask, uids):
    """`_compute_advantage` of verl's v1 trainer, the lines that pick and call the estimator, on a DataProto."""
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=[f"{u}_0_{i}" for i, u in enumerate(uids)],
        adv_estimator=cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam,
        num_repeat=cfg.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=cfg.algorithm.get("norm_adv_by_std_in_grpo", True), config=cfg.algorithm)
    return out.batch["advantages"][:, 0]


@verl_only
def test_a_hydra_compose_of_ppo_trainer_with_a_users_overrides_reaches_the_estimator():
    from hydra.errors import ConfigCompositionException

    cfg = _compose(["algorithm.adv_estimator=etrl_maxrl", "+algorithm.etrl.passk_k=4", "+algorithm.etrl.maxrl_eps=0",
                    "actor_rollout_ref.rollout.n=4"])
    assert cfg.algorithm.adv_estimator == "etrl_maxrl" and cfg.algorithm.etrl.maxrl_eps == 0
    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 0], [1, 1, 0, 0]])
    assert _as_the_trainer_calls_it(cfg, rewards, mask, uids).tolist() == [3, -1, -1, -1, 1, 1, -1, -1]
    # without "+" Hydra refuses a key verl's config does not have: the docs' lines carry it
    with pytest.raises(ConfigCompositionException, match="etrl"):
        _compose(["algorithm.adv_estimator=etrl_maxrl", "algorithm.etrl.maxrl_eps=0"])
    # only the estimator's name: the TRL config's defaults (MaxRL's eps 1e-6)
    cfg = _compose(["algorithm.adv_estimator=etrl_maxrl"])
    assert _as_the_trainer_calls_it(cfg, rewards, mask, uids)[0].item() == pytest.approx((1 - 0.25) / (0.25 + 1e-6))


@verl_only
def test_a_users_yaml_on_top_of_ppo_trainer(tmp_path):
    """The YAML form of docs/verl.md: a config that extends verl's `ppo_trainer` and sets the `etrl` section."""
    (tmp_path / "my_run.yaml").write_text(
        "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "algorithm:\n  adv_estimator: etrl_passk\n  etrl:\n    passk_k: 2\n    scale_rewards: none\n", encoding="utf-8")
    cfg = _compose([], config_dir=tmp_path, name="my_run")
    assert cfg.algorithm.etrl.passk_k == 2 and cfg.algorithm.gamma == 1.0  # verl's own keys are still there
    rewards, mask, uids, _ = outcome_batch([[1, 0, 1, 0]])
    assert _as_the_trainer_calls_it(cfg, rewards, mask, uids).tolist() == pytest.approx([1 / 6, -1 / 6] * 2, abs=1e-7)
