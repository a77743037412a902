"""The second confirmatory protocol (`protocol_version: 2`, issue 44): the selection split, the selection rule,
provenance, per-problem records, the mean-point reading of GRPO's curve, the bootstrap over seeds and multisets, the
noise model of the calibration, and the whole pipeline on a tiny version (`confirm --quick --parallel 2`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exploration_trl.experiments.confirmatory import (
    analysis, calibration, driver, heldout, protocol, provenance, runner, verdict,
)

ROOT = Path(__file__).resolve().parents[1]
V2 = ROOT / "configs" / "confirmatory" / "countdown3_v2.yaml"


@pytest.fixture(scope="module")
def cfg():
    return protocol.load(V2)


# ------------------------------------------------------------------------------------------------- the data
def test_selection_split_is_apart_from_training_and_the_heldout_set_is_070s(cfg):
    s = runner.settings_for(cfg, 0, 1)
    train, held, info = heldout.make_split(s.data, s.seed, cfg["heldout"]["salt"], cfg["heldout"]["share"],
                                           cfg["heldout"]["num_problems"], selection=cfg["selection"])
    v1 = json.loads((ROOT / "confirmatory_state" / "countdown3" / "warm_start" / "warm_start.json").read_text())
    assert info["checksum"] == v1["split"]["checksum"]  # the same 500 held-out problems as 0.7.0
    sel = info["selection"]
    assert sel["n_problems"] == 300 and sel["disjoint_from_training"] and sel["disjoint_from_heldout"]
    keys = {heldout.multiset_key(p["nums"]) for p in heldout.selection_problems(info)}
    assert not keys & {heldout.multiset_key(p["nums"]) for p in train}
    assert not keys & {heldout.multiset_key(p["nums"]) for p in held}
    assert len(train) == cfg["data"]["num_train"]
    with pytest.raises(ValueError, match="this set-up has no selection split"):
        heldout.selection_problems({})


def test_the_yaml_null_section_is_read_as_null(cfg):
    """YAML reads the key `null:` as None. The frozen code (4e6b608) looked up "null", found nothing and used its
    defaults, which are the section's values; `load` now reads the section, and the analysis keys on it."""
    assert None not in cfg
    assert cfg["null"] == {"simulations": 10000, "resamples": 2000, "seed": 101, "splits": 10000}


def test_the_runs_come_in_priority_order(cfg):
    jobs = protocol.confirm_jobs(cfg, None)
    roles = [next(s.get("role", "baseline") for s in cfg["settings"] if s["label"] == j["label"]) for j in jobs]
    first = {r: roles.index(r) for r in set(roles)}
    assert first["baseline"] < first["tuned"] < first["new"] < first["replication"]
    assert max(i for i, r in enumerate(roles) if r in ("baseline", "negative_control")) < first["tuned"]
    assert all(j["overrides"] is None for j in jobs if j["label"].endswith("_tuned"))  # not before the selection
    chosen = {s["label"]: s["grid"][1] for s in cfg["settings"] if s.get("role") == "tuned"}
    tuned = [j for j in protocol.confirm_jobs(cfg, chosen) if j["label"] == "dsgrpo_tuned"]
    assert tuned[0]["overrides"] == {"ds_gamma_p": 0.1, "ds_gamma_n": 0.1, "ds_logp_granularity": "sequence_sum"}
    assert len(protocol.selection_jobs(cfg)) == 4 + 4 * 3 * 3
    assert all(len(s["seeds"]) >= 8 for s in cfg["settings"])


def _record(points: dict[int, tuple[float, float]]) -> dict:
    return {"rows": [{"step": st, "pass@1": p1, "pass@n": pn} for st, (p1, pn) in points.items()]}


