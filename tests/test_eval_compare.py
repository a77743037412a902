"""compare / plots / CLI wiring on hand-made results.json files (no model needed)."""

import argparse
import json
import math
from math import comb

import pytest

from exploration_trl.eval import EvalError
from exploration_trl.eval.command import parse_k_option, register
from exploration_trl.eval.compare import compare
from exploration_trl.eval.plots import curve_points, plot_pass_at_k

PNG = b"\x89PNG\r\n\x1a\n"


def _exact_pass_at_k(n, c, k):
    return 1 - comb(n - c, k) / comb(n, k)


def _results(problems, **summary):
    return {
        "schema": "exploration_trl.eval/results/v1",
        "model": "/models/m",
        "benchmark": {"name": "toy"},
        "summary": summary,
        "problems": [{"id": str(i), "n": n, "c": c} for i, (n, c) in enumerate(problems)],
    }


def _write(tmp_path, name, data):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(data))
    return d / "results.json"


def _row(table, metric):
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == metric:
            return cells[1:]
    raise AssertionError(f"no row {metric!r} in\n{table}")


def test_hand_made_counts_give_the_exact_pass_at_k(tmp_path):
    problems = [(8, 0), (8, 1), (8, 3), (8, 8)]
    path = _write(tmp_path, "hand", _results(problems, maj_at_n=0.5, token_entropy=0.25))
    table = compare([path], ks=[1, 2, 3, 8])
    for k in (1, 2, 3, 8):
        expected = sum(_exact_pass_at_k(n, c, k) for n, c in problems) / len(problems)
        assert _row(table, f"pass@{k} (%)") == [f"{100 * expected:.2f}"], k
    # pass@1 = (0 + 1/8 + 3/8 + 1) / 4 = 37.5 %, pass@8 = 3/4
    assert _row(table, "pass@1 (%)") == ["37.50"] and _row(table, "pass@8 (%)") == ["75.00"]
    assert _row(table, "avg@n (%)") == ["37.50"]
    assert _row(table, "maj@n (%)") == ["50.00"] and _row(table, "token entropy") == ["0.250"]
    assert _row(table, "semantic cos (correct)") == ["-"]
    assert _row(table, "problems") == ["4"] and _row(table, "n") == ["8"]
    # the header names the run by its folder
    assert table.splitlines()[0].split("|")[2].strip() == "hand"


def test_compare_two_runs_side_by_side_and_plot(tmp_path, capsys):
    a = _write(tmp_path, "base", _results([(4, 1), (4, 0), (4, 4)], token_entropy=0.5,
                                           diversity_correct={"distinct_1": 0.4, "distinct_2": 0.6, "self_bleu": 30.0}))
    b = _write(tmp_path, "rl", _results([(4, 2), (4, 2), (4, 4)], token_entropy=0.2))
    png = tmp_path / "plots" / "overlay.png"
    table = compare([a, b.parent], out_png=png)  # a folder works too
    assert [c.strip() for c in table.splitlines()[0].split("|")[2:4]] == ["base", "rl"]
    for k in (1, 2, 4):
        assert len(_row(table, f"pass@{k} (%)")) == 2
    assert _row(table, "pass@1 (%)") == ["41.67", "66.67"]
    assert _row(table, "pass@4 (%)") == ["66.67", "100.00"]
    assert _row(table, "token entropy") == ["0.500", "0.200"]
    assert _row(table, "distinct-1 (correct)") == ["0.400", "-"]
    assert png.read_bytes()[:8] == PNG

    parser = argparse.ArgumentParser(prog="exploration-trl")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", str(a), str(b), "--k", "1,2", "--plot", str(tmp_path / "cli.png")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "pass@2 (%)" in printed and "pass@4 (%)" not in printed and "base" in printed and "rl" in printed
    assert (tmp_path / "cli.png").read_bytes()[:8] == PNG


