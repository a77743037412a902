"""Model cards (`exploration_trl.hub.write_model_card`) and `exploration-trl push`, fully offline.

Cards are parsed back with `huggingface_hub.ModelCard.load` / `model_index_to_eval_results`, the way the Hub reads
them. Pushing is exercised with `get_token` / `create_repo` / `upload_folder` monkeypatched: nothing here touches
the network.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

import exploration_trl.trainers  # noqa: F401  (registers the built-in methods the cards below name)
from exploration_trl.cli import main
from exploration_trl.hub import load_card_state, push_output_dir, write_model_card
from exploration_trl.hub.citations import PAPERS, bibtex_for
from exploration_trl.methods import method_info
from exploration_trl.toy import build_toy, save_toy

BASE = "Qwen/Qwen2.5-0.5B-Instruct"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

GSM8K_RESULTS = {
    "schema": "exploration_trl.eval/results/v1",
    "model": "placeholder",
    "benchmark": {"name": "gsm8k", "source": "gsm8k_test.jsonl", "reward": "math_accuracy", "num_problems": 4},
    "settings": {"model": "placeholder", "benchmark": "gsm8k", "n": 8, "temperature": 0.6, "top_p": 0.95,
                 "max_tokens": 512, "seed": 0},
    "summary": {"num_problems": 4, "n": 8, "pass_at_k": {"1": 0.375, "2": 0.5357, "4": 0.6857, "8": 0.75},
                "avg_at_n": 0.375, "maj_at_n": 0.5, "token_entropy": 0.81},
    "problems": [{"index": i, "id": str(i), "n": 8, "c": c} for i, c in enumerate([0, 2, 4, 6])],
}
MATH500_RESULTS = {  # a minimal hand-written file: benchmark as a string, pass@k at the top level
    "benchmark": "math500",
    "n": 4,
    "pass_at_k": {"1": 0.2, "2": 0.3, "4": 0.4},
    "problems": [{"n": 4, "c": 1}],
}
LOG_HISTORY = [
    {"step": s, "reward": 0.1 * s, "reward_std": 0.2, "entropy": 1.5 - 0.1 * s, "loss": 0.0, "epoch": s / 4}
    for s in range(1, 5)
] + [{"step": 4, "train_runtime": 1.0, "train_loss": 0.0}]


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def toy_parts():
    return build_toy("abc", seed=0)


@pytest.fixture
def full_dir(tmp_path, toy_parts):
    model, tok = toy_parts
    return save_toy(model, tok, tmp_path / "full")


@pytest.fixture
def adapter_dir(tmp_path, toy_parts):
    from peft import LoraConfig, get_peft_model

    model, tok = toy_parts
    base = save_toy(model, tok, tmp_path / "toy_base")
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    out = tmp_path / "adapter"
    peft_model.save_pretrained(out)
    tok.save_pretrained(out)
    assert (out / "adapter_config.json").is_file()
    return out


def casp_config(**kw):
    from exploration_trl.trainers import get_config_class

    return get_config_class(kw.pop("method", "casp"))(output_dir="unused", use_cpu=True, report_to=[], **kw)


def write_results(folder: Path, data: dict, model: Path | str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(json.dumps(data))
    if model is not None:
        data["model"] = data.setdefault("settings", {})["model"] = str(Path(model).resolve())
    (folder / "results.json").write_text(json.dumps(data))
    return folder / "results.json"


def metrics_of(card: ModelCard) -> tuple[str, dict]:
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    return name, {(r.dataset_type, r.metric_type): r.metric_value for r in results}


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------- cards
def test_full_model_card_round_trips(full_dir, tmp_path):
    write_results(full_dir / "eval_gsm8k", GSM8K_RESULTS, model=full_dir)  # found automatically
    extra = write_results(tmp_path / "elsewhere", MATH500_RESULTS)
    cfg = casp_config(method="progrpo+casp", casp_alpha=0.02, progrpo_alpha=0.25, learning_rate=3e-6, max_steps=50)

    path = write_model_card(
        full_dir, method="progrpo+casp", base_model=BASE, dataset="openai/gsm8k", training_args=cfg,
        log_history=LOG_HISTORY, results=[full_dir / "eval_gsm8k" / "results.json", extra], repo_id="me/toy-casp",
    )
    assert path == full_dir / "README.md"
    card = ModelCard.load(path)
    data = card.data
    assert data.base_model == BASE
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "text-generation"
    assert data.datasets == ["openai/gsm8k"]
    for tag in ("exploration-trl", "progrpo", "casp", "grpo", "rlvr"):
        assert tag in data.tags
    assert "still" not in data.tags and "peft" not in data.tags

    name, metrics = metrics_of(card)
    assert name == "toy-casp"
    assert metrics == {
        ("openai/gsm8k", "pass@1"): 0.375,
        ("openai/gsm8k", "pass@8"): 0.75,
        ("HuggingFaceH4/MATH-500", "pass@1"): 0.2,
        ("HuggingFaceH4/MATH-500", "pass@4"): 0.4,
    }
    gsm = [r for r in model_index_to_eval_results(data.to_dict()["model-index"])[1] if r.dataset_name == "GSM8K"]
    assert {r.dataset_split for r in gsm} == {"test"} and gsm[0].metric_args == {"n": 8, "temperature": 0.6}

    png = full_dir / "training_curves.png"
    assert png.read_bytes().startswith(PNG_MAGIC)
    body = card.text
    assert "](training_curves.png)" in body
    assert "| GSM8K | 4 | 8 | 0.6 | 37.5 | 53.6 | 68.6 | 75.0 | 37.5 | 50.0 |" in body
    assert "| `casp_alpha` | 0.02 |" in body and "| `progrpo_alpha` | 0.25 |" in body
    assert "| `learning_rate` | 3e-06 |" in body and "| `max_steps` | 50 |" in body
    assert "num_train_epochs" not in body  # max_steps decided the run length
    assert "from transformers import AutoModelForCausalLM" in body and 'model_id = "me/toy-casp"' in body
    assert "AutoPeftModelForCausalLM" not in body
    assert "mean reward 0.1 at step 1 → 0.4 at step 4" in body
    for key in ("li2026progrpo", "peng2025casp", "shao2024deepseekmath", "vonwerra2020trl"):
        assert f"@misc{{{key}," in body
    assert "arxiv.org/abs/2510.14807" in body and "arxiv.org/abs/2602.05281" in body
    assert re.search(r"- trl: \d", body) and re.search(r"- transformers: \d", body)
    from exploration_trl.eval.results import package_versions  # one record of versions: results.json's

    listed = body.split("## Framework versions\n", 1)[1].split("\n## ", 1)[0].split()
    assert " ".join(listed) == " ".join(f"- {k}: {v}" for k, v in package_versions().items())
    assert "](eval_gsm8k/pass_at_k.png)" not in body  # no plot next to the hand-made results


def test_adapter_card_uses_peft_and_detects_the_adapter(adapter_dir):
    write_results(adapter_dir / "eval_gsm8k", GSM8K_RESULTS, model=adapter_dir)
    (adapter_dir / "eval_gsm8k" / "pass_at_k.png").write_bytes(PNG_MAGIC)
    cfg = casp_config(method="kl_cov", ppl_shaping_alpha=0.01)
    write_model_card(adapter_dir, method="kl_cov", base_model=BASE, dataset="gsm8k", training_args=cfg,
                     log_history=LOG_HISTORY)  # is_adapter=None: detected from adapter_config.json

    card = ModelCard.load(adapter_dir / "README.md")
    assert card.data.library_name == "peft"
    assert card.data.base_model == BASE
    assert card.data.datasets == ["openai/gsm8k"]  # built-in name -> its Hub id
    for tag in ("exploration-trl", "kl_cov", "grpo", "rlvr", "peft", "lora", "still"):
        assert tag in card.data.tags
    # peft's save_pretrained wrote a README first: its `base_model:adapter:<local path>` tag must not survive
    assert not any(t.startswith("base_model:") for t in card.data.tags)
    name, metrics = metrics_of(card)
    assert name == "adapter"
    assert metrics == {("openai/gsm8k", "pass@1"): 0.375, ("openai/gsm8k", "pass@8"): 0.75}
    body = card.text
    assert "LoRA adapter" in body and "from peft import AutoPeftModelForCausalLM" in body
    assert "](eval_gsm8k/pass_at_k.png)" in body
    assert "| `kl_cov_ratio` | 0.002 |" in body and "| `epsilon` | inf |" in body
    assert "| `ppl_shaping_alpha` | 0.01 |" in body
    for key in ("cui2025entropy", "deng2025still", "shao2024deepseekmath"):
        assert f"@misc{{{key}," in body
    assert (adapter_dir / "training_curves.png").read_bytes().startswith(PNG_MAGIC)


def test_local_base_model_is_not_written_as_hub_id(adapter_dir):
    # base_model=None: taken from adapter_config.json, which points at a local toy folder -> no Hub id
    write_model_card(adapter_dir, method="casp", is_adapter=True)
    card = ModelCard.load(adapter_dir / "README.md")
    assert card.data.base_model is None
    assert "`toy_base` (a local checkpoint, not on the Hub)" in card.text
    assert card.data.library_name == "peft"
    assert "model-index" not in card.data.to_dict()  # no results yet
    assert "exploration-trl eval --model" in card.text


def test_update_keeps_method_hyperparameters_and_foreign_metadata(full_dir, tmp_path):
    cfg = casp_config(casp_top_n=5)
    write_model_card(full_dir, "casp", BASE, dataset="openai/gsm8k", training_args=cfg, log_history=LOG_HISTORY,
                     repo_id="me/toy")
    readme = full_dir / "README.md"
    # a user adds a licence and a note, and evaluates the model later
    text = readme.read_text().replace("library_name:", "license: apache-2.0\nlibrary_name:", 1)
    text = text.replace("## How to use", "<!-- exploration-trl:keep -->\nMy note.\n<!-- /exploration-trl:keep -->\n\n"
                        "## How to use", 1)
    readme.write_text(text)
    png_before = (full_dir / "training_curves.png").read_bytes()
    write_results(full_dir / "eval_math500", MATH500_RESULTS, model=full_dir)

    write_model_card(full_dir)  # what `exploration-trl push` does: no new inputs
    card = ModelCard.load(readme)
    assert card.data.license == "apache-2.0"
    assert card.data.base_model == BASE and card.data.datasets == ["openai/gsm8k"]
    assert "casp" in card.data.tags
    assert "| `casp_top_n` | 5 |" in card.text
    assert "My note." in card.text
    assert "](training_curves.png)" in card.text
    assert (full_dir / "training_curves.png").read_bytes() == png_before
    assert metrics_of(card)[1] == {("HuggingFaceH4/MATH-500", "pass@1"): 0.2, ("HuggingFaceH4/MATH-500", "pass@4"): 0.4}
    state = load_card_state(full_dir)
    assert state["method"] == "casp" and state["repo_id"] == "me/toy"
    assert all("model" not in r for r in state["results"])  # no local paths recorded

    # a third call with explicit results for another benchmark keeps the ones recorded before
    gsm = write_results(tmp_path / "gsm", GSM8K_RESULTS)
    write_model_card(full_dir, results=[gsm])
    assert set(metrics_of(ModelCard.load(readme))[1]) == {
        ("HuggingFaceH4/MATH-500", "pass@1"), ("HuggingFaceH4/MATH-500", "pass@4"),
        ("openai/gsm8k", "pass@1"), ("openai/gsm8k", "pass@8"),
    }


def test_curves_from_trainer_state_and_results_of_other_models_skipped(full_dir, tmp_path):
    (full_dir / "trainer_state.json").write_text(json.dumps({"log_history": LOG_HISTORY}))
    other = tmp_path / "other_model"
    other.mkdir()
    write_results(full_dir / "eval_base", GSM8K_RESULTS, model=other)  # another local model's eval
    hub_base = json.loads(json.dumps(GSM8K_RESULTS))
    hub_base["model"] = BASE
    write_results(full_dir / "eval_hub_base", hub_base)  # the base model's eval: not this model's either
    write_model_card(full_dir, "grpo", BASE)
    card = ModelCard.load(full_dir / "README.md")
    assert (full_dir / "training_curves.png").is_file()
    assert "model-index" not in card.data.to_dict()
    assert card.data.tags[:4] == ["exploration-trl", "grpo", "rlvr", "trl"]
    assert "ExplorationGRPOTrainer" in card.text


def test_card_errors_are_one_line(full_dir, tmp_path):
    with pytest.raises(ValueError, match="method is unknown"):
        write_model_card(full_dir)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmark": "gsm8k"}))
    with pytest.raises(ValueError, match="no pass@k"):
        write_model_card(full_dir, "casp", BASE, results=[bad])
    with pytest.raises(ValueError, match="not found"):
        write_model_card(tmp_path / "missing", "casp", BASE)
    assert not (full_dir / "README.md").exists()


def test_card_from_real_eval_results(full_dir, tmp_path):
    """End to end with the evaluation harness's own results.json (toy model, 2 problems, n=2)."""
    from exploration_trl.eval.harness import run_eval

    out = full_dir / "eval_gsm8k"
    results = run_eval(model=str(full_dir), benchmark="gsm8k", n=2, limit=2, max_tokens=4, output_dir=out,
                               diversity=False, semantic=False, backend="transformers", progress=False)
    write_model_card(full_dir, "casp", BASE)
    _, metrics = metrics_of(ModelCard.load(full_dir / "README.md"))
    table = results["summary"]["pass_at_k"]
    expected = {("openai/gsm8k", f"pass@{k}"): round(table[k], 4) for k in ("1", "2")}
    assert metrics == expected
    assert "](eval_gsm8k/pass_at_k.png)" in (full_dir / "README.md").read_text()


