"""Host-device syncs per training step, for every registered method, against TRL's `GRPOTrainer` (issue 35).

On CUDA each sync stalls the host until the GPU has drained its queue; on CPU they are counted with the profiler
(`exploration_trl.ops.sync_count`: scalar reads, boolean-mask compactions, `tolist`). The run: `steps_per_generation:
3` and `logging_steps: 3`, so step 0 generates, step 1 only trains and does not log, step 2 only trains and logs.

* A step that does not log: at most TRL's count + 2 (CaSP reads its forking tokens, KL-Cov and Clip-Cov the sizes of
  their selections; the exploration metrics stay on the device).
* A logging step with the exploration metrics on: at most TRL's count + 5 (the sampled tokens of Λ(n), the top-p
  count, the one copy of every queued metric, the method's own read) and at most 1.3x TRL's aten ops.
* A generating step: at most TRL's count + 4. The methods' own metrics, the reward failure counts and the logged
  advantages stay on the device until the log; what remains is the first batch's reward check (a run that no reward
  scores must stop there), and a few reads of ProGRPO, CaSP, KL-Cov and Clip-Cov. Pass@k Training and PKPO are
  the exception (+18): their advantages are computed group by group on a host copy of the rewards (`core/passk.py`),
  so the CPU counter sees each scalar read of that copy, where a GPU sees one copy.
* `cov_selection: global` adds one forward per optimizer step, which brings the model's own reads (2 in the toy's
  attention-mask checks) plus one read per micro-batch: at most TRL + 4 on a step that does not log.
"""

from __future__ import annotations

import pytest
from trl import GRPOConfig, GRPOTrainer

import exploration_trl as et
from exploration_trl.ops.sync_count import SYNC_OPS, count_syncs, steps_sync_callback
from exploration_trl.trainers.composition import METHODS
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

NOT_LOGGING, LOGGING = 1, 2  # step indices (step 0 generates)
BUDGET_NOT_LOGGING = 2
BUDGET_LOGGING = 5
ATEN_RATIO_LOGGING = 1.3
GLOBAL_SELECTION_NOT_LOGGING = 4
GENERATING = 0
BUDGET_GENERATING = 4
BUDGET_GENERATING_HOST_GROUPS = {"passk": 18, "pkpo": 18}  # group loops on a host copy of the rewards


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def run_counts(ckpt, path, method: str | None, logs_at=(LOGGING + 1,), **overrides) -> list[dict]:
    """Counts per optimizer step of a 3-step run (`method=None`: TRL's own trainer); `logs_at`: the steps (from 1)
    that must log."""
    if method is None:
        trainer_cls, config_cls = GRPOTrainer, GRPOConfig
    else:
        trainer_cls = et.get_trainer_class(method)
        config_cls = trainer_cls.config_class
    overrides = {"max_steps": 3, **overrides}
    args = config_cls(**grpo_kwargs(path, per_device_train_batch_size=4, steps_per_generation=3, logging_steps=3,
                                    **overrides))
    callback = steps_sync_callback()
    trainer = trainer_cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset(),
                          callbacks=[callback])
    trainer.train()
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == list(logs_at)  # e.g. only step 2 logs
    assert len(callback.steps) == args.max_steps
    return callback.steps


@pytest.fixture(scope="module")
def trl_counts(ckpt, tmp_path_factory):
    steps = run_counts(ckpt, tmp_path_factory.mktemp("trl"), None)
    # The counter sees TRL's own reads (its loss metrics call .item()), and the train-only steps ran no generation.
    assert steps[NOT_LOGGING]["syncs"] >= 10 and steps[0]["aten_ops"] > 2 * steps[NOT_LOGGING]["aten_ops"]
    return steps


def _report(name, steps, trl):
    return (f"{name}: syncs {[s['syncs'] for s in steps]} vs TRL {[s['syncs'] for s in trl]}; "
            f"aten ops {[s['aten_ops'] for s in steps]} vs TRL {[s['aten_ops'] for s in trl]}; "
            f"by op (logging step) {steps[LOGGING]['by_op']} vs TRL {trl[LOGGING]['by_op']}; "
            f"by op (generating step) {steps[GENERATING]['by_op']} vs TRL {trl[GENERATING]['by_op']}")


@pytest.mark.parametrize("method", list(METHODS))
def test_sync_budget_of_every_method(method, ckpt, tmp_path, trl_counts):
    steps = run_counts(ckpt, tmp_path, method)
    report = _report(method, steps, trl_counts)
    assert steps[NOT_LOGGING]["syncs"] <= trl_counts[NOT_LOGGING]["syncs"] + BUDGET_NOT_LOGGING, report
    assert steps[LOGGING]["syncs"] <= trl_counts[LOGGING]["syncs"] + BUDGET_LOGGING, report
    assert steps[LOGGING]["aten_ops"] <= ATEN_RATIO_LOGGING * trl_counts[LOGGING]["aten_ops"], report
    budget = BUDGET_GENERATING_HOST_GROUPS.get(method, BUDGET_GENERATING)
    assert steps[GENERATING]["syncs"] <= trl_counts[GENERATING]["syncs"] + budget, report


