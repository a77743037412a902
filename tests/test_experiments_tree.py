"""`exploration-trl tree`: exact enumeration, generation constraints, and a short end-to-end run."""

from __future__ import annotations

import argparse
import itertools
import json
import math

import pytest
import torch

from exploration_trl.experiments.research import tree, tree_command


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


def _sample_counts(model, tok, task, n, eos_token_id, seed=0):
    """Counts of each action sequence in `n` completions generated with `tree_generation_kwargs`, as TRL passes them
    to `generate`; asserts every completion is exactly `horizon` action tokens."""
    from transformers import GenerationConfig

    gen = dict(max_new_tokens=task.horizon, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
               pad_token_id=tok.pad_token_id, eos_token_id=eos_token_id, **tree.tree_generation_kwargs(tok, task))
    prompt = torch.tensor([tok(tree.PROMPT, add_special_tokens=False)["input_ids"]])
    torch.manual_seed(seed)
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
    return counts


@pytest.mark.parametrize("mask_head", [True, False])
def test_generation_emits_exactly_horizon_actions_and_matches_exact_distribution(mask_head):
    """`tree_generation_kwargs` as TRL passes them to `generate`: every completion is H action tokens, and the
    empirical sequence frequencies match the exact distribution (with and without the masked head)."""
    task = _task("ABC", 2, "AB,CA")
    model, tok = _peaky_policy(task, seed=5, mask_head=mask_head)
    n = 4000
    counts = _sample_counts(model, tok, task, n, model.generation_config.eos_token_id)
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
    tree_command.register(parser.add_subparsers())
    return parser.parse_args(["tree", *argv])


def test_output_dir_flag_keeps_the_old_spelling_as_a_hidden_alias(capsys):
    assert _parse("--output-dir", "a").output == "a" and _parse("--output", "b").output == "b"
    assert _parse().output is None  # main_from_args picks runs/tree or runs/tree_sweep
    with pytest.raises(SystemExit):
        _parse("--help")
    shown = capsys.readouterr().out
    assert "--output-dir OUTPUT_DIR" in shown and shown.count("--output") == shown.count("--output-dir")  # alias hidden


def test_bad_cli_input_is_a_one_line_value_error(tmp_path):
    with pytest.raises(ValueError, match="--methods: unknown method 'nope'"):
        tree_command.main_from_args(_parse("--methods", "grpo,nope", "--output", str(tmp_path)))
    bad = tmp_path / "bad.yaml"
    bad.write_text("casp:\n  casp_alhpa: 0.5\n")
    with pytest.raises(ValueError, match="unknown field 'casp_alhpa'.*casp_alpha"):
        tree_command.main_from_args(_parse("--methods", "casp", "--config", str(bad), "--output", str(tmp_path)))
    with pytest.raises(ValueError, match="--seeds"):
        tree_command.main_from_args(_parse("--seeds", "a", "--output", str(tmp_path)))