def test_cli_card_call_signature(full_dir):
    """`exploration-trl train` calls write_model_card exactly so."""
    write_model_card(str(full_dir), method="casp", base_model=str(full_dir), dataset="countdown",
                     training_args=casp_config(), log_history=LOG_HISTORY, is_adapter=False)
    card = ModelCard.load(full_dir / "README.md")
    assert card.data.base_model is None and card.data.datasets is None
    assert "Countdown (synthetic) (built into exploration-trl)" in card.text
    assert "<answer>" in card.text  # the usage example asks a countdown question


# --------------------------------------------------------------------------------------------- citations
def test_every_method_cites_a_paper_with_balanced_bibtex():
    for method in ("grpo", "progrpo", "dsgrpo", "casp", "kl_cov", "clip_cov", "progrpo+kl_cov"):
        bib = bibtex_for(method, still=True)
        assert bib.count("{") == bib.count("}")
        assert "@misc{shao2024deepseekmath," in bib and "@misc{vonwerra2020trl," in bib
    from exploration_trl.trainers import METHODS

    assert {method_info(m).paper.key for m in METHODS} | {method_info("still").paper.key} <= set(PAPERS)
    assert "@misc{gai2025differential," in bibtex_for("dsgrpo")
    assert "@misc{cui2025entropy," in bibtex_for("clip_cov")


