"""One generation batch, one override: `ExplorationGRPOTrainer._generate_and_score_completions` composes its steps
explicitly and in order, and no other class of the package overrides TRL's method (the MRO decides nothing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from trl import GRPOTrainer

from exploration_trl import methods
from exploration_trl.trainers import ExplorationGRPOTrainer, get_trainer_class
from exploration_trl.trainers.composition import ADVANTAGE_SIDE, LOSS_SIDE


def test_only_the_trl_adapter_overrides_the_generation_batch():
    trainers = [get_trainer_class(m) for m in methods.METHODS]
    trainers += [get_trainer_class(f"{a}+{b}") for a in ADVANTAGE_SIDE for b in LOSS_SIDE]
    for trainer in trainers:
        owners = [c.__qualname__ for c in trainer.__mro__
                  if c.__module__.startswith("exploration_trl.") and "_generate_and_score_completions" in c.__dict__]
        assert owners == ["TRLAdapter"], (trainer.__name__, owners)


class _Recorder(ExplorationGRPOTrainer):
    """The override with every step replaced by a recorder (no model: `__init__` is not run)."""

    def __init__(self, fail: bool = False):  # noqa: D107 - no TRL set-up
        self.calls, self.fail = [], fail
        self.vllm = SimpleNamespace(start_batch=lambda: self.calls.append("vllm"))
        self._assembled = True  # stands in for a finished `__init__`: the overrides act

    def _start_rollout_capture(self, inputs):
        self.calls.append(("capture", inputs))
        return True  # the adapter then captures TRL's passes

    def _dynamic_sampling_select(self, inputs):
        self.calls.append(("select", inputs, self._capture.mode))
        return ["kept"], {"replay": True}

    def _finish_rollout_capture(self, output, capture):
        self.calls.append(("finish", output, capture.mode, self._ds_replay))
        return "statistics"

    def _set_advantages(self, output, capture):
        self.calls.append(("advantages", capture, self._capture))
        return {**output, "advantages": "set"}


def test_the_steps_run_in_order(monkeypatch):
    def trl(self, inputs):
        self.calls.append(("trl", inputs, self._ds_replay))
        if self.fail:
            raise RuntimeError("TRL failed")
        return {"rows": inputs}

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", trl)
    trainer = _Recorder()
    out = trainer._generate_and_score_completions(["a", "b"])
    assert out == {"rows": ["kept"], "advantages": "set"}
    assert trainer.calls == [
        "vllm",
        ("capture", ["a", "b"]),
        ("select", ["a", "b"], "rollout"),  # dynamic sampling generates under the rollout capture
        ("trl", ["kept"], {"replay": True}),  # TRL scores the kept rows, replaying their generations
        ("finish", {"rows": ["kept"]}, "rollout", None),  # the replay is over before the statistics are read
        ("advantages", "statistics", None),  # the capture is closed before the advantage hook
    ]
    failing = _Recorder(fail=True)
    with pytest.raises(RuntimeError, match="TRL failed"):
        failing._generate_and_score_completions(["a"])
    assert failing._ds_replay is None and failing._capture is None  # nothing left behind for the next batch