def test_tree_short_run(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("casp:\n  casp_alpha: 0.5\n")
    args = _parse("--methods", "grpo,casp", "--seeds", "0", "--steps", "6", "--num-generations", "8",
                  "--config", str(cfg), "--trace-every", "3", "--output-dir", str(tmp_path / "out"))
    assert tree_command.main_from_args(args) == 0
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


# ------------------------------------------------------------------------------------------ tabular policy
def _tabular(task, init_std=0.0, seed=0):
    from exploration_trl.experiments.research import tabular

    tok = tree.build_tree_tokenizer(task)
    return tabular.build_tabular_model(tok, tree.action_token_ids(tok, task), task.horizon, init_std=init_std,
                                       seed=seed), tok


def _table_distribution(model, task):
    """Sequence probabilities straight from the table: the product of softmax(action logits of each visited state)."""
    from exploration_trl.experiments.research.tabular import state_offsets

    probs = torch.softmax(model.action_table().double(), dim=-1)  # (states, actions)
    offsets = state_offsets(len(task.actions), task.horizon)
    out = []
    for seq in itertools.product(range(len(task.actions)), repeat=task.horizon):
        p, code = 1.0, 0
        for depth, a in enumerate(seq):
            p *= probs[offsets[depth] + code, a].item()
            code = code * len(task.actions) + a
        out.append(p)
    return out


def test_tabular_policy_exact_distribution_matches_sampling():
    """The exact distribution (teacher-forced through the model, as the tree reports it) is the table's product of
    per-state softmaxes, and 4,000 completions generated the way TRL generates them follow it.

    Bound: E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / n) (Jensen, per sequence), and TV moves by at most 1/n per sample,
    so by McDiarmid P(TV > E[TV] + t) <= exp(-2 n t^2); t = sqrt(ln(1000) / (2 n)) makes a false failure < 0.1%."""
    task = tree.TreeTask.from_flags("ABCD", 3, tree.DEFAULT_REWARDING)
    model, tok = _tabular(task, init_std=1.5, seed=7)
    exact = tree.sequence_log_probs(model, tok, task, 1.0).exp().tolist()
    assert exact == pytest.approx(_table_distribution(model, task), abs=1e-9)
    assert sum(exact) == pytest.approx(1.0, abs=1e-9) and max(exact) > 0.1  # far from uniform (1/64)

    n = 4000
    counts = _sample_counts(model, tok, task, n, tok.eos_token_id)
    empirical = [counts[s] / n for s in task.sequences()]
    tv = 0.5 * sum(abs(e - p) for e, p in zip(empirical, exact))
    bound = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in exact) + math.sqrt(math.log(1000) / (2 * n))
    assert tv < bound, (tv, bound)
    # The test can fail: the same samples against the distribution of another table are far off.
    other, _ = _tabular(task, init_std=1.5, seed=8)
    tv_other = 0.5 * sum(abs(e - p) for e, p in zip(empirical, _table_distribution(other, task)))
    assert tv_other > 2 * bound


def test_tabular_model_is_a_transformers_causal_lm(tmp_path):
    """States, the frozen non-action logits, unconstrained generation (H actions then EOS) and a save/load round trip."""
    from transformers import AutoModelForCausalLM

    task = tree.TreeTask.from_flags("ABC", 2, "AB,CA")
    model, tok = _tabular(task, init_std=1.0, seed=1)
    cfg = model.config
    assert cfg.num_states == 1 + 3 + 1 and model.lm_head.weight.shape == (len(tok), cfg.num_states)
    assert model.get_output_embeddings() is model.lm_head and model.base_model is model.model
    ids = torch.tensor([tok(tree.PROMPT + " C A B", add_special_tokens=False)["input_ids"]])
    states = model.model.states(ids)[0].tolist()
    p = len(tok(tree.PROMPT, add_special_tokens=False)["input_ids"])
    # prompt -> root 0; after C (action 2) -> node 1 + 2 = 3; after C A and any later action -> done (4)
    assert states[:p] == [0] * p and states[-1] == 4 and 3 in states
    hidden = model.model(input_ids=ids).last_hidden_state
    assert hidden.shape == (1, ids.size(1), cfg.num_states) and torch.equal(hidden.sum(-1), torch.ones(1, ids.size(1)))

    w = model.lm_head.weight
    (w * torch.randn_like(w)).sum().backward()
    actions = tree.action_token_ids(tok, task)
    others = [i for i in range(len(tok)) if i not in actions]
    assert w.grad[others].abs().sum() == 0 and w.grad[actions].abs().sum() > 0

    prompt = torch.tensor([tok(tree.PROMPT, add_special_tokens=False)["input_ids"]]).expand(8, -1)
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=6)
    new = out[:, prompt.size(1):]
    assert all(t in actions for t in new[:, :2].flatten().tolist()) and (new[:, 2] == tok.eos_token_id).all()

    model.save_pretrained(tmp_path / "tab")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "tab")
    assert type(loaded) is type(model) and torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    lw = loaded.lm_head.weight
    (lw * torch.randn_like(lw)).sum().backward()
    assert lw.grad[others].abs().sum() == 0  # the freeze survives loading


