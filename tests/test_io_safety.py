"""Outputs that cannot be written (exploration_trl/io_safety.py) and writes that never truncate what exists.

Simulated how: an output path that is a file, and one under a file, are real. A read-only folder is real: `chmod
555` when not root; as root (who ignores permission bits) a read-only tmpfs mount when the machine allows one. A full
disk is simulated by making the write raise `OSError(ENOSPC)` (monkeypatching `os.write`/`os.fsync`, or a method of
the HF Trainer for a checkpoint) and by a reported free space of 0; as root, also a real 1 MiB tmpfs filled up.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

import exploration_trl as et
from exploration_trl.io_safety import OutputNotWritableError, check_output_dir, os_error_line, write_atomic
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_output_dir_that_is_a_file(tmp_path):
    f = tmp_path / "out"
    f.write_text("mine")
    with pytest.raises(OutputNotWritableError, match=r"^output_dir '.*out' is a file, not a folder; choose a folder"):
        check_output_dir(f)
    with pytest.raises(OutputNotWritableError, match=r"cannot be created: '.*out' is a file, not a folder"):
        check_output_dir(f / "run1")
    assert f.read_text() == "mine"


def test_missing_output_dir_is_fine_and_not_created(tmp_path):
    check_output_dir(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists() and os.listdir(tmp_path) == []  # the probe file is gone too


def _read_only_folder(tmp_path):
    """A real read-only folder: permission bits for a normal user, a read-only tmpfs for root."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return folder, lambda: folder.chmod(0o755)
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("root without mount: no way to make a read-only folder here")
    return folder, lambda: subprocess.run(["umount", str(folder)], check=True)


def test_read_only_output_dir(tmp_path):
    folder, undo = _read_only_folder(tmp_path)
    try:
        with pytest.raises(OutputNotWritableError, match=r"output_dir '.*ro' cannot be written: "):
            check_output_dir(folder)
        with pytest.raises(OutputNotWritableError, match=r"\(its parent '.*ro'\) cannot be written"):
            check_output_dir(folder / "new")
    finally:
        undo()


