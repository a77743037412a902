"""The methods inside verl (`exploration_trl.integrations.verl`, docs/verl.md), on a CPU with verl installed.

The tests marked `verl` run in .venv-verl (`bash scripts/install_verl_cpu.sh`, then
`.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_integration.py`; CI's stage 3); the main suite deselects
them. What they prove:
- a plain `import verl` registers every `etrl_*` name (the `verl.plugins` entry point), in a fresh interpreter, and a
  plugin that fails to import says so on stderr and under every name;
- each estimator, called through verl's own `compute_advantage` on a `DataProto` whose rows are shuffled (as verl's
  batch balancing leaves them), returns the package core's numbers, also for groups of unequal size, and the
  hand-worked values of each paper's formula;
- options, defaults, errors and warnings are the TRL configs';
- verl's built-ins agree with the package where both have the method: `grpo` with the core's GRPO advantage at
  eps 1e-6, the `kl_cov` and seeded `clip_cov` policy losses in value and gradient, `grpo_passk` with PKPO at k = G
  (`sloo_minus_one`, unnormalised); each test prints the largest difference it measured (docs/verl.md's table);
- a Hydra compose of verl's `ppo_trainer` config with the overrides a user writes reaches the estimator;
- issue 65: rewards carrying verl's KL penalty are refused where correctness is judged (1), groups of one get 0 and
  a batch of them is refused (2), the `check` command and the Hydra callback stop a bad run before verl starts (3),
  a failed import is loud (4), a value of the wrong type is a one-line error naming key, value and type (5), agent
  loops with several outputs per session are refused (6), no estimator loops over groups or reads the device back
  (7), STILL's position bonus runs and the methods that cannot say why (8); MaxRL's Thm. 2 conditions are warned from
  verl's config, and QAE's eps is an option (issue 67).
The tests without the marker run in the main suite and need no verl (the docs' generated tables among them).
With `ETRL_VERL_PARITY_JSON=<path>` set, the parity tests write what they measure there
(benchmarks/verl_parity.json, docs/verl.md's parity table).
"""

from __future__ import annotations

import configparser
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMES = ["etrl_passk", "etrl_pkpo", "etrl_maxrl", "etrl_wreinforce", "etrl_qae"]  #: the outcome estimators
verl_only = pytest.mark.verl
#: Seconds a test's child interpreter may take (each imports verl: a few seconds on an idle core, minutes on a busy
#: one).
SUBPROCESS_TIMEOUT = 1200


def _all_names() -> list[str]:
    """Every name the plugin registers: the estimators, and those that raise why a method cannot run in verl."""
    from exploration_trl.integrations.verl_reference import REDIRECTS, REGISTERED, UNAVAILABLE

    return [*REGISTERED, *UNAVAILABLE, *REDIRECTS]


ALL_NAMES = _all_names()


