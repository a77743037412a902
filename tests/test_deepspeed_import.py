"""A run that does not use DeepSpeed does not import it, so it does not print DeepSpeed's "[WARNING] ... Setting
accelerator to CPU" (accelerate's `extract_model_from_parallel`, called on every `save_pretrained`, imported it
whenever it was installed; `exploration_trl.boundary.deepspeed_import`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from helpers import write_yaml

REPO = Path(__file__).resolve().parents[1]
#: Trains (with a checkpoint save, the toy model's save and the final save), then reports what was imported.
TRAIN_AND_REPORT = """
import sys
from exploration_trl.cli import main
rc = main(["train", "--config", sys.argv[1], "--save_strategy", "steps", "--save_steps", "1"])
print("deepspeed imported:", "deepspeed" in sys.modules)
sys.exit(rc)
"""


def test_train_without_deepspeed_neither_imports_it_nor_prints_its_warning(tmp_path):
    assert importlib.util.find_spec("deepspeed") is not None  # installed (the test extra): what made the noise
    proc = subprocess.run([sys.executable, "-c", TRAIN_AND_REPORT, write_yaml(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deepspeed imported: False" in proc.stdout
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr
    assert (tmp_path / "out" / "checkpoint-1").is_dir()  # the checkpoint save, too, ran without it


#: A Python-API user's run: builds the trainer itself (no CLI), trains with a checkpoint save, saves the model.
PYTHON_API_AND_REPORT = """
import sys
sys.path.insert(0, "tests")
import exploration_trl as et
from helpers import train
cls = et.get_trainer_class("grpo")
trainer = train(cls, cls.config_class, sys.argv[1] + "/ckpt", sys.argv[1] + "/out", max_steps=1,
                save_strategy="steps", save_steps=1)
trainer.save_model(sys.argv[1] + "/final")
print("deepspeed imported:", "deepspeed" in sys.modules)
"""


def test_python_api_trainer_without_deepspeed_neither_imports_it_nor_prints_its_warning(tmp_path):
    from helpers import toy_checkpoint

    toy_checkpoint(tmp_path / "ckpt")  # here, not in the run: a user's model comes saved already
    proc = subprocess.run([sys.executable, "-c", PYTHON_API_AND_REPORT, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deepspeed imported: False" in proc.stdout
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr
    assert (tmp_path / "out" / "checkpoint-1").is_dir() and (tmp_path / "final" / "config.json").is_file()


def test_deepspeed_counts_as_available_to_unwrapping_once_imported():
    """The switch changes no answer: a model can only be a `DeepSpeedEngine` once deepspeed is imported, and then
    accelerate sees it as installed again. Idempotent."""
    from accelerate.utils import other

    from exploration_trl.boundary.deepspeed_import import import_deepspeed_only_when_used

    import_deepspeed_only_when_used()
    patched = other.is_deepspeed_available
    import_deepspeed_only_when_used()
    assert other.is_deepspeed_available is patched
    import deepspeed  # noqa: F401  (the run that uses it imports it)

    assert other.is_deepspeed_available() is True