# --------------------------------------------------------------------------------------------- push
@pytest.fixture
def no_hub(monkeypatch):
    """Fail loudly if anything would reach the Hub; tests replace what they expect to be called."""
    calls = []

    def forbidden(*args, **kwargs):
        calls.append((args, kwargs))
        raise AssertionError("unexpected Hub call")

    monkeypatch.setattr(huggingface_hub, "create_repo", forbidden)
    monkeypatch.setattr(huggingface_hub, "upload_folder", forbidden)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return calls


def _push_cli(capsys, folder, *extra):
    rc = main(["push", "--output-dir", str(folder), "--repo-id", "me/toy-casp", *extra])
    captured = capsys.readouterr()
    return rc, captured.err.strip().splitlines()


def test_push_without_token_fails_in_one_line_and_changes_nothing(full_dir, monkeypatch, capsys, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    write_model_card(full_dir, "casp", BASE, training_args=casp_config(), log_history=LOG_HISTORY)
    before = folder_bytes(full_dir)
    rc, err = _push_cli(capsys, full_dir, "--private")
    assert rc == 2
    assert err == ["error: cannot push to the Hub: no token found (run `hf auth login`, or set HF_TOKEN)"]
    assert folder_bytes(full_dir) == before
    assert no_hub == []


def test_push_network_error_fails_in_one_line_and_changes_nothing(full_dir, monkeypatch, capsys, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")

    def unreachable(*args, **kwargs):
        raise ConnectionError("Failed to resolve 'huggingface.co'\n(more detail on a second line)")

    monkeypatch.setattr(huggingface_hub, "create_repo", unreachable)
    (full_dir / "trainer_state.json").write_text(json.dumps({"log_history": LOG_HISTORY}))  # would draw curves
    write_results(full_dir / "eval_gsm8k", GSM8K_RESULTS, model=full_dir)  # would change the card
    before = folder_bytes(full_dir)
    rc, err = _push_cli(capsys, full_dir, "--method", "casp", "--base-model", BASE)
    assert rc == 2
    assert err == ["error: cannot push to the Hub: network unreachable (Failed to resolve 'huggingface.co')"]
    assert folder_bytes(full_dir) == before
    assert not (full_dir / "README.md").exists() and not (full_dir / "training_curves.png").exists()


def test_push_upload_failure_restores_the_previous_card(full_dir, monkeypatch, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo_id, **kw: huggingface_hub.RepoUrl(
        f"https://huggingface.co/{repo_id}"))
    seen = {}

    def upload_then_fail(**kwargs):
        seen["readme"] = (Path(kwargs["folder_path"]) / "README.md").read_text()
        raise TimeoutError("read timed out")

    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_then_fail)
    (full_dir / "README.md").write_text("# my own notes\n")
    (full_dir / "trainer_state.json").write_text(json.dumps({"log_history": LOG_HISTORY}))
    before = folder_bytes(full_dir)
    with pytest.raises(ValueError) as err:
        push_output_dir(full_dir, "me/toy-casp", method="casp", base_model=BASE)
    assert str(err.value) == "cannot push to the Hub: network unreachable (read timed out)"
    assert "exploration-trl" in seen["readme"]  # the new card was in the folder during the upload ...
    assert folder_bytes(full_dir) == before  # ... and the old one is back, no curves left behind


def test_push_success_uploads_folder_with_card(full_dir, monkeypatch, capsys, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    calls = {}

    def create_repo(repo_id, **kw):
        calls["create_repo"] = (repo_id, kw)
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(**kw):
        calls["upload_folder"] = kw
        calls["card"] = ModelCard.load(Path(kw["folder_path"]) / "README.md")
        return "https://huggingface.co/me/toy-casp/commit/abc123"

    monkeypatch.setattr(huggingface_hub, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_folder)
    write_model_card(full_dir, "progrpo", BASE, dataset="openai/gsm8k", training_args=casp_config(method="progrpo"),
                     log_history=LOG_HISTORY)
    extra = write_results(full_dir.parent / "gsm", GSM8K_RESULTS)
    rc, _ = _push_cli(capsys, full_dir, "--private", "--results", str(extra), "--commit-message", "first upload")
    assert rc == 0
    repo_id, kw = calls["create_repo"]
    assert repo_id == "me/toy-casp" and kw["exist_ok"] is True and kw["private"] is True and kw["token"] == "hf_fake"
    up = calls["upload_folder"]
    assert up["repo_id"] == "me/toy-casp" and Path(up["folder_path"]) == full_dir
    assert up["commit_message"] == "first upload" and "checkpoint-*" in up["ignore_patterns"]
    card = calls["card"]
    assert card.data.base_model == BASE and "progrpo" in card.data.tags
    assert metrics_of(card) == ("toy-casp", {("openai/gsm8k", "pass@1"): 0.375, ("openai/gsm8k", "pass@8"): 0.75})
    assert ModelCard.load(full_dir / "README.md").text == card.text  # the card stays after a successful push
    assert 'model_id = "me/toy-casp"' in card.text


def test_push_bare_name_goes_to_the_token_namespace(full_dir, monkeypatch, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    monkeypatch.setattr(huggingface_hub, "create_repo",
                        lambda repo_id, **kw: huggingface_hub.RepoUrl(f"https://huggingface.co/alice/{repo_id}"))
    uploaded = {}
    commit_url = "https://huggingface.co/alice/toy/commit/0123abc"
    commit = huggingface_hub.CommitInfo(commit_url=commit_url, commit_message="m", commit_description="", oid="0123abc")
    monkeypatch.setattr(huggingface_hub, "upload_folder", lambda **kw: uploaded.update(kw) or commit)
    url = push_output_dir(full_dir, "toy", method="casp", base_model=BASE)
    assert url == commit_url and type(url) is str  # the commit's URL as a plain string, not the repo's URL
    assert uploaded["repo_id"] == "alice/toy"
    assert 'model_id = "alice/toy"' in (full_dir / "README.md").read_text()
    assert load_card_state(full_dir)["repo_id"] == "alice/toy"


def test_push_rejects_bad_input_before_any_call(full_dir, tmp_path, monkeypatch, capsys, no_hub):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    rc, err = _push_cli(capsys, tmp_path / "missing")
    assert rc == 2 and len(err) == 1 and "not found" in err[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, err = _push_cli(capsys, empty)
    assert rc == 2 and len(err) == 1 and "no model or adapter weights" in err[0]
    rc = main(["push", "--output-dir", str(full_dir), "--repo-id", "not a repo"])
    assert rc == 2 and "not a valid repo id" in capsys.readouterr().err
    rc, err = _push_cli(capsys, full_dir)  # no card yet and no --method
    assert rc == 2 and len(err) == 1 and "--method" in err[0]
    assert no_hub == [] and not (full_dir / "README.md").exists()


def test_push_is_a_cli_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["push", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--output-dir", "--repo-id", "--private", "--results", "--commit-message"):
        assert flag in out


def test_every_method_shows_its_own_settings_on_the_card():
    """Each registry method's config fields appear in the card's method table (a method added without a prefix in
    the former `hub.tables.METHOD_PREFIXES` used to get an empty table: PKPO's card did not say its k; the prefixes
    are now in each method's record)."""
    from exploration_trl.hub.tables import extract_hyperparameters
    from exploration_trl.methods import method_info
    from exploration_trl.trainers import METHODS, get_config_class

    for method in METHODS:
        if method == "grpo":
            continue
        config = get_config_class(method)(output_dir="unused", report_to=[])
        prefix = method_info(method).config_prefixes  # e.g. ds_ for dsgrpo, outcome_ for outcome_explore
        own = sorted(f.name for f in dataclasses.fields(config) if f.name.startswith(prefix))
        shown = [key for key, _ in extract_hyperparameters(method, config)["method"]]
        assert own and set(own) <= set(shown), (method, own, shown)


# --------------------------------------------------------------------------------------------- numbers in the prose
NUMBER = r"-?\d+(?:\.\d+)?"
SUMMARY_PART = re.compile(
    rf"(?P<label>mean reward|token entropy|held-out pass@(?P<k>\d+)) (?P<v0>{NUMBER})(?P<u0> nats|%)? at step "
    rf"(?P<s0>\d+)(?: → (?P<v1>{NUMBER})(?P<u1> nats|%)? at step (?P<s1>\d+))?"
    rf"(?: → (?P<v2>{NUMBER})(?P<u2>%) at step (?P<s2>\d+) \(final evaluation\))?")


def _close(shown: str, unit: str | None, value: float) -> bool:
    """Is `shown` (as printed, maybe in %) `value` to the precision it is printed with?"""
    scale = 100.0 if unit == "%" else 1.0
    digits = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - scale * value) <= 0.5 * 10.0 ** -digits + 1e-12 and (
        unit == "%" or f"{value:.3g}" == shown)


def _prose(body: str, static: list[str]) -> list[str]:
    """The card's sentences that carry numbers: no YAML, code, tables, versions, BibTeX, link targets, citations
    of papers by year, nor the `static` phrases (text that does not depend on the run)."""
    body = re.sub(r"```.*?```", "", body, flags=re.S)
    body = re.sub(r"<!--.*?-->", "", body, flags=re.S)
    body = body.split("## Framework versions")[0]
    for phrase in static:
        body = body.replace(phrase, "")
    body = re.sub(r"\]\([^)]*\)", "]", body)  # link targets
    body = re.sub(r"\b[A-Z][a-z]+ (?:et al\.|and [A-Z][a-z]+),? \(?\d{4}\)?", "", body)  # (Shao et al., 2024)
    return [line for line in body.splitlines() if re.search(r"\d", line) and not line.startswith("|")]


@pytest.mark.parametrize("heldout", [None, "countdown3"])
@pytest.mark.parametrize("eval_steps", [(100, 200, 400), (0, 300, 600)])
def test_every_number_in_the_card_is_the_data_at_its_step(full_dir, eval_steps, heldout):
    """A demo-like run: reward and entropy logged every 10 steps for 600 steps, held-out pass@k only on evaluation
    steps (without and with a step-0 evaluation), the final evaluation in `eval/results.json`. Every number in the
    card's prose and pass@k table is read back and checked against the value of the data at the step it names.
    When the card knows the benchmark evaluated during training (`heldout`), the training sentence's held-out pass@k
    goes on to the final evaluation, at the last step (the table's value), instead of stopping at the last
    evaluation during training."""
    from exploration_trl.hub.card_data import resolve_dataset
    from exploration_trl.hub.outcome import outcome_notes
    from exploration_trl.hub.protocol_verdict import verdict_section

    history = [{"step": s, "reward": 0.05 + 0.0013 * s, "entropy": 1.7 - 0.0021 * s, "loss": 0.01}
               for s in range(10, 601, 10)]
    for i, s in enumerate(eval_steps):
        history.append({"step": s, "eval_pass@1": 0.2213 + 0.0217 * i, "eval_pass@64": 0.9342 - 0.0131 * i,
                        "eval_pass@64_ci_low": 0.5, "eval_pass@64_ci_high": 0.99})
    history.sort(key=lambda e: e["step"])
    history.append({"step": 600, "train_runtime": 171.3, "train_loss": 0.0123})
    final = {"benchmark": "countdown3", "n": 64, "num_problems": 200, "pass_at_k": {"1": 0.2914, "64": 0.8953},
             "problems": [{"n": 64, "c": 3}]}
    write_results(full_dir / "eval", final, model=full_dir)
    outcome = {"weights_changed": True, "reward_never_varied": False}
    write_model_card(full_dir, method="pkpo", base_model=BASE, dataset="countdown-tiny", log_history=history,
                     outcome=outcome, heldout_benchmark=heldout)
    body = ModelCard.load(full_dir / "README.md").text

    def series(key):
        return [(e["step"], e[key]) for e in history if key in e]

    # The protocol's verdict section quotes the published verdicts, not this run (tests/test_card_verdicts.py).
    verdict = [line for line in verdict_section("pkpo").splitlines() if line.strip()]
    static = [BASE, method_info("pkpo").description, resolve_dataset("countdown-tiny")[1], *outcome_notes(outcome),
              *verdict]
    lines = _prose(body, static)
    checked, to_final = set(), set()
    for line in lines:
        rest = line
        for m in SUMMARY_PART.finditer(line):
            key = {"mean reward": "reward", "token entropy": "entropy"}.get(m["label"], f"eval_{m['label'][9:]}")
            points = series(key)
            assert (int(m["s0"]), m["v1"] is None) == (points[0][0], len(points) == 1), m[0]
            assert _close(m["v0"], m["u0"], points[0][1]), m[0]
            if m["v1"] is not None:
                assert int(m["s1"]) == points[-1][0], m[0]  # the last value logged, at its own step
                assert _close(m["v1"], m["u1"], points[-1][1]), m[0]
            if m["v2"] is not None:  # the final evaluation, after training's last step
                assert int(m["s2"]) == max(e["step"] for e in history), m[0]
                assert _close(m["v2"], m["u2"], final["pass_at_k"][m["k"]]), m[0]
                to_final.add(key)
            checked.add(key)
            rest = rest.replace(m[0], "")
        steps = re.search(r"During training \((\d+) steps\)", rest)
        if steps:
            assert int(steps[1]) == max(e["step"] for e in history)
            rest = rest.replace(steps[0], "")
        assert not re.search(r"\d", rest), f"a number the test cannot trace to the data: {line!r}"
    assert checked == {"reward", "entropy", "eval_pass@1", "eval_pass@64"}
    assert to_final == ({"eval_pass@1", "eval_pass@64"} if heldout else set())

    table = [line for line in body.splitlines() if line.startswith("| Countdown-3 ")]
    assert len(table) == 1
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[:4] == ["Countdown-3", "200", "64", "None"]
    assert [float(c) for c in cells[4:6]] == [round(100 * final["pass_at_k"][k], 1) for k in ("1", "64")]
    assert cells[6:] == ["–", "–"]
