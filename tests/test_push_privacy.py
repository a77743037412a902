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

    assert main(["eval", "--model", str(out), "--benchmark", "countdown3", "--n", "2", "--limit", "2",
                 "--max-tokens", "8", "--output-dir", str(out / "eval_countdown3"), "--no-semantic", "--quiet"]) == 0
    capsys.readouterr()

    plan = plan_push(out, repo_id="me/demo")
    files = dict(plan.files)
    assert {"eval_countdown3/results.json", "eval_countdown3/samples.jsonl"} <= set(files)
    assert "pass@1" in plan.card.files["README.md"].decode()  # the card still finds its own results
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


def test_eval_records_a_local_model_relative_to_its_folder_and_resumes_0_2_0_runs(tmp_path):
    """results.json and samples.jsonl name a local model relative to their folder; an eval folder written by 0.2.0
    (absolute paths) still resumes."""
    from exploration_trl.eval.harness import run_eval
    from helpers import toy_checkpoint

    model = toy_checkpoint(tmp_path / "toy")
    out = tmp_path / "evals" / "c3"
    kw = dict(n=2, max_tokens=8, semantic=False, progress=False)
    first = run_eval(model, "countdown3", output_dir=out, limit=1, **kw)
    assert json.loads((out / "results.json").read_text())["settings"]["model"] == "../../toy"
    assert first["summary"]["num_problems"] == 1
    # as 0.2.0 wrote them: the model's absolute path in every row and in results.json
    absolute = str((tmp_path / "toy").resolve())
    for name in ("samples.jsonl", "results.json"):
        text = (out / name).read_text()
        (out / name).write_text(text.replace('"../../toy"', json.dumps(absolute)))
    again = run_eval(model, "countdown3", output_dir=out, limit=2, **kw)
    assert again["summary"]["num_problems"] == 2
    assert str(tmp_path) not in (out / "results.json").read_text()


def test_adapter_of_a_local_base_is_uploaded_with_the_base_folder_name(tmp_path, monkeypatch):
    """PEFT writes the local base model's absolute path into adapter_config.json: the uploaded copy names the folder,
    and the local file is back to what it was after the push (success or failure)."""
    import huggingface_hub
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from exploration_trl.hub.push import push_output_dir
    from helpers import toy_checkpoint

    base = toy_checkpoint(tmp_path / "my-sft-base")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=2, target_modules=["q_proj"]))
    out = tmp_path / "adapter"
    model.save_pretrained(out)
    local = (out / "adapter_config.json").read_bytes()
    assert str(tmp_path).encode() in local  # what PEFT wrote

    plan = plan_push(out, repo_id="me/adapter", method="grpo", base_model=base)
    uploaded = plan.public["adapter_config.json"]
    assert json.loads(uploaded)["base_model_name_or_path"] == "my-sft-base"
    for name in dict(plan.files):
        data = plan.card.files.get(name) or plan.public.get(name) or (out / name).read_bytes()
        assert str(tmp_path).encode() not in data, name

    seen = {}

    def fake_upload(**kw):
        seen["adapter"] = (out / "adapter_config.json").read_bytes()
        return "https://huggingface.co/me/adapter/commit/1"

    monkeypatch.setattr(huggingface_hub, "create_repo", lambda *a, **k: "me/adapter")
    monkeypatch.setattr(huggingface_hub, "upload_folder", fake_upload)
    push_output_dir(out, "me/adapter", token="hf_" + "x" * 30, method="grpo", base_model=base)
    assert seen["adapter"] == uploaded
    assert (out / "adapter_config.json").read_bytes() == local
