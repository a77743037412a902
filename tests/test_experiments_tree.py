"""`exploration-trl tree`: exact enumeration, generation constraints, and a short end-to-end run."""

from __future__ import annotations

import argparse
import itertools
import json
import math

import pytest
import torch

from exploration_trl.experiments import tree


def _task(actions="ABC", horizon=2, rewarding="AB,CA"):
    return tree.TreeTask.from_flags(actions, horizon, rewarding)


def _peaky_policy(task, seed=3, mask_head=True):
    """A tiny toy policy whose next-action distributions are far from uniform (scaled output head)."""
    model, tok = tree.build_tree_policy(task, seed=seed, mask_head=mask_head, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)
    return model.eval(), tok


def _brute_force(model, tok, task, temperature):
    """Product over steps of softmax(logits[actions] / T), one forward pass per prefix (no batching)."""
    action_ids = tree.action_token_ids(tok, task)
    prompt = tok(tree.PROMPT, add_special_tokens=False)["input_ids"]
    out = []
    for seq in itertools.product(range(len(task.actions)), repeat=task.horizon):
        prob, prefix = 1.0, list(prompt)
        for a in seq:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prefix])).logits[0, -1].double()
            step = torch.softmax(logits[action_ids] / temperature, dim=-1)
            prob *= step[a].item()
            prefix.append(action_ids[a])
        out.append(prob)
    return out


@pytest.mark.parametrize("temperature, mask_head", [(1.0, True), (0.7, False)])
def test_exact_enumeration_matches_brute_force(temperature, mask_head):
    task = _task("ABC", 3, "ABC,CCA,BAB")
    model, tok = _peaky_policy(task, mask_head=mask_head)
    exact = tree.sequence_log_probs(model, tok, task, temperature, batch_size=5).exp().tolist()
    brute = _brute_force(model, tok, task, temperature)
    assert len(exact) == len(brute) == 27
    for e, b in zip(exact, brute):
        assert e == pytest.approx(b, rel=1e-5, abs=1e-9)
    assert sum(exact) == pytest.approx(1.0, abs=1e-9)
    assert max(exact) > 0.2  # the policy is far from uniform, so the check is not trivial


@pytest.mark.parametrize("mask_head", [True, False])
def test_generation_emits_exactly_horizon_actions_and_matches_exact_distribution(mask_head):
    """`tree_generation_kwargs` as TRL passes them to `generate`: every completion is H action tokens, and the
    empirical sequence frequencies match the exact distribution (with and without the masked head)."""
    from transformers import GenerationConfig

    task = _task("ABC", 2, "AB,CA")
    model, tok = _peaky_policy(task, seed=5, mask_head=mask_head)
    gen = dict(max_new_tokens=task.horizon, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
               pad_token_id=tok.pad_token_id, eos_token_id=model.generation_config.eos_token_id,
               **tree.tree_generation_kwargs(tok, task))
    prompt = torch.tensor([tok(tree.PROMPT, add_special_tokens=False)["input_ids"]])
    n = 4000
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=prompt.expand(n, -1), attention_mask=torch.ones(n, prompt.size(1), dtype=torch.long),
                             generation_config=GenerationConfig(**gen))
    completions = out[:, prompt.size(1):]
    assert completions.shape == (n, task.horizon)
    id_to_action = dict(zip(tree.action_token_ids(tok, task), task.actions))
    counts = dict.fromkeys(task.sequences(), 0)
    for row in completions.tolist():
        assert all(i in id_to_action for i in row)
        counts["".join(id_to_action[i] for i in row)] += 1
    exact = dict(zip(task.sequences(), tree.sequence_log_probs(model, tok, task, 1.0).exp().tolist()))
    tv = 0.5 * sum(abs(counts[s] / n - exact[s]) for s in exact)
    assert tv < 0.04, (tv, counts, exact)


def test_masked_head_puts_all_mass_on_actions():
    task = _task("ABCD", 3, "ACD,BDC")
    model, tok = tree.build_tree_policy(task, seed=0)
    ids = torch.tensor([tok(tree.PROMPT + " A B", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0], dim=-1)
    on_actions = probs[:, tree.action_token_ids(tok, task)].sum(-1)
    assert torch.allclose(on_actions, torch.ones_like(on_actions))
    assert not model.lm_head.bias.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if n != "lm_head.bias")