def test_the_selection_rule(cfg):
    """GRPO's selection curve runs (0.2, 0.9) -> (0.3, 0.8) at steps 0 and 1000 (straight: pass@n = 1.1 - p1). Grid
    values' seed means: on the curve (effect 0), 2 points above, 1 point above, beyond GRPO's pass@1 (not eligible)."""
    sel = cfg["selection"]
    grpo = {st: (0.2 + 0.1 * st / 2500, 0.9 - 0.1 * st / 2500) for st in sel["grpo_steps"]}
    records = {("grpo", sd): _record(grpo) for sd in sel["grpo_seeds"]}
    means = {"progrpo_tuned": [(0.24, 0.86), (0.24, 0.88), (0.24, 0.87)],  # 0, +2, +1: the 10x value
             "dsgrpo_tuned": [(0.24, 0.87), (0.24, 0.87), (0.35, 0.99)],  # a tie: the first listed (the paper's)
             "casp_tuned": [(0.21, 0.80), (0.22, 0.80), (0.23, 0.80)],  # all below: the largest, -7 points (100x)
             "kl_cov_tuned": [(0.40, 0.9), (0.41, 0.9), (0.42, 0.9)]}  # none eligible: the paper's
    for s in cfg["settings"]:
        if s.get("role") == "tuned":
            for value, (p1, pn) in zip(s["grid"], means[s["label"]]):
                for sd in sel["seeds"]:
                    records[(f"{s['label']}@{protocol.grid_label(value)}", sd)] = _record({0: (0.2, 0.9),
                                                                                            500: (p1, pn),
                                                                                            1000: (p1, pn)})
    decision = protocol.choose(cfg, records)["settings"]
    assert decision["progrpo_tuned"]["chosen"] == {"progrpo_alpha": 3.0}
    assert decision["progrpo_tuned"]["grid"][1]["effect"] == pytest.approx(0.02)
    assert decision["dsgrpo_tuned"]["chosen"] == {"ds_gamma_p": 0.01, "ds_gamma_n": 0.01}
    assert decision["dsgrpo_tuned"]["grid"][2]["effect"] is None
    assert decision["casp_tuned"]["chosen"] == {"casp_alpha": 1.0}
    assert decision["kl_cov_tuned"]["chosen"] == {"kl_cov_ratio": 0.002}
    assert decision["kl_cov_tuned"]["reason"] == "no eligible value: the paper's"


# ---------------------------------------------------------------------------------------------- provenance
def test_provenance_names_the_code_that_ran(tmp_path):
    here = provenance.current()
    assert here["version"] and len(here["source_hash"]) == 64 and here["origin"] in ("git checkout", "unknown")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    first = provenance.source_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"cache")
    assert provenance.source_hash(tmp_path / "pkg") == first  # caches do not count
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert provenance.source_hash(tmp_path / "pkg") != first


