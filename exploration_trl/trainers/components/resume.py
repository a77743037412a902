"""Exact resume inside a rollout (`Resume`, a component of the trainer): the package's own improvement over TRL 1.16.

TRL 1.16's `GRPOTrainer._prepare_inputs` generates one generation batch every
`steps_per_generation * num_iterations` calls of `training_step` (counted by `self._step`), shuffles and splits it
into `steps_per_generation` slices kept in memory (`self._buffered_inputs`), and feeds slice
`self._step % steps_per_generation` to each call. Neither `_step` nor the buffer is checkpointed: after
`--resume_from_checkpoint` TRL restarts `_step` at 0 with no buffer, so a resume inside a rollout's updates samples
a new rollout instead of finishing the old one, and the run silently differs from the uninterrupted one
(KL-Cov/Clip-Cov default to several updates per rollout, which makes it the common case).

Here every checkpoint also holds, per process, `exploration_resume_state_<process_index>.pt` with what lives in
memory between the updates of one rollout: `_step`, the buffered slices (only when the checkpoint falls inside a
rollout), the state of every private `torch.Generator` the trainer owns (the metrics sampler, Clip-Cov's tie
breaker, any a method adds) and the not-yet-logged metric values. On resume they are restored, so a resumed run
equals the uninterrupted one.

TRL/transformers behaviours relied on (pinned in `tests/test_trl_contract.py`):
* `GRPOTrainer._prepare_inputs` reads `self._step`, `self._buffered_inputs` and regenerates when
  `self._step % generate_every == 0 or self._buffered_inputs is None`; `training_step` increments `self._step`.
* `Trainer._save_rng_state(output_dir)` runs on every process inside `_save_checkpoint`, before
  `trainer_state.json` (the file that marks a checkpoint complete) is written; `Trainer._load_rng_state(checkpoint)`
  runs on every process once per resume, after the model/optimizer are loaded and before the first
  `training_step` of the resumed run.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager

import torch

STATE_FILE = "exploration_resume_state_{}.pt"
FORMAT = 1


def _to(obj, device):
    """`obj` (tensors in dicts/lists, as TRL buffers them) with every tensor on `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _last_checkpoint(run_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None


def _write_atomic(obj, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Resume:
    """One trainer's exact resume (module docstring) and its Ctrl-C checkpoint. The trainer's TRL adapter
    (`boundary/trl_adapter.py`) calls `state` when TRL saves its RNG state, `load` when TRL restores it, `guard_checkpoint` around TRL's
    checkpoint save and `on_interrupt` when training is interrupted."""

    #: What it reads of its trainer (`trainers/view.py`): the only names its view gives.
    READS = ("accelerator", "args", "dynamic_sampling", "metrics", "metrics_window", "num_iterations",
             "rollout_buffer", "run_dir", "save_checkpoint_now", "set_rollout_buffer", "state", "strategies")

    def __init__(self, view):
        self.view = view
        self.interrupted = False

    # ------------------------------------------------------------------------------------------------ Ctrl-C
    def on_interrupt(self) -> None:
        """Ctrl-C (KeyboardInterrupt) during training saves a checkpoint of the last finished step when saving is on
        (one process: with several, the processes are not at the same point, so the last regular checkpoint is
        named instead), and prints how to resume; the caller re-raises."""
        t = self.view
        step = int(t.state.global_step)
        run_dir = t.run_dir()
        folder = os.path.join(run_dir, f"checkpoint-{step}")
        saved = ""
        if t.args.save_strategy != "no" and step > 0 and t.args.world_size == 1 and not os.path.isfile(
                os.path.join(folder, "trainer_state.json")):
            self.interrupted = True
            try:
                t.save_checkpoint_now()
            finally:
                self.interrupted = False
            saved = f"saved {folder}"
        if not t.accelerator.is_main_process:
            return
        last = folder if saved or os.path.isfile(os.path.join(folder, "trainer_state.json")) else _last_checkpoint(run_dir)
        if last is None:
            why = ("no step had finished" if t.args.save_strategy != "no" else
                   "save_strategy is no; set save_strategy: steps to keep progress")
            print(f"\ninterrupted at step {step}: no checkpoint to resume from ({why})", file=sys.stderr, flush=True)
            return
        print(f"\ninterrupted at step {step}: {saved or 'last checkpoint ' + last}; resume with the same config and "
              f"--resume_from_checkpoint {last}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------ the state file
    def generate_every(self) -> int:
        t = self.view
        return t.args.steps_per_generation * t.num_iterations

    def state(self) -> dict:
        """What this process keeps in memory between the updates of one rollout (module docstring)."""
        t = self.view
        rollout_step, buffered = t.rollout_buffer()
        # After Ctrl-C mid-update, `_step` also counts the interrupted update's micro-steps: save the count at the
        # last finished optimizer step (the weights and optimizer saved are that step's).
        step = rollout_step - rollout_step % t.args.gradient_accumulation_steps if self.interrupted else rollout_step
        inside = step % self.generate_every() != 0 and buffered is not None
        return {
            "format": FORMAT,
            "global_step": int(t.state.global_step),
            "step": int(step),
            "buffered_inputs": _to(buffered, "cpu") if inside else None,
            "generators": {name: g.get_state() for name, g in self.generators().items()},
            "metrics": {name: list(values) for name, values in t.metrics_window("train").items()},
            "refill_batches_drawn": int(t.dynamic_sampling.drawn),  # dynamic sampling's second iterator
            "method_state": {k: v for s in t.strategies for k, v in s.state_dict().items()},
        }

    def generators(self) -> dict:
        """Every private random generator of the trainer (the metrics sampler's, the strategies'), by the name
        checkpoints hold it under."""
        t = self.view
        generators = {"_metrics_generator": t.metrics.generator}
        for strategy in t.strategies:
            generators.update(strategy.generators())
        return generators

    def save(self, output_dir: str) -> None:
        os.makedirs(output_dir, exist_ok=True)
        _write_atomic(self.state(), os.path.join(output_dir, STATE_FILE.format(self.view.args.process_index)))

    def load(self, checkpoint: str) -> None:
        t = self.view
        path = os.path.join(checkpoint, STATE_FILE.format(t.args.process_index))
        if not os.path.isfile(path):
            self.without_state(checkpoint)
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
        t.set_rollout_buffer(state["step"], _to(state["buffered_inputs"], t.accelerator.device))
        generators = self.generators()
        for name, value in state["generators"].items():
            if name in generators:
                generators[name].set_state(value)
        window = t.metrics_window("train")
        for name, values in state["metrics"].items():
            window[name].extend(values)
        # Absent from states written before the refill position was saved: refills then restart from the first.
        t.dynamic_sampling.drawn = t.dynamic_sampling.skip = int(state.get("refill_batches_drawn", 0))
        for strategy in t.strategies:  # what a method keeps between batches (e.g. outcome_explore's answer counts)
            strategy.load_state_dict(state.get("method_state") or {})

    def without_state(self, checkpoint: str) -> None:
        """A checkpoint written without the state file (exploration-trl 0.2.0, or plain TRL): align `_step` with the
        data loader (which TRL's resume positions at the same micro-batch) and say that the partial rollout is new."""
        t = self.view
        step = int(t.state.global_step) * t.args.gradient_accumulation_steps
        t.set_rollout_buffer(step, None)
        done = step % self.generate_every()
        if done and t.accelerator.is_main_process:
            print(f"exploration-trl: {checkpoint} has no saved rollout buffer (written by exploration-trl 0.2.0 or "
                  f"earlier, or by TRL), so the {self.generate_every() - done} remaining updates of its rollout "
                  "train on a re-sampled rollout; the run is not the uninterrupted one from here.",
                  file=sys.stderr, flush=True)

    # --------------------------------------------------------------------------------- the checkpoint folder
    @contextmanager
    def guard_checkpoint(self, folder: str):
        """A checkpoint folder that already exists (a run restarted in the same output_dir without resuming) is moved
        aside while the new one is written and put back if writing fails (a full disk), so it is never truncated."""
        t = self.view
        kept = os.path.join(os.path.dirname(folder), f".previous-{os.path.basename(folder)}")
        moved = bool(t.args.should_save and os.path.isdir(folder))
        if moved:
            shutil.rmtree(kept, ignore_errors=True)
            os.rename(folder, kept)
        if t.args.world_size > 1:
            t.accelerator.wait_for_everyone()  # no process writes into the folder before it is moved aside
        try:
            yield
        except BaseException:
            if moved:
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(kept, folder)
            raise
        if moved:
            shutil.rmtree(kept, ignore_errors=True)