def test_tabular_policy_trains_through_the_trainers(tmp_path):
    """CaSP on the table: forking masks, top-N candidates and the exploration metrics all run, and learning happens."""
    task = tree.TreeTask.from_flags("ABCD", 3, tree.DEFAULT_REWARDING)
    settings = tree.TrainSettings(policy="tabular", steps=30)
    run = tree.train_one(task, "casp", 0, settings, tmp_path, {"casp_alpha": 0.3, "casp_entropy_quantile": 0.4})
    m = run["train_metrics"]
    assert run["invalid_completions"] == 0
    assert 0.0 < m["casp/forking_frac"]["mean"] <= 2 / 3 + 1e-6  # tau 0.4 with 3 tokens: at most 2 fork
    assert m["exploration/lambda_1"]["mean"] < 0 and m["exploration/branching_factor"]["mean"] >= 1
    assert run["init"]["accuracy"] == pytest.approx(6 / 64) and run["init"]["modes_covered"] == 6  # uniform start
    assert run["final"]["accuracy"] > 0.5


def test_grpo_collapses_on_the_tabular_tree(tmp_path):
    """GRPO (Adam 0.1, 200 steps, the tabular defaults) from the uniform policy (entropy ln 64 = 4.16 nats, 6/6 modes):
    on every seed the sequence entropy ends below 1 nat and two sequences hold >= 90% of the mass. Measured on seeds
    0-7: entropy 0.08-0.76 nats, top-2 mass 0.93-0.99, largest mode 0.51-0.99, accuracy >= 0.996."""
    task = tree.TreeTask.from_flags("ABCD", 3, tree.DEFAULT_REWARDING)
    settings = tree.TrainSettings(policy="tabular")
    for seed in (0, 1, 2):
        final = tree.train_one(task, "grpo", seed, settings, tmp_path)["final"]
        top2 = sum(sorted(final["mass"].values(), reverse=True)[:2])
        assert final["accuracy"] > 0.99, (seed, final["accuracy"])
        assert final["entropy"] < 1.0 and top2 >= 0.9, (seed, final["entropy"], top2)


def test_quick_sweep_writes_the_frontier(tmp_path, capsys):
    from exploration_trl.experiments.research import frontier, tree_sweep

    out = tmp_path / "sweep"
    assert tree_command.main_from_args(_parse("--policy", "tabular", "--sweep", "--quick", "--workers", "1",
                                      "--output", str(out))) == 0
    printed = capsys.readouterr().out
    assert "Best setting per method" in printed and "| casp" in printed

    data = json.loads((out / "frontier.json").read_text())
    assert set(data) == {"rows"}
    metric_keys = {"accuracy", "modes_covered", "entropy", "largest_mode"}
    for row in data["rows"]:
        assert set(row) == {"method", "setting", "seeds"} | metric_keys
        assert isinstance(row["setting"], dict) and row["seeds"] == [0]
        for key in metric_keys:
            assert set(row[key]) == {"mean", "std"} and math.isfinite(row[key]["mean"])
        assert 0 <= row["accuracy"]["mean"] <= 1 + 1e-9 and 0 <= row["modes_covered"]["mean"] <= 6
    methods = [r["method"] for r in data["rows"]]
    assert methods[0] == "initial_policy" and data["rows"][0]["accuracy"]["mean"] == pytest.approx(6 / 64)
    assert set(methods) == {"initial_policy", *(m for m, _ in tree_sweep.QUICK_GRID)}
    assert len(data["rows"]) == 1 + len(tree_sweep.QUICK_GRID)
    assert (out / "frontier.png").stat().st_size > 5000

    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["settings"]["policy"] == "tabular" and sweep["settings"]["optim"] == "adam"
    assert sweep["settings"]["steps"] == tree.QUICK_SWEEP_STEPS and len(sweep["runs"]) == len(tree_sweep.QUICK_GRID)
    assert all(r["invalid_completions"] == 0 for r in sweep["runs"])
    rule = sweep["findings"]["rule"]
    grpo = next(r for r in data["rows"] if r["method"] == "grpo")
    assert rule["floor"] == pytest.approx(grpo["accuracy"]["mean"] - tree_sweep.ACCURACY_TOLERANCE)
    for method, entry in sweep["findings"]["methods"].items():
        if entry["best"] is not None:
            assert entry["best"]["accuracy"]["mean"] >= rule["floor"]
    # best_settings.yaml is a valid --grid file
    points = frontier.load_grid(out / "best_settings.yaml", lambda m: m)
    assert ("grpo", {}) in points and sum(m == "grpo_entropy" for m, _ in points) == 2
    assert "published setting" in printed


