"""`exploration-trl train`: parse, check the model, data and rewards, train, save (with the card), push."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from ..io_safety import check_output_dir, final_save_failed_line, os_error_line, remove_files_written_since
from .common import CLIError, is_main_process
from .train_args import parse_train_args_and_trainer
from .train_data import check_prompt_lengths, check_rewards, load_train_dataset, resolve_reward_funcs
from .train_help_text import USAGE

TOY_MODEL = "toy"


def check_model_and_engine(model: str, training_args) -> None:
    """Before the model loads: a model that exists, vLLM when asked for, and a push that can work at the end."""
    from ..eval.model_source import check_model_source
    from ..boundary.vllm_support import vllm_installed

    check_model_source(model)
    if training_args.use_vllm and not vllm_installed():
        raise CLIError("use_vllm is true but vLLM is not installed; pip install 'exploration-trl[vllm]' (on a CUDA "
                       "machine; on a CPU: scripts/install_vllm_cpu.sh), or set use_vllm: false to generate with "
                       "transformers")
    if training_args.push_to_hub:
        from ..hub.push import check_push_ready

        check_push_ready(training_args.hub_model_id)


def _toy_model(training_args, script_args):
    """`model_name_or_path: toy` builds the offline toy backbone into `<output_dir>/toy_base`."""
    from ..toy import make_toy_checkpoint

    path = Path(training_args.output_dir) / "toy_base"
    # The args' own process state (created with `cpu=use_cpu`) sees a CPU launch as distributed; one process writes.
    with training_args.main_process_first(desc="toy model"):
        if not (path / "model.safetensors").exists():
            make_toy_checkpoint(path, alphabet=script_args.toy_alphabet, seed=training_args.seed)
    return str(path)


class Stage:
    """Where `train` is: `training` while progress bars run (an error then starts on a fresh line); `started` once
    training began, after which the output folder holds its work and an error never removes it."""

    training = False
    started = False


def check_config_or_model(argv: list[str]) -> None:
    """A `train` given neither a YAML nor a model is a mistake, not a request for a long run of the toy model on
    every default: print the usage and raise the one-line error (exit status 2)."""
    keys = {a.lstrip("-").split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
    if keys & {"config", "model_name_or_path"}:
        return
    if is_main_process():
        print(USAGE, file=sys.stderr)
    raise CLIError("train needs a training YAML or a model: give --config FILE.yaml (e.g. "
                   "configs/smoke_toy_countdown.yaml) or --model_name_or_path MODEL (a Hub id, a local folder, or "
                   "toy); `exploration-trl train --help` lists the keys")


def train_main(argv: list[str]) -> int:
    check_config_or_model(argv)
    trainer_cls, script_args, training_args, model_args = parse_train_args_and_trainer(argv)
    check_output_dir(training_args.output_dir)  # before anything loads or is written
    output_dir = Path(training_args.output_dir)
    created = not output_dir.exists()
    Stage.started = False
    try:
        return _train(trainer_cls, script_args, training_args, model_args)
    except (CLIError, ValueError, FileNotFoundError):
        # A mistake found before training: leave no folder behind that this run created (e.g. the toy model's).
        # After training began (an error at the final save or the push) the folder holds checkpoints: keep it.
        if created and not Stage.started and output_dir.is_dir():
            shutil.rmtree(output_dir, ignore_errors=True)
        raise
    except OSError as e:
        line = os_error_line(e, training_args.output_dir)
        if line is None:
            raise
        raise CLIError(line) from None


def _save_final_model(trainer, output_dir: str) -> None:
    """`save_model` (it writes the card too: `ExplorationGRPOTrainer.create_model_card`). If the disk fills up on the
    way, the half-written files are removed (a truncated `model.safetensors` must not pass for the trained model)
    and the one error line names the checkpoint to resume from."""
    started = time.time() - 1.0  # file times can be coarser than the clock
    try:
        trainer.save_model(output_dir)
    except OSError as e:
        line = os_error_line(e, output_dir)
        if line is None:
            raise
        if trainer.accelerator.is_main_process:
            remove_files_written_since(output_dir, started)
        raise CLIError(final_save_failed_line(line, output_dir)) from None


def _train(trainer_cls, script_args, training_args, model_args) -> int:
    import torch
    from trl import get_peft_config

    from ..boundary.deepspeed_import import import_deepspeed_only_when_used
    from ..hub.outcome import outcome_notes
    from ..hub.trainer_card import trainer_outcome
    from ..rewards import naming_errors
    from ..weights import weights_changed, weights_fingerprint

    import_deepspeed_only_when_used()  # before the toy model's save_pretrained: no DeepSpeed noise in runs without it
    if script_args.max_train_samples is not None and script_args.max_train_samples <= 0:
        raise CLIError(f"max_train_samples is {script_args.max_train_samples}, which leaves no training rows; set a "
                       "positive number or remove the key to use every row")
    model = model_args.model_name_or_path or TOY_MODEL
    if model == TOY_MODEL:
        model = _toy_model(training_args, script_args)
    else:
        if model_args.dtype not in (None, "auto"):
            training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}), "dtype": model_args.dtype}
    check_model_and_engine(model, training_args)
    dataset, default_rewards = load_train_dataset(script_args, training_args)
    reward_funcs = resolve_reward_funcs(script_args, default_rewards)
    check_rewards(reward_funcs, dataset, training_args, script_args.dataset_name)
    check_prompt_lengths(model, dataset, training_args, script_args.dataset_name)
    # An exception in a reward (the user's code) keeps its traceback and names the reward.
    reward_funcs = [f if isinstance(f, torch.nn.Module) else naming_errors(f) for f in reward_funcs]
    # `push_to_hub: true` pushes once, at the end, with our model card (`exploration_trl.hub`); the HF Trainer's own
    # push (which creates the repo at start-up and pushes on every save) is switched off.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.model_card_info = {"dataset": script_args.dataset_name, "base_model": model}  # for every card it writes
    before = weights_fingerprint(trainer.model)
    Stage.training = Stage.started = True
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    Stage.training = False
    changed = trainer.model_card_info["weights_changed"] = weights_changed(trainer, before)
    _save_final_model(trainer, training_args.output_dir)
    if trainer.accelerator.is_main_process:
        for note in outcome_notes(trainer_outcome(trainer, changed)):
            print(f"warning: {note}", file=sys.stderr)
    if push_to_hub and trainer.accelerator.is_main_process:
        from ..hub import push_output_dir

        push_output_dir(training_args.output_dir, training_args.hub_model_id)
    # Leave the process group cleanly: exiting with it alive lets gloo's threads be torn down at interpreter exit,
    # which aborts the process ("terminate called without an active exception") after a successful run. A colocated
    # vLLM engine goes first: it destroys the group it may have created, which end_training then finds gone.
    trainer.accelerator.wait_for_everyone()
    trainer.close_vllm()
    main_process = trainer.accelerator.is_main_process
    trainer.accelerator.end_training()
    if main_process:
        print(saved_line(training_args.output_dir))
    return 0


def saved_line(output_dir: str) -> str:
    """`train`'s last line: the folder the model was saved to and its card (or that no card was written)."""
    from ..hub.state import CARD_FILE

    card = Path(output_dir) / CARD_FILE
    return (f"saved the model to {output_dir} and its card to {card}" if card.is_file() else
            f"saved the model to {output_dir} (no model card: {card} was not written)")
