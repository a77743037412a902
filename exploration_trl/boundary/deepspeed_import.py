"""DeepSpeed stays unimported unless the run uses it.

accelerate's `extract_model_from_parallel` (which transformers' `unwrap_model` calls on every `save_pretrained`, and
the Trainer on its way) imports `deepspeed` whenever the package is installed, only to test
`isinstance(model, DeepSpeedEngine)`. That import costs about 0.3 s and, on a machine without a GPU, prints DeepSpeed's
"[WARNING] ... Setting accelerator to CPU" in runs that never use DeepSpeed. A model can only be a `DeepSpeedEngine`
once `deepspeed` has been imported (a DeepSpeed config imports it when the run starts), so asking "is it imported?"
there instead of "is it installed?" changes no answer. No environment variable of accelerate or DeepSpeed does this:
`DS_ACCELERATOR=cpu` silences the line but still imports DeepSpeed.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


def import_deepspeed_only_when_used() -> None:
    """Make accelerate's unwrapping see DeepSpeed as available only once something imported it (idempotent).

    Relies on accelerate (1.x) looking `is_deepspeed_available` up among `accelerate.utils.other`'s globals when it
    unwraps a model (`tests/test_deepspeed_import.py` pins it: no `deepspeed` in `sys.modules` after a run)."""
    try:
        from accelerate.utils import other
    except ImportError:  # no accelerate, no eager import to avoid
        return
    installed = other.is_deepspeed_available
    if getattr(installed, "only_when_imported", False):
        return

    def imported() -> bool:
        return "deepspeed" in sys.modules and installed()

    imported.only_when_imported = True
    other.is_deepspeed_available = imported


@contextmanager
def deepspeed_only_when_imported():
    """`import_deepspeed_only_when_used` for the duration of a call, then accelerate's own check again: the trainer
    scopes it to `train` and `save_model`, the calls that unwrap (and so save) the model, instead of patching the
    process while it is being built. A process that already switched (the CLI does, for the whole run) keeps it."""
    try:
        from accelerate.utils import other
    except ImportError:
        yield
        return
    original = other.is_deepspeed_available
    import_deepspeed_only_when_used()
    try:
        yield
    finally:
        other.is_deepspeed_available = original