def test_compare_errors(tmp_path):
    with pytest.raises(EvalError, match="results file not found: .*nope.json"):
        compare([tmp_path / "nope.json"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(EvalError, match="is not a results.json"):
        compare([bad])
    bad.write_text("not json")
    with pytest.raises(EvalError, match="not a results.json"):
        compare([bad])
    bad.write_text(json.dumps({"problems": [{"n": 2, "c": 3}]}))
    with pytest.raises(EvalError, match="0 <= c <= n"):
        compare([bad])
    ok = _write(tmp_path, "ok", _results([(4, 1)]))
    with pytest.raises(EvalError, match="k=8 exceeds"):
        compare([ok], ks=[1, 8])
    # runs with different n: k beyond a run's n shows '-'
    big = _write(tmp_path, "big", _results([(8, 1)]))
    table = compare([ok, big], ks="1,8")
    assert _row(table, "pass@8 (%)") == ["-", "100.00"]


def test_plot_accepts_dicts_and_labels(tmp_path):
    r1 = _results([(16, 1), (16, 5)])
    xs, ys = curve_points(r1)
    assert xs == [1, 2, 4, 8, 16] and ys == sorted(ys)
    assert math.isclose(ys[0], (1 / 16 + 5 / 16) / 2)
    # summary table fallback when there are no per-problem counts
    assert curve_points({"summary": {"pass_at_k": {"1": 0.1, "4": 0.3}}}) == ([1, 4], [0.1, 0.3])
    out = plot_pass_at_k([r1, _results([(16, 9), (16, 0)])], tmp_path / "p.png", labels=["a", "b"])
    assert out.read_bytes()[:8] == PNG
    with pytest.raises(EvalError, match="labels"):
        plot_pass_at_k([r1], tmp_path / "q.png", labels=["a", "b"])


def test_eval_parser_defaults_and_flags():
    parser = argparse.ArgumentParser(prog="exploration-trl")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", "--model", "m", "--benchmark", "gsm8k"])
    assert (args.temperature, args.top_p, args.backend, args.n, args.seed) == (0.6, 0.95, "auto", 16, 0)
    assert args.k is None and args.limit is None and args.output_dir is None
    assert not args.no_semantic and not args.overwrite and callable(args.func)
    args = parser.parse_args([
        "eval", "--model", "m", "--benchmark", "f.jsonl", "--n", "8", "--temperature", "1.0", "--top-p", "1",
        "--max-tokens", "64", "--k", "1,2,8", "--limit", "5", "--batch-size", "4", "--seed", "3",
        "--output-dir", "o", "--backend", "transformers", "--reward", "countdown", "--question-column", "q",
        "--answer-column", "a", "--no-semantic", "--overwrite",
    ])
    assert (args.n, args.max_tokens, args.limit, args.batch_size, args.seed) == (8, 64, 5, 4, 3)
    assert (args.reward, args.question_column, args.answer_column, args.backend) == ("countdown", "q", "a", "transformers")
    assert args.no_semantic and args.overwrite and parse_k_option(args.k) == [1, 2, 8]
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--model", "m", "--benchmark", "b", "--backend", "tgi"])
    with pytest.raises(EvalError, match="comma-separated"):
        parse_k_option("1,two")
    with pytest.raises(EvalError, match="positive"):
        parse_k_option("0,1")


def test_eval_command_end_to_end(tmp_path, capsys, monkeypatch):
    """`eval` subcommand wiring: arguments reach run_eval and the summary is printed."""
    import exploration_trl.eval.harness as harness

    captured = {}

    def fake_run_eval(**kw):
        captured.update(kw)
        return {
            "model": kw["model"], "benchmark": {"name": "gsm8k"}, "path": str(tmp_path / "results.json"),
            "summary": {"num_problems": 2, "n": 4, "pass_at_k": {"1": 0.25, "4": 0.5}, "avg_at_n": 0.25,
                        "maj_at_n": 0.5, "token_entropy": 0.3, "mean_completion_tokens": 12.0,
                        "truncated_fraction": 0.0, "diversity_correct": {"num_problems": 0}},
        }

    monkeypatch.setattr(harness, "run_eval", fake_run_eval)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", "--model", "m", "--benchmark", "gsm8k", "--n", "4", "--k", "1,4",
                              "--no-semantic", "--quiet"])
    assert args.func(args) == 0
    assert captured["ks"] == [1, 4] and captured["semantic"] is False and captured["n"] == 4
    assert captured["progress"] is False and captured["temperature"] == 0.6
    out = capsys.readouterr().out
    assert "pass@1=25.00" in out and "pass@4=50.00" in out and "results.json" in out