def test_a_git_archive_writes_its_commit_into_the_package(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    archive = subprocess.run(["git", "archive", "HEAD", "exploration_trl/archive_commit.py"], cwd=ROOT, capture_output=True,
                             check=True)
    import io
    import tarfile

    text = tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractfile("exploration_trl/archive_commit.py").read().decode()
    assert f'ARCHIVED_COMMIT = "{head.stdout.strip()}"' in text


def test_mixed_provenance_is_refused_unless_declared():
    a = {"version": "0.8.0", "commit": "a" * 40, "dirty": None, "source_hash": "1" * 64, "origin": "git archive"}
    b = {**a, "source_hash": "2" * 64}
    records = {("grpo", 1): {"provenance": a}, ("grpo", 2): {"provenance": a}, ("maxrl", 1): {"provenance": b}}
    with pytest.raises(ValueError, match=r"records of mixed provenance: most ran .* but maxrl:1 ran .*declare the "
                                         r"difference"):
        provenance.check_same(records)
    same = provenance.check_same(records, declared=[b])
    assert same["source_hash"] == "1" * 64 and same["declared_differences"][0]["source_hash"] == "2" * 64
    with pytest.raises(ValueError, match="run grpo:3 records no provenance"):
        provenance.check_same({**records, ("grpo", 3): {}})


# ------------------------------------------------------------------------------------------------ the test
def test_mean_point_reads_the_curve_once_and_is_not_bent_by_a_kink():
    """GRPO: (0.20, 0.90) -> (0.25, 0.85) -> (0.30, 0.60): a bend at 0.25. Two method seeds at pass@1 0.24 and 0.26,
    both at pass@n 0.85. Per seed: 0.85 - 0.86 = -0.01 and 0.85 - 0.80 = +0.05, mean +0.02 (the bend's bias); at the
    seeds' mean (0.25, 0.85) the curve gives 0.85: effect 0."""
    grpo = np.array([[[0.20, 0.90], [0.25, 0.85], [0.30, 0.60]]] * 3)
    method = np.array([[0.24, 0.85], [0.26, 0.85]])
    assert verdict.point_effect(grpo, method) == pytest.approx(0.0, abs=1e-12)
    r = verdict.test(grpo, method, resamples=200, seed=0, estimator="mean_point")
    assert r["effect"] == pytest.approx(0.0, abs=1e-12) and r["effect_per_seed"] == pytest.approx(0.02)
    assert verdict.test(grpo, method, resamples=200, seed=0)["effect"] == pytest.approx(0.02)  # 0.7.0's reading
    # A seed beyond GRPO's pass@1: no verdict per seed (0.7.0), a verdict at the mean when the mean is inside.
    outside = np.array([[0.29, 0.7], [0.31, 0.6]])
    assert verdict.test(grpo, outside, resamples=50, seed=0)["p"] is None
    assert verdict.test(grpo, outside, resamples=50, seed=0, estimator="mean_point")["p"] is not None
    with pytest.raises(ValueError, match="estimator is 'median'"):
        verdict.bootstrap_effects(grpo, method, 10, 0, estimator="median")


def test_spread_widens_the_bootstrap():
    rng = np.random.default_rng(0)
    grpo = np.array([[[0.2, 0.9], [0.3, 0.8]]]) + rng.normal(0, 0.01, (8, 2, 2))
    method = np.array([0.25, 0.86]) + rng.normal(0, 0.01, (8, 2))
    narrow = verdict.bootstrap_effects(grpo, method, 2000, 1, estimator="mean_point")
    wide = verdict.bootstrap_effects(grpo, method, 2000, 1, estimator="mean_point", spread=1.1)
    assert np.nanstd(wide) / np.nanstd(narrow) == pytest.approx(1.1, rel=0.02)


def test_seeds_and_multisets_bootstrap():
    """Two multisets of 2 problems each, n = 4 samples. GRPO's checkpoints: counts [1, 0, 1, 0] (pass@1 0.125,
    pass@n 0.5) and [3, 0, 3, 0] (0.375, 0.5); the method [1, 1, 2, 1] (0.3125, 1): effect +0.5, in every resample of
    seeds and multisets (each multiset alone keeps the method inside GRPO's pass@1 range)."""
    groups = ["1,2,3", "1,2,3", "4,5,6", "4,5,6"]
    grpo = np.array([[[1, 0, 1, 0], [3, 0, 3, 0]]] * 3, float)  # (seeds, K, P)
    method = np.array([[1, 1, 2, 1]] * 2, float)
    r = analysis.seeds_and_multisets(grpo, method, groups, 4, resamples=200, seed=0)
    assert r["effect"] == pytest.approx(0.5) and r["multisets"] == 2 and r["problems"] == 4
    assert r["p"] == 0.0 and r["ci"] == pytest.approx([0.5, 0.5])
    worse = analysis.seeds_and_multisets(grpo, np.array([[1, 0, 2, 0]] * 2, float), groups, 4, 200, 0)
    assert worse["effect"] == pytest.approx(0.0) and worse["p"] == 1.0  # on the curve: never above it


# ----------------------------------------------------------------------------------------------- calibration
def test_noise_model_draws_the_seeds_covariance():
    rng = np.random.default_rng(1)
    runs = rng.normal(0, 1, (6, 3, 2)) * np.array([0.01, 0.02]) + np.array([[0.2, 0.9], [0.3, 0.8], [0.35, 0.7]])
    model = calibration.fit_noise(runs)
    draws = model.draw(np.random.default_rng(2), 200_000).reshape(200_000, -1)
    assert np.allclose(np.cov(draws, rowvar=False), np.cov(runs.reshape(6, -1), rowvar=False), atol=2e-5)
    assert np.allclose(draws.mean(axis=0), runs.mean(axis=0).reshape(-1), atol=2e-4)
    smooth = calibration.smoothed(model, [0, 500, 1000], degree=1)
    assert np.array_equal(smooth.residuals, model.residuals) and smooth.mean.shape == model.mean.shape
    lo, hi = calibration.wilson(500, 10_000)
    assert (round(lo, 4), round(hi, 4)) == (0.0459, 0.0544)


def test_the_null_rate_sees_the_bias_of_reading_at_every_seed():
    """A sharply bent GRPO trajectory with pass@1 noise: GRPO compared with itself at the bend is a false positive
    far more often per seed (0.7.0's reading) than at the seeds' mean."""
    mean = np.array([[0.20, 0.90], [0.25, 0.85], [0.30, 0.40]])
    residuals = np.random.default_rng(3).normal(0, 1, (20, 6)) * np.array([0.0, 0.0, 0.01, 0.005, 0.01, 0.005])
    model = calibration.NoiseModel(mean, residuals - residuals.mean(axis=0))
    per_seed = calibration.null_rate(model, 1, 12, 12, simulations=200, resamples=200, seed=5, estimator="per_seed")
    mean_point = calibration.null_rate(model, 1, 12, 12, simulations=200, resamples=200, seed=5,
                                       estimator="mean_point")
    assert per_seed["rate"] > 0.3 and mean_point["rate"] < 0.12
    assert per_seed["mc_se"] == pytest.approx(math.sqrt(per_seed["rate"] * (1 - per_seed["rate"]) / 200))


# ------------------------------------------------------------------------------------------------ the whole
def test_a_job_name_is_checked(cfg, tmp_path):
    with pytest.raises(ValueError, match="--job 'grpo:100': expected PHASE:LABEL:SEED"):
        driver.parse_job("grpo:100", cfg, tmp_path)
    with pytest.raises(ValueError, match="--job confirm:grpo:99: not a run of this protocol"):
        driver.parse_job("confirm:grpo:99", cfg, tmp_path)
    with pytest.raises(ValueError, match="the selection of casp_tuned is not decided yet"):
        driver.parse_job("confirm:casp_tuned:100", cfg, tmp_path)


# Slow (85 s on 2 idle cores, the suite's longest test): the second protocol's runs are done and came from its
# commit's archive; run it (`-m slow`) after any change to the confirmatory code.
@pytest.mark.slow
def test_quick_protocol_runs_resumes_and_gives_the_verdict(tmp_path):
    """`confirm --quick --parallel 2`: the selection, then the confirmation two at a time, the verdict with the
    provenance, the selection, per-problem records, both Holm families and the nulls; run again, it starts nothing."""
    out = tmp_path / "v2"
    cmd = [sys.executable, "-m", "exploration_trl.cli", "confirm", "--config", str(V2), "--quick", "--output-dir",
           str(out), "--parallel", "2"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["protocol_version"] == 2 and result["provenance"]["runs"] == 13  # 4 selection, 9 confirmation
    assert set(result["selection"]["settings"]) == {"progrpo_tuned"}
    assert result["selection"]["split"]["disjoint_from_training"]
    families = {(t["label"], t["family"]) for t in result["tests"]}
    assert ("grpo_lr_half", "primary") in families and ("maxrl", "middle") in families
    control = next(s for s in result["settings"] if s["label"] == "grpo_lr_half")
    assert control["role"] == "negative_control" and control["checkpoint"] == 4
    assert {"raw", "smooth"} == set(result["null_simulation"]) and "null_false_positive_mc_se" in result
    record = json.loads((out / "runs" / "maxrl__seed100.json").read_text())
    assert set(record["correct_counts"]) == {"0", "2", "4"} and len(record["correct_counts"]["4"]) == 8
    assert record["provenance"]["source_hash"] == provenance.source_hash()
    assert (out / "plot.png").stat().st_size > 0 and "| maxrl" in (out / "table.md").read_text()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "starting" not in again.stdout and "resuming" not in again.stdout
