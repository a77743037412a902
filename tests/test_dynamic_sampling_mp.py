"""Dynamic sampling under real 2-process DDP (gloo, CPU) and DeepSpeed ZeRO-3 (`-m slow`) equals 1 process on the
same global batch, for every method.

Global batch 12 = 3 groups of 4, so with 2 processes of 6 rows the middle group spans both. Half the prompts have a
constant reward (tests/ds_mp_driver.py), so most generation batches drop groups and refill from later rounds; the
kept rows then move between processes (a group generated on one process may be trained on the other)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest
import torch

from exploration_trl.core.dynamic_sampling import group_varies
from test_multiprocess import EQUAL_TOL, TESTS, _accelerate, _engine_config, _env, _max_diff, _params, pytestmark  # noqa: F401
from helpers import toy_checkpoint

METHODS = ["grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov", "progrpo+casp"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_mp")
    ckpt = toy_checkpoint(tmp / "ckpt", tie_word_embeddings=True)

    @cache
    def launch(engine: str):
        out = tmp / engine
        driver = [str(TESTS / "ds_mp_driver.py"), str(out), "--ckpt", ckpt, "--methods", ",".join(METHODS)]
        if engine == "plain":  # one process, no launcher
            cmd = [sys.executable, *driver]
        else:
            cmd = [_accelerate(), "launch", "--config_file", str(_engine_config(tmp, engine, 2)), *driver]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env())
        assert proc.returncode == 0, f"{engine} failed:\n{proc.stderr[-4000:]}"
        return out

    return launch


def _rollouts(folder, rank):
    return [torch.load(p) for p in sorted((folder / "rollouts").glob(f"rollout*_rank{rank}.pt"))]


def _log(folder, key):
    history = json.loads((folder / "run.json").read_text())["log_history"]
    return [h[key] for h in history if key in h]


@pytest.mark.parametrize("method", METHODS)
# ZeRO-3 adds ~3.5 min and no logic of its own (the exchange is the same torch.distributed collective): `-m slow`.
@pytest.mark.parametrize("engine", ["ddp", pytest.param("zero3", marks=pytest.mark.slow)])
def test_two_processes_equal_one(engine, method, runs):
    two, one = runs(engine) / method, runs("plain") / method
    assert json.loads((two / "run.json").read_text())["num_processes"] == 2
    rounds = _log(two, "dynamic_sampling/rounds")
    assert rounds == _log(one, "dynamic_sampling/rounds") and max(rounds) >= 2  # refills happened, alike
    assert _log(two, "dynamic_sampling/dropped_groups") == _log(one, "dynamic_sampling/dropped_groups")
    assert sum(_log(two, "dynamic_sampling/dropped_groups")) >= 1

    r0, r1, single = _rollouts(two, 0), _rollouts(two, 1), _rollouts(one, 0)
    assert len(r0) == len(r1) == len(single) >= 2
    for a, b, s in zip(r0, r1, single, strict=True):
        assert a["completion_ids"].size(0) == b["completion_ids"].size(0) == 6  # each process keeps its 6 rows
        assert torch.equal(a["rewards"], b["rewards"])  # the global batch, the same on both processes
        assert torch.allclose(a["rewards"], s["rewards"], equal_nan=True)
        assert group_varies(s["rewards"], 4, "reward").all()  # the hook saw only varying groups
        both = torch.cat([a["final_advantages"], b["final_advantages"]])
        assert torch.allclose(both, s["final_advantages"], atol=1e-6)
    assert _max_diff(_params(two), _params(one)) <= EQUAL_TOL
