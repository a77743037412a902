"""Exact resume inside a rollout (`ResumeMixin`): the package's own improvement over TRL 1.16.

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


class ResumeMixin:
    """Saves and restores TRL's in-memory rollout buffer, `_step`, private generators and pending metrics; saves a
    checkpoint on Ctrl-C."""

    _interrupted = False

    def train(self, *args, **kwargs):
        """Ctrl-C (KeyboardInterrupt) during training saves a checkpoint of the last finished step when saving is on
        (one process: with several, the processes are not at the same point, so the last regular checkpoint is
        named instead), prints how to resume, and re-raises."""
        try:
            return super().train(*args, **kwargs)
        except KeyboardInterrupt:
            self._on_interrupt()
            raise

    def _on_interrupt(self) -> None:
        step = int(self.state.global_step)
        run_dir = self._get_output_dir(trial=None)
        folder = os.path.join(run_dir, f"checkpoint-{step}")
        saved = ""
        if self.args.save_strategy != "no" and step > 0 and self.args.world_size == 1 and not os.path.isfile(
                os.path.join(folder, "trainer_state.json")):
            self._interrupted = True
            try:
                self._save_checkpoint(self.model, trial=None)
            finally:
                self._interrupted = False
            saved = f"saved {folder}"
        if not self.accelerator.is_main_process:
            return
        last = folder if saved or os.path.isfile(os.path.join(folder, "trainer_state.json")) else _last_checkpoint(run_dir)
        if last is None:
            why = ("no step had finished" if self.args.save_strategy != "no" else
                   "save_strategy is no; set save_strategy: steps to keep progress")
            print(f"\ninterrupted at step {step}: no checkpoint to resume from ({why})", file=sys.stderr, flush=True)
            return
        print(f"\ninterrupted at step {step}: {saved or 'last checkpoint ' + last}; resume with the same config and "
              f"--resume_from_checkpoint {last}", file=sys.stderr, flush=True)

    def _generate_every(self) -> int:
        return self.args.steps_per_generation * self.num_iterations

    def _resume_state(self) -> dict:
        # After Ctrl-C mid-update, `_step` also counts the interrupted update's micro-steps: save the count at the
        # last finished optimizer step (the weights and optimizer saved are that step's).
        step = self._step - self._step % self.args.gradient_accumulation_steps if self._interrupted else self._step
        inside = step % self._generate_every() != 0 and self._buffered_inputs is not None
        return {
            "format": FORMAT,
            "global_step": int(self.state.global_step),
            "step": int(step),
            "buffered_inputs": _to(self._buffered_inputs, "cpu") if inside else None,
            "generators": {name: g.get_state() for name, g in vars(self).items() if isinstance(g, torch.Generator)},
            "metrics": {name: list(values) for name, values in self._metrics["train"].items()},
            "refill_batches_drawn": int(getattr(self, "_ds_drawn", 0)),  # dynamic sampling's second iterator
            "method_state": self._method_state(),
        }

    def _method_state(self) -> dict:
        """What a method keeps between generation batches besides TRL's state (e.g. outcome_explore's answer
        counts), saved with every checkpoint and handed back to `_load_method_state` on resume. Plain Python values
        (dicts, lists, numbers, strings): the file is loaded with `weights_only`."""
        return {}

    def _load_method_state(self, state: dict) -> None:
        """Restore what `_method_state` saved (an empty dict for checkpoints written before it existed)."""

    def _save_checkpoint(self, model, trial) -> None:
        """A checkpoint folder that already exists (a run restarted in the same output_dir without resuming) is moved
        aside while the new one is written and put back if writing fails (a full disk), so it is never truncated.
        Relies on transformers writing checkpoint `checkpoint-<global_step>` under `_get_output_dir(trial)`."""
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        kept = os.path.join(os.path.dirname(folder), f".previous-{os.path.basename(folder)}")
        moved = bool(self.args.should_save and os.path.isdir(folder))
        if moved:
            shutil.rmtree(kept, ignore_errors=True)
            os.rename(folder, kept)
        if self.args.world_size > 1:
            self.accelerator.wait_for_everyone()  # no process writes into the folder before it is moved aside
        try:
            super()._save_checkpoint(model, trial)
        except BaseException:
            if moved:
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(kept, folder)
            raise
        if moved:
            shutil.rmtree(kept, ignore_errors=True)

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        os.makedirs(output_dir, exist_ok=True)
        _write_atomic(self._resume_state(), os.path.join(output_dir, STATE_FILE.format(self.args.process_index)))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE.format(self.args.process_index))
        if not os.path.isfile(path):
            self._resume_without_state(checkpoint)
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
        self._step = state["step"]
        self._buffered_inputs = _to(state["buffered_inputs"], self.accelerator.device)
        for name, value in state["generators"].items():
            generator = getattr(self, name, None)
            if isinstance(generator, torch.Generator):
                generator.set_state(value)
        for name, values in state["metrics"].items():
            self._metrics["train"][name].extend(values)
        # Absent from states written before the refill position was saved: refills then restart from the first.
        self._ds_drawn = self._ds_skip = int(state.get("refill_batches_drawn", 0))
        self._load_method_state(state.get("method_state") or {})

    def _resume_without_state(self, checkpoint: str) -> None:
        """A checkpoint written without the state file (exploration-trl 0.2.0, or plain TRL): align `_step` with the
        data loader (which TRL's resume positions at the same micro-batch) and say that the partial rollout is new."""
        self._step = int(self.state.global_step) * self.args.gradient_accumulation_steps
        self._buffered_inputs = None
        done = self._step % self._generate_every()
        if done and self.accelerator.is_main_process:
            print(f"exploration-trl: {checkpoint} has no saved rollout buffer (written by exploration-trl 0.2.0 or "
                  f"earlier, or by TRL), so the {self._generate_every() - done} remaining updates of its rollout "
                  "train on a re-sampled rollout; the run is not the uninterrupted one from here.",
                  file=sys.stderr, flush=True)