def test_frontier_selection_rules():
    from exploration_trl.experiments.research import frontier

    def row(method, acc, modes, **setting):
        return {"method": method, "setting": setting, "seeds": [0],
                "accuracy": {"mean": acc, "std": 0.0}, "modes_covered": {"mean": modes, "std": 0.0},
                "entropy": {"mean": modes / 2, "std": 0.0}}

    rows = [row("grpo", 0.99, 2), row("grpo_entropy", 0.98, 3, c=0.1), row("grpo_entropy", 0.80, 6, c=1.0),
            row("a", 0.985, 5, x=1), row("a", 0.90, 6, x=2), row("b", 0.96, 6), row("c", 0.98, 3.2)]
    found = frontier.findings(rows, "accuracy", ("modes_covered", "entropy"), tolerance=0.02, margin=0.5)
    assert found["rule"]["floor"] == pytest.approx(0.97)
    assert found["methods"]["a"]["best"]["setting"] == {"x": 1}
    vs = found["methods"]["a"]["vs_entropy_bonus"]
    assert vs["beats"] is True and vs["against"] == {"method": "grpo", "setting": {}} and vs["difference"] == 3
    assert found["methods"]["b"]["best"] is None  # 0.96 < floor
    assert found["methods"]["c"]["vs_entropy_bonus"]["beats"] is False  # +0.2 modes over the entropy bonus 0.1
    assert [r["modes_covered"]["mean"] for r in frontier.pareto([r for r in rows if r["method"] == "a"],
                                                               "modes_covered", "accuracy")] == [5, 6]
    with pytest.raises(ValueError, match="--grid"):
        frontier.load_grid("/nonexistent.yaml", lambda m: m)


def test_sweep_flags_need_sweep(tmp_path):
    with pytest.raises(ValueError, match="--quick applies to a sweep"):
        tree_command.main_from_args(_parse("--quick", "--output", str(tmp_path)))
    with pytest.raises(ValueError, match="--policy: unknown policy"):
        tree.TrainSettings(policy="nope")


@pytest.mark.parametrize("module", ["tree_sweep", "countdown_sweep"])
def test_default_grids_hold_the_published_settings_and_span_100x(module):
    """Every method's grid contains its published setting, and its main strength spans at least 100x."""
    import importlib

    from exploration_trl.experiments.research import frontier

    mod = importlib.import_module(f"exploration_trl.experiments.research.{module}")
    points = mod.TREE_GRID if module == "tree_sweep" else mod.COUNTDOWN_GRID
    strength = {"grpo_entropy": "entropy_coef", "casp": "casp_alpha", "progrpo": "progrpo_alpha",
                "dsgrpo": "ds_gamma_p", "kl_cov": "kl_cov_ratio", "clip_cov": "clip_cov_ratio"}
    assert ("grpo", {}) in points and len(frontier.unique(points)) == len(points)
    for method, key in strength.items():
        assert (method, frontier.PUBLISHED[method]) in points, method
        values = [s[key] for m, s in points if m == method and s.get(key)]
        assert max(values) / min(values) >= 100, (method, values)
    casp = [s for m, s in points if m == "casp"]
    assert {s["casp_top1_penalty"] for s in casp} > {1.1} and {s["casp_top_n"] for s in casp} > {3}
    assert {s["ds_logp_granularity"] for m, s in points if m == "dsgrpo"} == {"token", "sequence_mean", "sequence_sum"}
    ds = [s for m, s in points if m == "dsgrpo"]
    assert any(s["ds_gamma_p"] == 0 for s in ds) and any(s["ds_gamma_n"] == 0 for s in ds)  # gamma_p, gamma_n apart
    if module == "tree_sweep":  # N up to all 4 actions, both forking regimes of a 3-token response
        assert max(s["casp_top_n"] for s in casp) == 4 and {s["casp_entropy_quantile"] for s in casp} == {0.4, 0.8}
