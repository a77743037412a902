"""Nothing private in what `push` uploads: every file `push --dry-run` lists (the card as it would be uploaded, read
from memory; the others from disk) holds no absolute local path and no token. The run starts from a local folder,
so the card names the base model by its folder name."""

from __future__ import annotations

import json
import re

import yaml

from exploration_trl.hub.push import plan_push
from helpers import CLI_BASE

FAKE_TOKEN = "hf_" + "Zq8" * 12


def test_pushed_files_hold_no_local_path_and_no_token(tmp_path, capsys, monkeypatch):
    from exploration_trl.cli import main

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    out = tmp_path / "private-user-folder" / "out"
    cfg = {**CLI_BASE, "output_dir": str(out), "max_steps": 2, "hub_token": FAKE_TOKEN}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml")]) == 0
    capsys.readouterr()

    plan = plan_push(out, repo_id="me/demo")
    files = dict(plan.files)
    assert "README.md" in files and "model.safetensors" in files and "training_args.bin" not in files
    local = re.compile(re.escape(str(tmp_path)).encode() + b"|" + re.escape(str(tmp_path.resolve())).encode())
    for name in files:
        data = plan.card.files[name] if name in plan.card.files else (out / name).read_bytes()
        assert not local.search(data), f"{name} holds a local path"
        assert FAKE_TOKEN.encode() not in data, f"{name} holds the token"

    card = plan.card.files["README.md"].decode()
    state = json.loads(re.search(r"<!-- exploration-trl-card (\{.*\}) -->", card).group(1))
    assert state["base_model"] == "toy_base" and state["base_model_local"] is True
    assert "`toy_base` (a local checkpoint, not on the Hub)" in card

    # Re-rendered from the saved card state alone (as `push` does later), the base model is still the local folder.
    again = plan_push(out, repo_id="me/demo").card.files["README.md"].decode()
    assert "`toy_base` (a local checkpoint, not on the Hub)" in again and "huggingface.co/toy_base" not in again