def test_distribution_metrics():
    task = _task("AB", 2, "AB,BA")
    m = tree.distribution_metrics(task, [0.5, 0.495, 0.005, 0.0])  # AA, AB, BA, BB
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["modes_covered"] == 1  # BA holds 0.5% < 1%
    assert m["mass"] == {"AB": pytest.approx(0.495), "BA": pytest.approx(0.005)}
    assert m["entropy"] == pytest.approx(-(0.5 * math.log(0.5) + 0.495 * math.log(0.495) + 0.005 * math.log(0.005)))
    assert m["top_sequence"] == "AA"


@pytest.mark.parametrize(
    "flags, match",
    [
        (dict(actions="AAB"), "--actions"),
        (dict(horizon=0), "--horizon"),
        (dict(rewarding="AB,XYZ"), "--rewarding"),
        (dict(rewarding="ABCD"), "--rewarding"),
        (dict(actions="ABCDEFGHIJ", horizon=6), "--horizon"),
    ],
)
def test_bad_task_flags(flags, match):
    kw = dict(actions="ABCD", horizon=3, rewarding="ACD,BDC")
    kw.update(flags)
    with pytest.raises(ValueError, match=match):
        tree.TreeTask.from_flags(**kw)


def _parse(*argv):
    parser = argparse.ArgumentParser()
    tree.register(parser.add_subparsers())
    return parser.parse_args(["tree", *argv])


def test_bad_cli_input_is_a_one_line_value_error(tmp_path):
    with pytest.raises(ValueError, match="--methods: unknown method 'nope'"):
        tree.main_from_args(_parse("--methods", "grpo,nope", "--output", str(tmp_path)))
    bad = tmp_path / "bad.yaml"
    bad.write_text("casp:\n  casp_alhpa: 0.5\n")
    with pytest.raises(ValueError, match="unknown field 'casp_alhpa'.*casp_alpha"):
        tree.main_from_args(_parse("--methods", "casp", "--config", str(bad), "--output", str(tmp_path)))
    with pytest.raises(ValueError, match="--seeds"):
        tree.main_from_args(_parse("--seeds", "a", "--output", str(tmp_path)))


def test_tree_short_run(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("casp:\n  casp_alpha: 0.5\n")
    args = _parse("--methods", "grpo,casp", "--seeds", "0", "--steps", "6", "--num-generations", "8",
                  "--config", str(cfg), "--trace-every", "3", "--output", str(tmp_path / "out"))
    assert tree.main_from_args(args) == 0
    out = capsys.readouterr().out
    assert "| grpo" in out and "| casp" in out and "accuracy" in out

    data = json.loads((tmp_path / "out" / "tree.json").read_text())
    assert (tmp_path / "out" / "tree.png").stat().st_size > 1000
    assert data["task"]["rewarding"] == ["ACD", "ACB", "BDC", "BDA", "CAB", "DBA"]
    assert data["settings"]["overrides"]["casp"]["casp_alpha"] == 0.5
    assert set(data["summary"]) == {"grpo", "casp"}
    assert len(data["runs"]) == 2
    n_rewarding = len(data["task"]["rewarding"])
    for run in data["runs"]:
        assert run["invalid_completions"] == 0
        assert run["sampled_completions"] >= 6 * 8
        assert [t["step"] for t in run["trace"]] == [3, 6]
        for state in (run["init"], run["final"]):
            assert 0.0 <= state["accuracy"] <= 1.0 + 1e-9
            assert abs(state["total_mass"] - 1.0) < 1e-4
            assert 0 <= state["modes_covered"] <= n_rewarding
            assert 0.0 <= state["entropy"] <= math.log(64) + 1e-9
            assert set(state["mass"]) == set(data["task"]["rewarding"])
            assert all(0.0 <= v <= 1.0 for v in state["mass"].values())
            assert sum(state["mass"].values()) == pytest.approx(state["accuracy"])
    for entry in data["summary"].values():
        assert all(math.isfinite(entry[k]["mean"]) for k in ("accuracy", "modes_covered", "entropy"))