def test_the_package_declares_the_plugin_and_the_extra():
    """Installing the package is enough: setup.cfg names the module as a `verl.plugins` entry point, and the `verl`
    extra pins verl 0.9.x (main suite, no verl needed)."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    plugins = [line.strip() for line in cfg["options.entry_points"]["verl.plugins"].strip().splitlines()]
    assert plugins == ["exploration_trl = exploration_trl.integrations.verl"]
    assert (REPO_ROOT / "exploration_trl" / "integrations" / "verl" / "__init__.py").is_file()
    assert cfg["options.extras_require"]["verl"].split() == ["verl>=0.9,<0.10"]
    run = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ".venv-verl/bin/python -m pytest -q -m verl tests/test_verl_integration.py" in run


def test_the_docs_defaults_are_the_trl_configs():
    """docs/verl.md's table of names gives each option's default as the TRL config's field default (main suite)."""
    import dataclasses

    from exploration_trl.trainers import get_config_class

    from exploration_trl.integrations.verl_reference import REGISTERED

    text = (REPO_ROOT / "docs" / "verl.md").read_text(encoding="utf-8")
    table = text.split("## What each name computes")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `etrl_")]
    assert [re.match(r"\| `(etrl_\w+)`", row).group(1) for row in rows] == list(REGISTERED)
    for row in rows:
        name = re.match(r"\| `(etrl_\w+)`", row).group(1)
        method = "grpo" if name == "etrl_position_bonus" else name.removeprefix("etrl_")  # the base config's keys
        defaults = {f.name: f.default for f in dataclasses.fields(get_config_class(method))}
        defaults.setdefault("position_bonus_base", "grpo")  # the plugin's own key
        given = re.findall(r"`(\w+)=([^`]+)`", row.split("|")[-2])
        assert given and all(str(defaults[key]) == value for key, value in given), (name, given)


def test_the_docs_generated_tables_are_the_generators_output(tmp_path, capsys):
    """docs/verl.md's tables of what cannot go in, of the benchmark and of the parity measurements are
    `verl_reference`'s rendering of its table and of the two JSON files (main suite, no verl needed); its `--check`
    passes on the repository and fails, naming the fix, on a copy whose benchmark JSON says something else."""
    import json
    import shutil

    from exploration_trl.integrations import verl_reference

    doc = (REPO_ROOT / "docs" / "verl.md").read_text(encoding="utf-8")
    assert verl_reference.render(REPO_ROOT) == doc, f"docs/verl.md is out of date: run `{verl_reference.COMMAND}`"
    assert verl_reference.main(["--root", str(REPO_ROOT), "--check"]) == 0
    for block, first in (("verl-unavailable", "| `etrl_progrpo` |"), ("verl-benchmark", "| `grpo` |"),
                         ("verl-parity", "| the five outcome `etrl_*` estimators")):
        body = doc.split(f"<!-- {block}:start -->")[1].split(f"<!-- {block}:end -->")[0]
        assert first in body, block  # each block holds its table, not an empty placeholder
    data = json.loads((REPO_ROOT / verl_reference.BENCHMARK_JSON).read_text(encoding="utf-8"))
    median = data["results"][2]["median_s"]
    assert f"| {verl_reference._seconds(median)} |" in doc  # a number of the JSON is in the table
    for rel in (verl_reference.DOC, verl_reference.BENCHMARK_JSON, verl_reference.PARITY_JSON):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, tmp_path / rel)
    data["results"][2]["median_s"] = median * 3 + 1.0
    (tmp_path / verl_reference.BENCHMARK_JSON).write_text(json.dumps(data), encoding="utf-8")
    capsys.readouterr()
    assert verl_reference.main(["--root", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().err.strip() == f"docs/verl.md out of date: run `{verl_reference.COMMAND}`"
    assert verl_reference.main(["--root", str(tmp_path)]) == 0  # regenerates the copy, which then passes
    assert verl_reference.main(["--root", str(tmp_path), "--check"]) == 0
    assert f"| {verl_reference._seconds(median * 3 + 1.0)} |" in (tmp_path / verl_reference.DOC).read_text("utf-8")


def test_the_benchmark_json_says_where_it_was_measured_and_meets_the_goal():
    """benchmarks/verl_estimators.json (benchmarks/verl_estimators.py, in .venv-verl): the CPU model and the load beside
    the numbers, each estimator against verl's grpo in the same paired repeats, every one within 2x of it."""
    import json

    data = json.loads((REPO_ROOT / "benchmarks" / "verl_estimators.json").read_text(encoding="utf-8"))
    assert data["machine"]["cpu"] and data["machine"]["cores"] >= 1 and data["load"]
    assert data["batch"]["prompts"] * data["batch"]["rows_per_prompt"] == 512 * 16 and data["repeats"] >= 5
    names = [r["name"] for r in data["results"]]
    assert names[0] == "grpo" and set(NAMES) <= set(names)
    for r in data["results"]:
        assert r["min_s"] <= r["median_s"] and r["median_ratio"] <= 2.0, r


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
                         timeout=SUBPROCESS_TIMEOUT).stdout.splitlines()
    assert out[-2] == str(sorted(ALL_NAMES))
    # registered by this package; the TRL side is not imported until an estimator is first called
    assert out[-1] == "exploration_trl.integrations.verl._estimators False"


@verl_only
def test_with_plugins_off_verls_external_modules_route_registers_them():
    """`VERL_USE_EXTERNAL_PLUGINS=none` turns entry points off; `VERL_USE_EXTERNAL_MODULES` (also what
    `actor_rollout_ref.model.external_lib` does in the workers) is the other route, and registers the same names."""
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\n"
            "print(sorted(n for n in R if n.startswith('etrl_')))\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    envs = ({**base, "VERL_USE_EXTERNAL_PLUGINS": "none"},
            {**base, "VERL_USE_EXTERNAL_PLUGINS": "none",
             "VERL_USE_EXTERNAL_MODULES": "exploration_trl.integrations.verl"})
    # the two interpreters side by side: each spends its time importing verl
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for env in envs]
    (off, off_err), (on, on_err) = (proc.communicate(timeout=SUBPROCESS_TIMEOUT) for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0], (off_err[-2000:], on_err[-2000:])
    assert off.splitlines()[-1] == "[]"
    assert on.splitlines()[-1] == str(sorted(ALL_NAMES))


@verl_only
def test_the_names_resolve_through_verls_registry_and_collide_with_nothing_of_verls():
    import importlib

    import verl  # noqa: F401
    from verl.trainer.ppo import core_algos

    from exploration_trl.integrations import verl as etrl_verl
    from exploration_trl.integrations.verl_reference import REGISTERED

    assert set(etrl_verl.ESTIMATORS) == set(REGISTERED) == set(NAMES) | {"etrl_position_bonus"}
    builtin = {e.value for e in core_algos.AdvantageEstimator}
    assert not builtin & set(ALL_NAMES) and {"grpo", "grpo_passk"} <= builtin
    for name in REGISTERED:
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
    _report(f"{name} {etrl} through verl vs the core", max_diff(per_row, expected), key="etrl-vs-core",
            verl="the five outcome `etrl_*` estimators, through `compute_advantage`, rows shuffled",
            package="the core functions on contiguous groups",
            batches="advantages, the 5 groups of 8 of SCORES, four option sets each")
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
        given = {"position_bonus_gamma": 0.1} if name == "etrl_position_bonus" else {}  # 0, its default, adds nothing
        options = vars(estimator_options(name, algorithm_config(**given), 8))
        own = {k: v for k, v in options.items()
               if k not in ("num_generations", "scale_rewards", "position_bonus_base", *given)}
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


