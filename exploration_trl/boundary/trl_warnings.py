"""Warnings of TRL's own that a user cannot act on, filtered only while the trainer needs it."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

#: transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16's rollout helpers
#: (`disable_gradient_checkpointing`, `unwrap_model_for_generation`) still call the old names on every rollout,
#: whatever the config says. Only these three messages, from transformers' model code, are filtered, and only while
#: the trainer is built, trains or evaluates (`quiet_trl_rollout_deprecations`).
_TRL_ROLLOUT_DEPRECATIONS = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


@contextmanager
def quiet_trl_rollout_deprecations():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRL_ROLLOUT_DEPRECATIONS, category=FutureWarning,
                                module="transformers.modeling_utils")
        yield