def test_full_disk_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OutputNotWritableError, match=r"output_dir '.*' cannot be written: the disk is full"):
        check_output_dir(tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    with pytest.raises(OutputNotWritableError, match=r"the disk is full \(0 KiB free\)"):
        check_output_dir(tmp_path, key="--output-dir")


def test_real_full_tmpfs(tmp_path):
    """As root: a real 1 MiB tmpfs, filled up. The check refuses it and a failed write keeps the old file."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                          capture_output=True).returncode:
        pytest.skip("needs root and mount (the monkeypatched tests above cover the same lines)")
    try:
        (mnt / "results.json").write_text('{"old": true}')
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        with pytest.raises(OutputNotWritableError, match="the disk is full"):
            check_output_dir(mnt)
        with pytest.raises(OSError) as info:
            write_atomic(mnt / "results.json", "x" * 200_000)
        assert info.value.errno == errno.ENOSPC
        assert (mnt / "results.json").read_text() == '{"old": true}'
        assert sorted(os.listdir(mnt)) == ["filler", "results.json"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_write_atomic_never_truncates(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text('{"old": true}')
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OSError):
        write_atomic(target, '{"new": true}')
    monkeypatch.undo()
    assert target.read_text() == '{"old": true}' and os.listdir(tmp_path) == ["results.json"]
    write_atomic(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'


def test_os_error_line_names_the_path():
    e = OSError(errno.ENOSPC, "No space left on device", "/data/out/checkpoint-4/model.safetensors")
    assert os_error_line(e) == ("cannot write '/data/out/checkpoint-4/model.safetensors': the disk is full; free "
                                "space or choose a writable output_dir (what was saved before is kept)")
    assert os_error_line(OSError(errno.EROFS, "x"), "/out").startswith("cannot write '/out': the file system is read-only")
    assert os_error_line(OSError(errno.ECONNRESET, "x")) is None


def test_existing_checkpoint_survives_a_failed_save(tmp_path, monkeypatch):
    """A run restarted in the same output_dir re-saves checkpoint-1: if that save fails (full disk), the old
    checkpoint-1 is put back whole; if it succeeds, the old one is replaced and nothing is left aside."""
    from transformers import Trainer

    ckpt = toy_checkpoint(tmp_path / "ckpt")
    cls = et.get_trainer_class("grpo")
    out = tmp_path / "out"
    old = out / "checkpoint-1"
    old.mkdir(parents=True)
    marker = uuid.uuid4().hex
    (old / "model.safetensors").write_text(marker)

    def trainer():
        args = cls.config_class(**grpo_kwargs(out, max_steps=1, save_strategy="steps", save_steps=1))
        return cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", _enospc)
    with pytest.raises(OSError):
        trainer().train()
    assert os.listdir(old) == ["model.safetensors"] and (old / "model.safetensors").read_text() == marker
    assert not [name for name in os.listdir(out) if "previous" in name]  # nothing left aside
    monkeypatch.undo()
    trainer().train()
    assert (old / "trainer_state.json").is_file() and (old / "model.safetensors").read_bytes()[:8] != marker[:8].encode()
    assert not [name for name in os.listdir(out) if "previous" in name]


def test_eval_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    from helpers import run_error

    model = toy_checkpoint(tmp_path / "ckpt")
    taken = tmp_path / "taken"
    taken.write_text("results of another run")
    line = run_error(capsys, ["eval", "--model", model, "--benchmark", "countdown3", "--output-dir", str(taken)])
    assert line == f"error: --output-dir '{taken}' is a file, not a folder; choose a folder path (or move the file away)"
    assert taken.read_text() == "results of another run"


def test_push_to_a_full_disk_is_one_line_before_any_network(tmp_path, capsys, monkeypatch):
    from helpers import run_error

    folder = tmp_path / "trained"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "create_repo", lambda *a, **k: pytest.fail("network before the check"))
    line = run_error(capsys, ["push", "--output-dir", str(folder), "--repo-id", "me/x", "--method", "grpo",
                              "--base-model", "toy"])
    assert line == (f"error: cannot push to the Hub: --output-dir '{folder}': the disk is full (0 KiB free); free "
                    "space there or choose a folder on another disk")
    assert sorted(os.listdir(folder)) == ["model.safetensors"]


def test_experiment_output_that_is_a_file_is_one_line(tmp_path, capsys):
    from helpers import run_error

    taken = tmp_path / "taken"
    taken.write_text("x")
    for argv in (["demo", "--quick"], ["tree"], ["countdown-tiny"]):
        line = run_error(capsys, [*argv, "--output-dir", str(taken)])
        assert line == f"error: --output-dir '{taken}' is a file, not a folder; choose a folder path (or move the file away)"


def test_disk_full_while_training_is_one_line_naming_the_folder(tmp_path, capsys, monkeypatch):
    """A checkpoint write that fails mid-run (simulated ENOSPC) ends as one line naming the output folder."""
    from transformers import Trainer

    from helpers import run_error, write_yaml

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", _enospc)
    line = run_error(capsys, ["train", "--config", write_yaml(tmp_path, save_strategy="steps", save_steps=1)])
    assert line == (f"error: cannot write '{tmp_path / 'out'}': the disk is full; free space or choose a writable "
                    "output_dir (what was saved before is kept)")


def test_disk_full_at_the_final_save_keeps_the_checkpoint_and_leaves_no_partial_model(tmp_path, capsys, monkeypatch):
    """The end-of-training save fails half-way (a truncated model.safetensors, then ENOSPC): the partial files are
    removed, the last checkpoint is intact and named in the one error line, and resuming from it saves the model."""
    from transformers import Trainer

    from helpers import run_error, write_yaml

    real_save = Trainer._save

    def save_half(self, output_dir=None, state_dict=None):
        if "checkpoint-" in str(output_dir):
            return real_save(self, output_dir, state_dict)
        (Path(output_dir) / "model.safetensors").write_bytes(b"\0" * 100)  # truncated
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Trainer, "_save", save_half)
    config = write_yaml(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    out = tmp_path / "out"
    line = run_error(capsys, ["train", "--config", config])
    ckpt = out / "checkpoint-2"
    assert line == (f"error: cannot write '{out}': the disk is full; the trained model was not saved (its partial "
                    f"files are removed); the last checkpoint, {ckpt}, is intact: free space, then rerun with "
                    f"--resume_from_checkpoint {ckpt} to save the model")
    assert not (out / "model.safetensors").exists() and (ckpt / "model.safetensors").stat().st_size > 1000
    monkeypatch.undo()
    from exploration_trl.cli import main

    assert main(["train", "--config", config, "--resume_from_checkpoint", str(ckpt)]) == 0
    from safetensors.torch import load_file

    final, saved = load_file(str(out / "model.safetensors")), load_file(str(ckpt / "model.safetensors"))
    assert final.keys() == saved.keys() and all((final[k] == saved[k]).all() for k in final)
    assert (out / "README.md").is_file()


def test_disk_full_at_the_final_save_without_checkpoints_says_so(tmp_path, capsys, monkeypatch):
    from transformers import Trainer

    from helpers import run_error, write_yaml

    monkeypatch.setattr(Trainer, "_save", _enospc)
    line = run_error(capsys, ["train", "--config", write_yaml(tmp_path, save_strategy="no")])
    assert line.endswith("no checkpoint was saved (set save_strategy: steps to keep one), so the run must be repeated")
    assert not (tmp_path / "out" / "model.safetensors").exists()
