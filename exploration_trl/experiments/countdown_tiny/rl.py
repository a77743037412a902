"""Countdown-tiny's RL and evaluation: one method's RL run from the warm start, its held-out evaluation, and the
whole experiment (split, warm start, every method)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import _common
from .report import _compact, _plot, format_table, log_eval
from .sft import load_checkpoint, warm_start
from .task import Settings, _key, heldout_benchmark, make_problems, prompt_text


def _countdown_reward():
    from ...rewards.countdown import countdown

    return countdown


def build_rl_trainer(method: str, settings: Settings, checkpoint: Path, train: list[dict], out_dir: Path,
                     overrides: dict[str, Any] | None = None, callbacks: list | None = None) -> tuple[Any, dict]:
    """`(trainer, the method's overrides)`: `method`'s trainer class from `checkpoint` on the training problems,
    with the experiment's RL settings; nothing is trained yet."""
    from datasets import Dataset

    r = settings.rl
    model, tok = load_checkpoint(checkpoint)
    trainer_cls, cfg = _common.resolve_method(method, overrides)
    kwargs = _common.common_config_kwargs(
        out_dir, settings.rl_seed, r.steps,
        per_device_train_batch_size=r.num_generations * r.prompts_per_step,
        num_generations=r.num_generations,
        max_completion_length=r.max_completion_length,
        learning_rate=r.learning_rate,
        temperature=r.temperature,
    )
    kwargs.update(cfg)
    try:
        args = trainer_cls.config_class(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"method '{method}': {str(e).splitlines()[0]}") from None
    spg = args.steps_per_generation or 1
    rng = random.Random(settings.rl_seed)
    rows = [train[i % len(train)] for i in range(max(len(train), r.steps * r.prompts_per_step * spg + 8))]
    rng.shuffle(rows)
    dataset = Dataset.from_dict({
        "prompt": [prompt_text(p["nums"], p["target"]) for p in rows],
        "nums": [list(p["nums"]) for p in rows],
        "target": [int(p["target"]) for p in rows],
    })
    trainer = trainer_cls(model=model, processing_class=tok, reward_funcs=_countdown_reward(), args=args,
                          train_dataset=dataset, callbacks=callbacks)
    _common.drop_printer(trainer)
    return trainer, cfg