_RECORDED: set[str] = set()


def _report(what: str, value: float, *, key: str | None = None, verl: str = "", package: str = "",
            batches: str = "") -> None:
    """Print a measured difference; with `ETRL_VERL_PARITY_JSON` set, also keep the largest one per `key` measured in
    this session in that JSON file (benchmarks/verl_parity.json renders docs/verl.md's parity table)."""
    print(f"[parity] {what}: {value:.3g}")
    path = os.environ.get("ETRL_VERL_PARITY_JSON")
    if not path or key is None:
        return
    import json
    import platform
    from datetime import date

    import verl as verl_package

    file = Path(path)
    data = json.loads(file.read_text(encoding="utf-8")) if file.exists() else {"results": []}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    data.update(date=date.today().isoformat(), verl=verl_package.__version__, torch=torch.__version__, cpu=cpu)
    rows = {r["key"]: r for r in data["results"]}
    row = rows.get(key)
    if row is None or key not in _RECORDED:  # the first measurement of this session replaces an older one
        row = rows[key] = {"key": key, "verl": verl, "package": package, "batches": batches, "max_diff": value}
    row["max_diff"] = max(row["max_diff"], value)
    _RECORDED.add(key)
    data["results"] = list(rows.values())
    file.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


@verl_only
@pytest.mark.parametrize("norm", [True, False])
def test_verls_grpo_is_the_cores_group_advantage_at_eps_1e6(norm):
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    from exploration_trl.core import group_advantages

    g = torch.Generator().manual_seed(0)
    graded = (torch.rand(32, 8, generator=g) * (torch.rand(32, 8, generator=g) > 0.4)).tolist()
    scale = "group" if norm else "none"
    for label, scores_list in (("the 5 groups of SCORES (mostly 0/1)", SCORES),
                               ("32 groups of 8 random graded rewards, 40% of them 0", graded)):
        rewards, mask, uids, scores = outcome_batch(scores_list)
        config = algorithm_config(norm_adv_by_std_in_grpo=norm)
        per_row, _, _ = through_verl(AdvantageEstimator.GRPO, rewards, mask, uids, config)
        expected = group_advantages(scores, 8, scale=scale, eps=1e-6)
        diff = max_diff(per_row, expected)
        _report(f"grpo (norm_adv_by_std_in_grpo={norm}) vs core.group_advantages eps=1e-6", diff,
                key=f"grpo-{scale}-{label[:6]}",
                verl=f"`grpo` (ε 1e-6), `norm_adv_by_std_in_grpo={str(norm).lower()}`",
                package=f"`core.group_advantages(..., scale=\"{scale}\", eps=1e-6)`", batches=f"advantages, {label}")
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
            diff, key=f"grpo_passk-{ties}", verl="`grpo_passk`, `norm_adv_by_std_in_grpo=false`",
            package="`core.pkpo_advantages(k=G, \"sloo_minus_one\", scale=\"none\")`, and `etrl_pkpo`",
            batches=f"advantages, 16 groups of 8 graded rewards {'in steps of 0.5 (ties)' if ties else 'in [0, 1)'}")
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
    batches = "5 seeded batches of 12 rows × 20 tokens, ratios 0.0002, 0.05, 0.2"
    _report(f"kl_cov ratio={ratio} coef={coef}: loss value", worst_value, key="kl_cov-value", verl="`kl_cov` loss",
            package="`core.kl_cov_per_token_loss`, token mean", batches=f"loss value, {batches}")
    _report(f"kl_cov ratio={ratio} coef={coef}: gradient", worst_grad, key="kl_cov-grad", verl="`kl_cov` loss",
            package="`core.kl_cov_per_token_loss`, token mean", batches=f"gradient in the log-probs, {batches}")
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
    _report("kl_cov with tied covariances: loss value", worst, key="kl_cov-ties",
            verl="`kl_cov` loss, tied covariances", package="`core.kl_cov_per_token_loss`",
            batches="loss value, the same 5 batches with log-probs clamped at -1 "
            "(ties; `torch.topk` breaks them over another layout, so other tokens among the tied ones)")
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
    batches = "5 seeded batches of 12 rows × 20 tokens, ratios 0.0002, 0.05, 0.3, one seed for both"
    _report(f"clip_cov ratio={ratio} (same seed): loss value", worst_value, key="clip_cov-value",
            verl="`clip_cov` loss", package="`core.clip_cov_per_token_loss`, a generator of the same seed",
            batches=f"loss value, {batches}")
    _report(f"clip_cov ratio={ratio} (same seed): gradient", worst_grad, key="clip_cov-grad",
            verl="`clip_cov` loss", package="`core.clip_cov_per_token_loss`, a generator of the same seed",
            batches=f"gradient in the log-probs, {batches}")
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
    cfg = _compose(["algorithm.adv_estimator=etrl_maxrl", "actor_rollout_ref.rollout.n=4"])
    assert _as_the_trainer_calls_it(cfg, rewards, mask, uids)[0].item() == pytest.approx((1 - 0.25) / (0.25 + 1e-6))