@pytest.mark.parametrize("method", ["kl_cov", "clip_cov"])
def test_sync_budget_of_global_cov_selection(method, ckpt, tmp_path, trl_counts):
    steps = run_counts(ckpt, tmp_path, method, cov_selection="global")
    report = _report(f"{method} global", steps, trl_counts)
    assert steps[NOT_LOGGING]["syncs"] <= trl_counts[NOT_LOGGING]["syncs"] + GLOBAL_SELECTION_NOT_LOGGING, report


def test_metrics_off_reads_as_trl_after_the_first_batch(ckpt, tmp_path):
    """With `exploration_metrics: false`, two generation cycles: after the first batch (whose reward check must stop
    a run that no reward scores, so it is read on the step) every step that does not log reads the device exactly as
    often as TRL's; a logging step adds the metric queue's one copy (the reward failure counts and the unscored-batch
    flags, logged with the metrics off too)."""
    trl = run_counts(ckpt, tmp_path / "trl", None, max_steps=6, logs_at=[3, 6])
    ours = run_counts(ckpt, tmp_path / "grpo", "grpo", max_steps=6, logs_at=[3, 6], exploration_metrics=False)
    report = _report("grpo", ours, trl)
    assert ours[GENERATING]["syncs"] == trl[GENERATING]["syncs"] + 1, report  # the first batch's reward check
    for step in (NOT_LOGGING, 3, 4):  # 3: the second generating step
        assert ours[step]["syncs"] == trl[step]["syncs"], (step, report)
    for step in (LOGGING, 5):
        assert ours[step]["syncs"] == trl[step]["syncs"] + 1, (step, report)


def test_counter_sees_every_kind_of_sync():
    """Each way of reading the device counts once (a nested op is not counted twice); device-only work counts none."""
    import torch

    x = torch.arange(6.0)
    with count_syncs() as none:
        y = (x * 2).sum() + torch.where(x > 2, x, 0.0).cumsum(0)[-1]
    with count_syncs() as some:
        y.item()  # item -> _local_scalar_dense: one
        bool(y > 0)  # is_nonzero: one
        x[x > 2]  # boolean indexing: nonzero
        x.tolist()  # a copy to the host
        torch.equal(x, x)
    assert none["syncs"] == 0 and none["aten_ops"] > 0
    assert some["syncs"] == 5, some["by_op"]
    assert {"aten::item", "aten::is_nonzero", "aten::nonzero", "Tensor.tolist", "aten::equal"} == set(some["by_op"])
    assert "aten::_local_scalar_dense" in SYNC_OPS


def test_metric_queue_reads_everything_in_one_copy_and_keeps_the_order():
    """Queued `(sum, count)` pairs, device scalars and numbers mixed, come back as `sum / count` per name in the
    order queued; a name whose count is 0 is skipped; values to reduce go through `reduce_sum`, the others do not."""
    import torch

    from exploration_trl.trainers.components.metric_queue import MetricQueue

    queue = MetricQueue()
    queue.add("train", {"a": (torch.tensor(3.0), 2.0), "b": (0.0, torch.tensor(0))})
    queue.add("train", {"g": (torch.tensor(0.75, dtype=torch.float64), 1.0)}, reduce=False)
    queue.add("eval", {"a": (5.0, torch.tensor(True)), "b": (torch.tensor(1.5), torch.tensor(3.0))})
    with count_syncs() as counted:
        drained = queue.drain("cpu", lambda x: 2 * x)  # as if two processes held the same values
    assert counted["syncs"] == 1, counted["by_op"]
    assert drained == [("train", "a", 1.5), ("train", "g", 0.75), ("eval", "a", 5.0), ("eval", "b", 0.5)]
    assert len(queue) == 0 and queue.drain("cpu", lambda x: x) == []


def test_checkpoint_inside_a_logging_window_keeps_the_queued_metrics(ckpt, tmp_path):
    """A checkpoint between two logs stores the window's metrics for the resumed run (`ResumeMixin`); the queued
    device values are in them (here CaSP's and the entropy split of the one step before the checkpoint)."""
    import torch

    from exploration_trl.trainers.components.resume import STATE_FILE

    cls = et.get_trainer_class("casp")
    args = cls.config_class(**grpo_kwargs(tmp_path, max_steps=1, logging_steps=5, save_strategy="steps",
                                          save_steps=1))
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())
    trainer.train()
    state = torch.load(tmp_path / "checkpoint-1" / STATE_FILE.format(0), weights_only=True)
    assert {"casp/forking_frac", "casp/active", "exploration/entropy_wrong"} <= set(state["metrics"])
    assert state["metrics"]["casp/active"] == [1.0]