def reward_trend(trainer, window: int | None = None) -> dict[str, Any]:
    """Mean training reward over the first and the last `window` logged steps (default: a tenth of them, at least
    one): one step's reward is too noisy to say whether the reward rose."""
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    if not rewards:
        return {"reward_first": None, "reward_last": None, "reward_mean": None, "reward_window": 0}
    n = window or max(1, len(rewards) // 10)
    return {"reward_first": sum(rewards[:n]) / len(rewards[:n]), "reward_last": sum(rewards[-n:]) / len(rewards[-n:]),
            "reward_mean": sum(rewards) / len(rewards), "reward_window": n}


def eval_at_steps(steps):
    """A callback asking the trainer to evaluate at the given global steps (HF's `eval_steps` is a fixed period)."""
    from transformers import TrainerCallback

    wanted = {int(s) for s in steps if int(s) > 0}

    class EvalAtSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in wanted:
                control.should_evaluate = True
            return control

    return EvalAtSteps()


def attach_heldout_eval(trainer, bench, settings: Settings, steps, on_start: bool) -> None:
    """Make `trainer` sample the held-out benchmark at the global `steps` (and before the first step when `on_start`)
    with the experiment's evaluation settings (`trainers/components/heldout_eval.py`): pass@1 and pass@n, distinct
    correct answers and token entropy land in its log history (see `heldout_trajectory`)."""
    e, args = settings.eval, trainer.args
    trainer.heldout_benchmark = bench
    args.eval_n, args.eval_ks = e.n_samples, sorted({1, e.n_samples})
    args.eval_temperature, args.eval_top_p = e.temperature, e.top_p
    args.eval_generation_batch_size = e.batch_size
    args.eval_on_start = on_start  # `train()` starts a fresh log history: a step-0 evaluation must happen inside it
    trainer.add_callback(eval_at_steps(steps))


def heldout_trajectory(log_history: list[dict], n: int) -> list[dict[str, Any]]:
    """The held-out evaluations of a log history, one dict per evaluated step: `step`, `pass@1`, `pass@64` (pass@n,
    under the key the budget experiment uses), `distinct_correct`, `token_entropy` and `pass@64_ci`."""
    return [{"step": int(e["step"]), "pass@1": e["eval_pass@1"], "pass@64": e[f"eval_pass@{n}"],
             "distinct_correct": e.get("eval_distinct_correct"), "token_entropy": e.get("eval_token_entropy"),
             "pass@64_ci": [e[f"eval_pass@{n}_ci_low"], e[f"eval_pass@{n}_ci_high"]]}
            for e in log_history if "eval_pass@1" in e]


def train_rl(method: str, settings: Settings, checkpoint: Path, train: list[dict], out_dir: Path,
             overrides: dict[str, Any] | None = None) -> tuple[Any, Any, dict]:
    """Train `method` from `checkpoint`; returns `(model, tokenizer, info)`."""
    restore = _common.quiet_training_logs()
    try:
        with _common.Timer() as t:
            trainer, cfg = build_rl_trainer(method, settings, checkpoint, train, out_dir, overrides)
            trainer.train()
    finally:
        restore()
    trend = reward_trend(trainer, window=1)  # the first and the last logged step
    info = {"seconds": t.seconds, "config": dict(cfg),
            **{k: trend[k] for k in ("reward_first", "reward_last", "reward_mean")}}
    model, tok = trainer.model, trainer.processing_class
    model.eval()
    del trainer
    return model, tok, info


def evaluate(model, tok, bench, settings: Settings, out_dir: Path, seed: int | None = None) -> dict:
    """pass@k and solution multiplicity on `bench`; sampling is seeded by `seed` (default: the experiment's)."""
    from ...eval.harness import run_eval

    e = settings.eval
    return run_eval((model, tok), bench, n=e.n_samples, temperature=e.temperature, top_p=e.top_p,
                    max_tokens=settings.rl.max_completion_length, output_dir=out_dir, batch_size=e.batch_size,
                    seed=settings.seed if seed is None else seed, diversity=False, semantic=False, backend="transformers", progress=False,
                    overwrite=True, plot=False)


def rl_and_eval(method: str, settings: Settings, checkpoint: Path, train: list[dict], bench, output: Path,
                overrides: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
    """One method: RL from the checkpoint, then the held-out evaluation (a job for `_common.run_jobs`); `name`
    (default: the method) names its output folders."""
    import torch

    name = name or method
    torch.manual_seed(settings.rl_seed)
    restore = _common.quiet_training_logs()
    try:
        cpu0 = _common.cpu_seconds()
        model, tok, info = train_rl(method, settings, checkpoint, train, output / "rl" / name, overrides)
        with _common.Timer() as t_eval:
            res = evaluate(model, tok, bench, settings, output / "eval" / name, seed=settings.rl_seed)
        cpu = _common.cpu_seconds() - cpu0
    finally:
        restore()
    return {"method": method, "rl": info, "eval": res, "eval_seconds": t_eval.seconds, "cpu_seconds": cpu}


@dataclass
class WarmStart:
    """What every RL run of an experiment shares: the split, the (cached) SFT checkpoint and its evaluation."""

    train: list[dict]
    test: list[dict]
    checkpoint: Path
    info: dict[str, Any]
    reused: bool
    seconds: float
    bench: Any
    eval: dict[str, Any]
    eval_seconds: float

    def describe(self) -> dict[str, Any]:
        train, test = self.train, self.test
        return {
            "checkpoint": str(self.checkpoint),
            "sft": {**self.info, "reused_cache": self.reused, "seconds_this_run": self.seconds},
            "split": {"num_train": len(train), "num_test": len(test), "num_test_evaluated": len(self.bench.records),
                      "train_test_overlap": len({_key(p) for p in train} & {_key(p) for p in test}),
                      "mean_solutions_per_test_problem": sum(len(p["solutions"]) for p in test) / max(1, len(test))},
        }


def prepare(settings: Settings, cache_dir: Path, output: Path, threads: int | None = 1, log=print) -> WarmStart:
    """Split, warm start (cached) and evaluate the SFT model on the held-out problems (files under `output`)."""
    Path(output).mkdir(parents=True, exist_ok=True)
    _common.set_threads(threads)
    restore = _common.quiet_training_logs()
    try:
        train, test = make_problems(settings.data, settings.seed)
        log(f"[countdown-tiny] {len(train)} training and {len(test)} held-out test problems "
            f"(numbers 1..{settings.data.max_num}, targets 1..{settings.data.max_target})")
        with _common.Timer() as t_sft:
            ckpt, sft_info, reused = warm_start(settings, train, cache_dir, log)
        bench = heldout_benchmark(test, settings.eval.num_problems)
        with _common.Timer() as t_eval:
            base, base_tok = load_checkpoint(ckpt)
            res = evaluate(base.eval(), base_tok, bench, settings, Path(output) / "eval" / "sft")
    finally:
        restore()
    log_eval(log, "sft", res)
    return WarmStart(train, test, ckpt, sft_info, reused, t_sft.seconds, bench, res, t_eval.seconds)


def run_countdown(methods: list[str], settings: Settings, output: Path, cache_dir: Path,
                  overrides: dict[str, dict] | None = None, workers: int = 1, threads: int | None = 1,
                  log=print) -> dict[str, Any]:
    """Split, warm start (cached), evaluate the SFT model, then RL + evaluate every method; writes
    `output/countdown_tiny.json` and `output/pass_at_k.png` and returns the JSON content."""
    output = Path(output)
    with _common.Timer() as total:
        ws = prepare(settings, cache_dir, output, threads, log)
        runs: dict[str, dict] = {"sft": {"eval": ws.eval, "eval_seconds": ws.eval_seconds}}

        def report(r):
            log_eval(log, r["method"], r["eval"], r["rl"]["seconds"])

        jobs = [(m, settings, ws.checkpoint, ws.train, ws.bench, output, (overrides or {}).get(m)) for m in methods]
        with _common.Timer() as t_rl:
            for r in _common.run_jobs(rl_and_eval, jobs, workers=workers, threads=threads, on_result=report):
                runs[r["method"]] = r
    table = format_table(runs, settings.eval.n_samples)
    plot = _plot(runs, output / "pass_at_k.png")
    result = {
        "experiment": "countdown-tiny",
        "settings": asdict(settings),
        "methods": methods,
        "overrides": {m: (overrides or {}).get(m, {}) for m in methods},
        **ws.describe(),
        "results": {name: _compact(r) for name, r in runs.items()},
        "table": table,
        "plot": str(plot) if plot else None,
        "seconds": {"total": total.seconds, "sft_this_run": ws.seconds, "rl_and_eval": t_rl.seconds},
        "workers": workers,
        "threads_per_worker": threads,
        "environment": _common.environment(),
    }
    _common.write_json(output / "countdown_tiny.json", result)
    return result
