"""The card a trainer writes itself: `save_model()`, `push_to_hub()` and checkpoints of the Python API, and
`exploration-trl train`, all end here, so a card always names the method, the rewards, the hyperparameters and,
for an adapter, its LoRA settings.

`trainer.model_card_info` (a dict, optional) adds what a trainer cannot know: `dataset` (its name), `base_model`
(the id training started from) and `weights_changed` (measured by `exploration-trl train`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .outcome import reward_never_varied

__all__ = ["trainer_outcome", "write_trainer_card"]

logger = logging.getLogger(__name__)


def _base_model(model: Any) -> str | None:
    config = getattr(model, "peft_config", None)
    if isinstance(config, dict) and config:
        name = getattr(next(iter(config.values())), "base_model_name_or_path", None)
        if name:
            return str(name)
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else None


def _adapter_config(model: Any) -> dict | None:
    config = getattr(model, "peft_config", None)
    if not isinstance(config, dict) or not config:
        return None
    return next(iter(config.values())).to_dict()


def _dataset_name(dataset: Any) -> str | None:
    info = getattr(dataset, "info", None)
    return getattr(info, "dataset_name", None) or None


def trainer_outcome(trainer: Any, weights_changed: bool | None = None) -> dict:
    """`{"weights_changed", "reward_never_varied", "diverged"}` of a trainer after training: the second from every
    logged `frac_reward_zero_std` plus the steps not logged yet (TRL keeps them until the next logging step); the
    third is the divergence check's sentence (`trainers/callbacks/divergence.py`) or None."""
    logged = [e["frac_reward_zero_std"] for e in trainer.state.log_history if "frac_reward_zero_std" in e]
    window = trainer.metrics_window("train") if hasattr(trainer, "metrics_window") else {}  # TRL's, via the boundary
    pending = list(window.get("frac_reward_zero_std", []))
    return {"weights_changed": weights_changed, "reward_never_varied": reward_never_varied(logged + pending),
            "diverged": getattr(trainer, "divergence", None)}


def write_trainer_card(trainer: Any, output_dir: str | Path | None = None, dataset: Any = None, **_: Any) -> Path | None:
    """Write the package's card for `trainer` into `output_dir` (default `trainer.args.output_dir`).

    A card never stops training nor loses a saved model: a failure is logged as a warning and None returned.
    """
    from accelerate.utils import is_peft_model

    from ..methods import records
    from .cards import write_model_card

    info = dict(getattr(trainer, "model_card_info", None) or {})
    output_dir = Path(output_dir or trainer.args.output_dir)
    try:
        return write_model_card(
            output_dir,
            method=records(getattr(type(trainer), "method_parts", ())),  # parsed once, with the trainer's class
            base_model=info.get("base_model") or _base_model(trainer.model),
            dataset=dataset or info.get("dataset") or _dataset_name(trainer.train_dataset),
            training_args=trainer.args,
            log_history=trainer.state.log_history,
            is_adapter=is_peft_model(trainer.model),
            reward_funcs=list(getattr(trainer, "reward_func_names", None) or []) or None,
            repo_id=trainer.args.hub_model_id,
            outcome=trainer_outcome(trainer, info.get("weights_changed")),
            adapter_config=_adapter_config(trainer.model),
            heldout_benchmark=getattr(getattr(trainer, "heldout_benchmark", None), "name", None),
        )
    except Exception as e:  # noqa: BLE001 - see the docstring
        logger.warning("could not write the model card in %s: %s", output_dir, str(e).splitlines()[0] if str(e) else e)
        return None