@verl_only
def test_a_users_yaml_on_top_of_ppo_trainer(tmp_path):
    """The YAML form of docs/verl.md: a config that extends verl's `ppo_trainer` and sets the `etrl` section."""
    (tmp_path / "my_run.yaml").write_text(
        "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "algorithm:\n  adv_estimator: etrl_passk\n  etrl:\n    passk_k: 2\n    scale_rewards: none\n"
        "actor_rollout_ref:\n  rollout:\n    n: 4\n", encoding="utf-8")
    cfg = _compose([], config_dir=tmp_path, name="my_run")
    assert cfg.algorithm.etrl.passk_k == 2 and cfg.algorithm.gamma == 1.0  # verl's own keys are still there
    rewards, mask, uids, _ = outcome_batch([[1, 0, 1, 0]])
    assert _as_the_trainer_calls_it(cfg, rewards, mask, uids).tolist() == pytest.approx([1 / 6, -1 / 6] * 2, abs=1e-7)


# ----------------------------------------------------------------------------------------------------------------
# Issue 65, second pass


def _fresh_python(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
                          check=False, env={**base, **env}, cwd=REPO_ROOT)


@verl_only
def test_1_rewards_with_verls_kl_penalty_are_refused_where_correctness_is_judged():
    """With `use_kl_in_reward`, verl's own `apply_kl_penalty` subtracts beta * k1 from the scores before the estimator
    sees them: a wrong answer whose k1 sums to -3 (beta 0.001) reaches the estimator at +0.003, above the default
    threshold 0. The estimators that judge correctness refuse the combination with the fix; PKPO and QAE, which
    transform the rewards as verl's grpo does, take them."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import FixedKLController
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage

    scores = torch.zeros(4, 3)
    scores[0, 2] = 1.0  # [1, 0, 0, 0]: one correct of four
    old = torch.zeros(4, 3)
    ref = torch.zeros(4, 3)
    ref[2] = 1.0  # row 2 (wrong): k1 = old - ref = -1 per token, -3 in all
    data = DataProto.from_dict(tensors={"token_level_scores": scores, "response_mask": torch.ones(4, 3),
                                        "old_log_probs": old, "ref_log_prob": ref},
                               non_tensors={"uid": np.array(["a"] * 4, dtype=object)})
    data, _ = apply_kl_penalty(data, kl_ctrl=FixedKLController(0.001), kl_penalty="kl")
    summed = data.batch["token_level_rewards"].sum(-1)
    assert summed[2].item() == pytest.approx(0.003) and summed[2].item() > 0  # the wrong answer now looks correct
    config = algorithm_config(maxrl_eps=0.0)
    config.use_kl_in_reward = True
    for name in ("etrl_maxrl", "etrl_passk", "etrl_wreinforce"):
        with pytest.raises(ValueError) as error:
            compute_advantage(data, adv_estimator=name, config=config)
        message = str(error.value)
        assert "\n" not in message and message.startswith(f"{name}: algorithm.use_kl_in_reward=true")
        assert "set algorithm.use_kl_in_reward=false" in message
    for name in ("etrl_pkpo", "etrl_qae"):
        compute_advantage(data, adv_estimator=name, config=config)  # the penalised rewards, as verl's grpo takes them
    config.use_kl_in_reward = False  # without the penalty the scores decide: [3, -1, -1, -1]
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    out = compute_advantage(data, adv_estimator="etrl_maxrl", config=config)
    assert out.batch["advantages"][:, 0].tolist() == [3, -1, -1, -1]


@verl_only
def test_2_groups_of_one_get_0_and_a_batch_of_them_is_refused():
    """One rule: a group of one completion gets 0 from every group-relative estimator (it has nothing to be compared
    with; TRL's GRPO gives it 0 too), whatever the options; W-REINFORCE, which uses no group statistic, gives it its
    usual lambda / -1. When every group is of one (rollout.n = 1) the group-relative ones refuse."""
    groups = [[1, 0, 0, 1], [0.7], [0.0], [1]]
    for name in NAMES:
        for etrl in ({}, {"scale_rewards": "none"}, {"scale_rewards": "batch"}, {"pkpo_k": 1, "passk_k": 1}):
            if "scale_rewards" in etrl and name in ("etrl_maxrl", "etrl_wreinforce"):
                continue
            per_row = _per_row(name, groups, **etrl)
            singles = per_row[4:]
            expected = {"etrl_wreinforce": [0.1, -1, 0.1]}.get(name, [0, 0, 0])
            assert singles == pytest.approx(expected), (name, etrl, singles)
    # PKPO, rollout.n = 1, k = 1 (the case): was the reward x 1e4; now refused
    rewards, mask, uids, _ = outcome_batch([[0.7], [0.2], [1.0]])
    for name in ("etrl_passk", "etrl_pkpo", "etrl_maxrl", "etrl_qae"):
        with pytest.raises(ValueError, match=rf"^{name} compares the completions of a prompt, and every uid group "
                                             r"holds one completion .*Set actor_rollout_ref.rollout.n >= 2$"):
            through_verl(name, rewards, mask, uids, algorithm_config(pkpo_k=1, passk_k=1))
    assert through_verl("etrl_wreinforce", rewards, mask, uids, algorithm_config())[0].tolist() == pytest.approx(
        [0.1, 0.1, 0.1])


@verl_only
def test_3_the_check_command_reads_a_runs_overrides_before_anything_starts(tmp_path, capsys, monkeypatch):
    """`python -m exploration_trl.integrations.verl check <overrides>`: exit 0 and the options for a good run, 1 and
    the estimator's one-line error for a bad key or value, 2 for what Hydra itself refuses; warnings on stderr. The
    command once as `python -m` runs it (`runpy`, the package's `__main__`, from another directory), the other cases
    through its `main`, all in this process: a fresh interpreter would only import verl again."""
    import runpy

    from exploration_trl.integrations.verl._check import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["python -m exploration_trl.integrations.verl", "check",
                                      "algorithm.adv_estimator=etrl_pkpo", "+algorithm.etrl.pkpo_k=4",
                                      "actor_rollout_ref.rollout.n=8"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("exploration_trl.integrations.verl", run_name="__main__", alter_sys=True)
    out = capsys.readouterr()
    assert exited.value.code == 0, out.err[-2000:]
    assert out.out.startswith("ok: etrl_pkpo (pkpo_estimator=sloo_minus_one, pkpo_k=4, ")
    assert out.out.strip().endswith("scale_rewards=group; actor_rollout_ref.rollout.n=8)")

    def check(*argv):
        code = main(["check", *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, _, err = check("algorithm.adv_estimator=etrl_pkpo", "+algorithm.etrl.pkpo_kk=4")
    assert code == 1 and err.startswith("error: etrl_pkpo: unknown key(s) algorithm.etrl.pkpo_kk; the keys are ")
    code, _, err = check("algorithm.adv_estimator=etrl_passk", "+algorithm.etrl.passk_k=16",
                         "actor_rollout_ref.rollout.n=8")
    assert code == 1 and "passk_k is 16 but num_generations is 8" in err
    code, _, err = check("algorithm.adv_estimator=etrl_maxrl", "algorithm.use_kl_in_reward=true")
    assert code == 1 and "algorithm.use_kl_in_reward=true" in err
    code, _, err = check("algorithm.adv_estimator=etrl_pkpo", "+algorithm.etrl.pkpo_k=four")
    assert code == 1 and err == ("error: etrl_pkpo: algorithm.etrl.pkpo_k='four' is a string, but pkpo_k takes an "
                                 "integer (int)\n")
    code, _, err = check("algorithm.adv_estimator=etrl_maxrI")  # a capital I for an l
    assert code == 1 and "etrl_maxrI is no estimator of exploration-trl's" in err
    code, _, err = check("algorithm.adv_estimator=etrl_progrpo")
    assert code == 1 and err.startswith("error: etrl_progrpo: ProGRPO (ARM) cannot run in verl: it needs ")
    code, _, err = check("algorithm.adv_estimator=etrl_pkpo", "algorithm.etrl.pkpo_k=4")  # no "+"
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1
    code, out, err = check("algorithm.adv_estimator=etrl_maxrl", "actor_rollout_ref.rollout.n=4")  # verl's defaults:
    assert code == 0 and out.startswith("ok: etrl_maxrl")  # a mini-batch of 256 prompts of a train batch of 1,024,
    assert "warning: etrl_maxrl: actor_rollout_ref.actor.ppo_mini_batch_size=256" in err  # which breaks Thm. 2
    (tmp_path / "my_run.yaml").write_text(
        "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "algorithm:\n  adv_estimator: etrl_qae\n  etrl:\n    qae_k: 1.5\n", encoding="utf-8")
    code, _, err = check("--config-path", str(tmp_path), "--config-name", "my_run")
    assert code == 1 and "qae_k is 1.5 but must lie in (0, 1)" in err


@verl_only
def test_3_the_hydra_callback_stops_verls_own_main_before_ray_starts(tmp_path):
    """On verl's command line, `+hydra.callbacks.etrl_check._target_=...CheckOptions` checks the composed config in
    the driver before `main_ppo` runs: a bad value stops the run at once (exit 1, the one-line error), before
    verl's config validation or `ray.init`."""
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=etrl_pkpo",
         "+algorithm.etrl.pkpo_k=four", f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null",
         "+hydra.callbacks.etrl_check._target_=exploration_trl.integrations.verl.CheckOptions"],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, check=False, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert ("exploration-trl: etrl_pkpo: algorithm.etrl.pkpo_k='four' is a string, but pkpo_k takes an integer (int)"
            in proc.stderr.splitlines())
    assert "ray init" not in proc.stdout and "validate_config" not in proc.stdout
    # a good config passes, with the warnings on stderr
    from exploration_trl.integrations.verl import CheckOptions

    CheckOptions().on_job_start(config=_compose(["algorithm.adv_estimator=etrl_pkpo", "actor_rollout_ref.rollout.n=8"]),
                                task_function=None)


@verl_only
def test_4_a_plugin_that_fails_to_import_says_so_and_under_every_name():
    """verl's loader logs a plugin's import error at debug level only; the plugin prints it to stderr, and every
    etrl_* name raises it instead of verl's "Unknown advantage estimator"."""
    code = ("import sys\n"
            "sys.modules['exploration_trl.integrations.verl._estimators'] = None  # its import now fails\n"
            "import verl\n"
            "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "try:\n"
            "    get_adv_estimator_fn('etrl_maxrl')(token_level_rewards=None, response_mask=None)\n"
            "except RuntimeError as e:\n"
            "    print('RAISED', e)\n")
    proc = _fresh_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loud = [line for line in proc.stderr.splitlines() if "failed to import" in line]
    cause = "ModuleNotFoundError: import of exploration_trl.integrations.verl._estimators halted"
    assert loud and loud[0].startswith("exploration-trl's verl plugin (exploration_trl.integrations.verl) failed to "
                                       f"import: {cause}") and "Every etrl_* estimator will raise" in loud[0]
    raised = [line for line in proc.stdout.splitlines() if line.startswith("RAISED")]
    assert raised and f"failed to import: {cause}" in raised[0]


#: (key, the value as written on Hydra's command line, the estimator that reads it, what the key takes)
WRONG_TYPES = [
    ("maxrl_eps", "abc", "etrl_maxrl", "a number (float)"),
    ("qae_k", "abc", "etrl_qae", "a number (float)"),
    ("qae_k", "null", "etrl_qae", "a number (float)"),
    ("qae_eps", "abc", "etrl_qae", "a number (float)"),
    ("correct_reward_threshold", "abc", "etrl_maxrl", "a number (float)"),
    ("correct_reward_threshold", "true", "etrl_passk", "a number (float)"),
    ("pkpo_k", "four", "etrl_pkpo", "an integer (int)"),
    ("passk_k", "null", "etrl_passk", "an integer (int)"),
    ("wreinforce_lambda", "abc", "etrl_wreinforce", "a number (float)"),
    ("wreinforce_mode", "1", "etrl_wreinforce", "a string (str)"),
    ("scale_rewards", "false", "etrl_qae", "a string (str)"),
]


@verl_only
@pytest.mark.parametrize("key,written,name,takes", WRONG_TYPES, ids=[f"{k}={w}" for k, w, _, _ in WRONG_TYPES])
def test_5_a_value_of_the_wrong_type_is_a_one_line_error_naming_key_value_and_type(key, written, name, takes):
    cfg = _compose([f"algorithm.adv_estimator={name}", f"+algorithm.etrl.{key}={written}",
                    "actor_rollout_ref.rollout.n=4"])
    value = cfg.algorithm.etrl[key]
    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 1]])
    with pytest.raises(ValueError) as error:
        _as_the_trainer_calls_it(cfg, rewards, mask, uids)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{name}: algorithm.etrl.{key}={value!r} is ") and f"but {key} takes {takes}" in message


@verl_only
def test_6_agent_loops_with_several_outputs_per_session_are_refused():
    """verl's v1 trainer keys rows `{uid}_{session}_{output}`; for grpo it keeps each session's last output, but it
    hands every other estimator all rows, with the session's reward on each. An etrl_* estimator cannot see sessions,
    so a uid group larger than actor_rollout_ref.rollout.n is refused; one output per session runs."""
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    cfg = _compose(["algorithm.adv_estimator=etrl_maxrl", "actor_rollout_ref.rollout.n=4",
                    "+algorithm.etrl.position_bonus_gamma=0.1"])
    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 0, 1]])  # 4 sessions, the first with two outputs
    keys = ["a_0_0", "a_1_0", "a_2_0", "a_3_0", "a_0_1"]
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})
    for name in (*NAMES, "etrl_position_bonus"):
        cfg.algorithm.adv_estimator = name
        with pytest.raises(ValueError, match=rf"^{name}: a uid group holds 5 rows .* but actor_rollout_ref.rollout.n "
                                             r"is 4: the agent loop returned several outputs per session"):
            compute_advantage_for_multi_trajectories(data, keys, name, num_repeat=4, config=cfg.algorithm)
    grpo = compute_advantage_for_multi_trajectories(data, keys, "grpo", num_repeat=4, config=cfg.algorithm)
    assert grpo.batch["advantages"][0, 0] == grpo.batch["advantages"][4, 0]  # verl's: the session's last output
    one_each = DataProto.from_dict(tensors={"token_level_rewards": rewards[:4], "response_mask": mask[:4]},
                                   non_tensors={"uid": uids[:4]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compute_advantage_for_multi_trajectories(one_each, keys[:4], "etrl_maxrl", num_repeat=4,
                                                       config=cfg.algorithm)
    assert out.batch["advantages"][:, 0].tolist() == pytest.approx([3, -1, -1, -1], rel=1e-5)


class _OpCount:
    """Counts the aten ops run under it, and fails on a read of a tensor's value into Python (`.item()`, `bool()`,
    ...), which on an accelerator would wait for the device."""

    def __enter__(self):
        import collections

        from torch.utils._python_dispatch import TorchDispatchMode

        counter = collections.Counter()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                assert func is not torch.ops.aten._local_scalar_dense.default, "a value was read back to the host"
                counter[str(func)] += 1
                return func(*args, **(kwargs or {}))

        self.ops, self._mode = counter, Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


@verl_only
@pytest.mark.parametrize("name", [*NAMES, "etrl_position_bonus"])
def test_7_no_estimator_loops_over_groups_or_reads_the_device_back(name, monkeypatch):
    """The ops an estimator runs do not depend on how many groups the batch has (no Python loop over groups), and none
    reads a value back to the host (the warnings, which do on the CPU, are switched off here as on an accelerator)."""
    from exploration_trl.integrations.verl import _estimators
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    monkeypatch.setattr(_estimators, "_reads_allowed", lambda t: False)
    config = algorithm_config(passk_k=4, pkpo_k=4, position_bonus_gamma=0.1, position_bonus_base="etrl_maxrl")
    fn = get_adv_estimator_fn(name)
    counts = []
    for n_groups in (8, 8, 64):  # the first call builds the cached tables
        g = torch.Generator().manual_seed(n_groups)
        scores = (torch.rand(n_groups, 8, generator=g) > 0.5).float().tolist()
        rewards, mask, uids, _ = outcome_batch(scores)
        perm = torch.randperm(rewards.shape[0], generator=g)
        rewards, mask, uids = rewards[perm], mask[perm], uids[perm.numpy()]
        with monkeypatch.context() as patch, warnings.catch_warnings(), _OpCount() as ops:
            for attr in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__"):
                patch.setattr(torch.Tensor, attr, lambda *a, attr=attr, **k: pytest.fail(f"Tensor.{attr} was called"))
            warnings.simplefilter("ignore")
            fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=config)
        counts.append(dict(ops.ops))
    assert counts[1] == counts[2], name


@verl_only
def test_8_stills_position_bonus_runs_on_any_estimator_and_the_rest_say_why_not():
    """`etrl_position_bonus` shapes the advantages of `position_bonus_base` (verl's grpo by default, any etrl_*
    estimator too) with `core.position_bonus_advantages`; the methods verl cannot carry are registered under their
    etrl_* names as errors that say what they need."""
    from exploration_trl.core import position_bonus_advantages
    from exploration_trl.integrations.verl_reference import REDIRECTS, UNAVAILABLE

    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 1], [0.5, 0.0, 1.0, 0.0]], width=8)
    for base, extra in (("grpo", {}), ("grpo", {"norm_adv_by_std_in_grpo": False}), ("etrl_maxrl", {})):
        config = algorithm_config(position_bonus_gamma=0.1, position_bonus_base=base, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, shaped, _ = through_verl("etrl_position_bonus", rewards, mask, uids, config)
            _, plain, _ = through_verl(base, rewards, mask, uids, algorithm_config(**extra))
        expected = position_bonus_advantages(plain, mask, gamma=0.1, direction=1.0, scale=15.0, center=0.5)
        torch.testing.assert_close(shaped, expected * mask, atol=1e-6, rtol=1e-6)
        assert not torch.equal(shaped, plain)
    for bad, text in (({}, "position_bonus_gamma is 0.0 but must be > 0"),
                      ({"position_bonus_start_step": 200}, "position_bonus_start_step is not available in verl"),
                      ({"position_bonus_base": "gae"}, "cannot call: it needs the critic's values"),
                      ({"position_bonus_base": "etrl_progrpo"}, "cannot call: it is not an estimator that runs"),
                      ({"position_bonus_base": "nope"}, "no estimator registered with verl; the bases: ")):
        config = algorithm_config(**{"position_bonus_gamma": 0.1, **bad} if bad else {})
        with pytest.raises(ValueError, match=text):
            through_verl("etrl_position_bonus", rewards, mask, uids, config)
    for name in (*UNAVAILABLE, *REDIRECTS):
        with pytest.raises(ValueError) as error:
            through_verl(name, rewards, mask, uids, algorithm_config())
        assert "\n" not in str(error.value) and str(error.value).startswith(name)
    with pytest.raises(ValueError, match=r"^etrl_progrpo: ProGRPO \(ARM\) cannot run in verl: it needs each "
                                         r"completion's and each prompt's token log-probs"):
        through_verl("etrl_progrpo", rewards, mask, uids, algorithm_config())


@verl_only
def test_8_the_position_bonus_in_verl_is_the_cores_bit_for_bit():
    """`etrl_position_bonus` computes `core.position_bonus_advantages` in place (for speed); on masks with gaps (an
    agent loop's tool tokens), empty and one-token rows, advantages of every shape, zero, negative and non-finite
    ones, inside and outside the mask, and each direction and centre, the numbers are the core's exactly."""
    from exploration_trl.core import position_bonus_advantages
    from exploration_trl.integrations.verl import position_bonus_in_place

    g = torch.Generator().manual_seed(4)
    b, t = 12, 9
    mask = (torch.rand(b, t, generator=g) > 0.3).float()  # gaps
    mask[0] = 0  # empty
    mask[1] = 0
    mask[1, 4] = 1  # one token, in the middle
    mask[2] = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0])  # right-padded
    per_token = torch.randn(b, t, generator=g) * 2
    per_token[3] = 0  # no signal: stays 0
    per_token[4, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    per_token[5, -1] = float("nan")  # in the padding or not, whatever the mask drew
    per_row = torch.tensor([1.5, -0.5, 0.0, 2.0, -3.0, 0.25, 0.0, -1.0, 4.0, -2.0, 1.0, 0.5])
    for advantages in (per_token, per_row, per_row.unsqueeze(-1)):
        for m in (mask, mask.bool(), mask.long()):
            for direction, center, scale, gamma in ((1.0, 0.5, 15.0, 0.1), (-1.0, -0.5, 15.0, 0.3),
                                                    (1.0, 0.2, 3.0, 2.0)):
                kw = {"gamma": gamma, "direction": direction, "scale": scale, "center": center}
                want = position_bonus_advantages(advantages, m, **kw)
                got = position_bonus_in_place(advantages, m, **kw)
                assert got.dtype == torch.float32 and got.shape == (b, t)
                assert torch.equal(got.nan_to_num(nan=7.0), want.nan_to_num(nan=7.0)), (advantages.shape, m.dtype, kw)
                assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert not torch.equal(position_bonus_in_place(per_token, mask, 0.1, 1.0, 15.0, 0.5), per_token)
    row = position_bonus_in_place(per_row, mask, 0.1, 1.0, 15.0, 0.5)[1]  # one token: l = 1, the padding keeps A
    assert row[4].item() == pytest.approx(-0.5 - 0.1 / (1 + math.exp(-7.5)), abs=1e-7)
    assert row[[0, 1, 2, 3, 5, 6, 7, 8]].tolist() == [-0.5] * 8


# ----------------------------------------------------------------------------------------------------------------
# Issue 67: MaxRL's conditions from verl's config, QAE's eps


@verl_only
def test_67_maxrl_warns_once_where_verls_config_breaks_its_unbiasedness():
    """Thm. 2 needs on-policy samples and a loss that weighs a prompt's completions alike. verl passes the estimator
    only the algorithm config, but as the `algorithm` node of its whole config, whose actor settings the estimator
    reads: a PPO mini-batch below the train batch, ppo_epochs > 1, and loss_agg_mode seq-mean-token-mean each break
    it, and the first call says so once. A config made on its own (no whole config) says nothing."""
    rewards, mask, uids, _ = outcome_batch([[1, 0, 0, 0]])
    cases = [
        ([], "ppo_mini_batch_size=256 is below data.train_batch_size=1024, so each rollout feeds 4 optimizer updates"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=1024", "actor_rollout_ref.actor.ppo_epochs=2"],
         "ppo_epochs=2 passes over each rollout 2 times"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=1024",
          "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
         "loss_agg_mode=seq-mean-token-mean divides each completion's loss by its own length"),
    ]
    from exploration_trl.integrations.verl import reset_warnings

    for overrides, text in cases:
        reset_warnings()
        cfg = _compose(["algorithm.adv_estimator=etrl_maxrl", "actor_rollout_ref.rollout.n=4", *overrides])
        with pytest.warns(UserWarning, match=r"etrl_maxrl: .*" + re.escape(text) + r".*Thm. 2.*Warned once"):
            _as_the_trainer_calls_it(cfg, rewards, mask, uids)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _as_the_trainer_calls_it(cfg, rewards, mask, uids)  # once
    reset_warnings()
    cfg = _compose(["algorithm.adv_estimator=etrl_maxrl", "actor_rollout_ref.rollout.n=4",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=1024"])  # the paper's setting: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _as_the_trainer_calls_it(cfg, rewards, mask, uids)
        through_verl("etrl_maxrl", rewards, mask, uids, algorithm_config())  # no whole config: nothing to read


@verl_only
def test_67_qae_eps_is_an_option_with_the_trl_configs_default():
    import dataclasses

    from exploration_trl.core import quantile_advantages
    from exploration_trl.integrations.verl import estimator_options
    from exploration_trl.trainers import get_config_class

    fields = {f.name: f.default for f in dataclasses.fields(get_config_class("qae"))}
    assert estimator_options("etrl_qae", algorithm_config(), 8).qae_eps == fields.get("qae_eps", 1e-4)
    rewards, mask, uids, scores = outcome_batch([[0.0, 0.2, 0.3, 1.0], [1, 1, 1, 0]])
    for eps in (1e-6, 0.5):
        per_row, _, _ = through_verl("etrl_qae", rewards, mask, uids, algorithm_config(qae_eps=eps))
        torch.testing.assert_close(per_row, quantile_advantages(scores, 4, eps=eps))
    with pytest.raises(ValueError, match="etrl_qae: qae_eps is -1.0 but must be >= 0"):
        through_verl("etrl_qae", rewards, mask, uids, algorithm_config(qae_eps=-1.0))
