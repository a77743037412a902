"""`exploration-trl countdown-tiny`: a small real reasoning task on a CPU.

1. **Problems.** Countdown with 3 numbers: reach `target` with `+ - * /` and parentheses, each number used once.
   Every multiset of 3 numbers in `1..max_num` is expanded into all its expressions (exact `Fraction`
   arithmetic, as the `countdown` reward evaluates them); every positive integer value up to `max_target` is a
   problem. A seeded shuffle splits the problems into a held-out test set and a training set with no
   `(numbers, target)` problem in common.
2. **Warm start (SFT).** The char-level toy Qwen2 is fine-tuned with a plain torch loop on correct solutions
   written in several orders and forms (`3*7+12`, `12+7*3`, `(7*3)+12`, ...), so each training problem has
   several distinct correct answers. The checkpoint is cached under `--cache-dir`, keyed by a hash of every
   setting that changes it, so reruns (and other methods) reuse it.
3. **RL.** Each method trains from that checkpoint with the same budget (`--rl-steps` optimizer steps, the same
   batch, group size, learning rate and seed) through its trainer class.
4. **Evaluation.** `exploration_trl.eval.run_eval` samples `--n-samples` completions per test problem from the
   SFT model and from every RL model, and reports pass@k for k = 1..n, token entropy and solution multiplicity
   (distinct correct equations per problem). The results are compared in one table and one overlaid pass@k plot.

Prompts are plain text (`"nums: 3 7 12\\ntarget: 33\\n"`); a completion is the bare equation followed by EOS, which
the `countdown` reward reads from the completion's last line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import shutil
from dataclasses import asdict, dataclass, field, make_dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from . import _common, frontier

DEFAULT_METHODS = "grpo,grpo_entropy,progrpo,dsgrpo,casp,kl_cov"
OPS = ("+", "-", "*", "/")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
#: Bump when problem generation, solution rendering or the SFT loop changes, so old caches are not reused.
CACHE_VERSION = 1


# ------------------------------------------------------------------------------------------ settings
#: Every setting, `section -> {name: (default, quick)}`: `Settings()` holds the defaults and `quick_settings()` the
#: quick values (a few-minute smoke run), side by side so the two presets are read and changed in one place.
#: `data`: the problems (numbers 1..max_num, targets 1..max_target) and their split; `model`: the char-level toy
#: Qwen2 (keywords of `toy.build_toy_model`); `sft`: the warm start (AdamW, linear warm-up, cosine decay to 5%,
#: gradient clipping at 1); `rl`: one RL run of `steps` optimizer steps x `prompts_per_step` prompts x
#: `num_generations` completions, whose `seed` (None: the experiment's seed) seeds the RL run and its evaluation but
#: not the split or the warm start; `eval`: `n_samples` completions for each of the first `num_problems` test problems.
SETTINGS_TABLE: dict[str, dict[str, tuple[Any, Any]]] = {
    "data": dict(max_num=(12, 6), max_target=(100, 30), num_train=(3000, 300), num_test=(200, 24),
                 solutions_per_problem=(4, 3)),
    "model": dict(hidden_size=(96, 64), num_hidden_layers=(3, 2), num_attention_heads=(4, 4), num_key_value_heads=(2, 2),
                  intermediate_size=(256, 128)),
    "sft": dict(steps=(3000, 300), batch_size=(64, 32), learning_rate=(2e-3, 3e-3), weight_decay=(0.01, 0.01),
                warmup_steps=(100, 20)),
    "rl": dict(steps=(200, 4), num_generations=(8, 4), prompts_per_step=(16, 2), learning_rate=(1e-4, 5e-4),
               max_completion_length=(20, 16), temperature=(1.0, 1.0), seed=(None, None)),
    "eval": dict(n_samples=(64, 8), num_problems=(200, 24), temperature=(1.0, 1.0), top_p=(1.0, 1.0),
                 batch_size=(512, 256)),
}


def _section(name: str, class_name: str) -> type:
    """The dataclass of one `SETTINGS_TABLE` section, with the defaults as field defaults."""
    fields = [(key, int | None if default is None else type(default), field(default=default))
              for key, (default, _) in SETTINGS_TABLE[name].items()]
    cls = make_dataclass(class_name, fields)
    cls.__module__ = __name__  # so spawned workers unpickle it
    return cls


DataSettings = _section("data", "DataSettings")
ModelSettings = _section("model", "ModelSettings")
SFTSettings = _section("sft", "SFTSettings")
RLSettings = _section("rl", "RLSettings")
EvalSettings = _section("eval", "EvalSettings")
SECTIONS = {"data": DataSettings, "model": ModelSettings, "sft": SFTSettings, "rl": RLSettings, "eval": EvalSettings}


@dataclass
class Settings:
    seed: int = 0
    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    rl: RLSettings = field(default_factory=RLSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)

    @property
    def rl_seed(self) -> int:
        return self.seed if self.rl.seed is None else self.rl.seed


def quick_settings(seed: int = 0) -> Settings:
    """The quick column of `SETTINGS_TABLE`: small data, a small model, a short SFT, a few RL steps, a small eval."""
    sections = {name: SECTIONS[name](**{k: quick for k, (_, quick) in table.items()})
                for name, table in SETTINGS_TABLE.items()}
    return Settings(seed=seed, **sections)


# ------------------------------------------------------------------------------------------ problems
def _value(expr) -> Fraction | None:
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a, b = _value(left), _value(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def render(expr, full_parens: bool = False) -> str:
    """Infix string: minimal parentheses, or (`full_parens`) every inner operation in parentheses."""
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr

    def child(e, is_right: bool) -> str:
        s = render(e, full_parens)
        if isinstance(e, int):
            return s
        if full_parens:
            return f"({s})"
        cp, pp = _PREC[e[0]], _PREC[op]
        if cp < pp or (is_right and cp == pp and op in "-/"):
            return f"({s})"
        return s

    return f"{child(left, False)}{op}{child(right, True)}"


def expressions(nums: tuple[int, ...]):
    """Every expression tree using each of the 3 numbers once: both bracketings, all orders and operators."""
    seen = set()
    for a, b, c in itertools.permutations(nums):
        for o1, o2 in itertools.product(OPS, repeat=2):
            for tree in ((o2, (o1, a, b), c), (o1, a, (o2, b, c))):
                key = render(tree, full_parens=True)
                if key not in seen:
                    seen.add(key)
                    yield tree


def _table(nums: tuple[int, ...]) -> list[tuple[Fraction, str, str]]:
    """`(value, minimal form, fully parenthesised form)` of every expression over `nums` (division by 0 skipped)."""
    out = []
    for t in expressions(nums):
        v = _value(t)
        if v is not None:
            out.append((v, render(t), render(t, full_parens=True)))
    return out


def solutions(nums: tuple[int, ...], target: int) -> list[str]:
    """Distinct minimal-parenthesis equations for a problem, sorted."""
    return sorted({m for v, m, _ in _table(tuple(nums)) if v == target})


def make_problems(data: DataSettings, seed: int) -> tuple[list[dict], list[dict]]:
    """`(train, test)` problem lists; every `(sorted numbers, target)` pair belongs to at most one split.

    Each problem: `nums` (list of 3 ints, shown in a seeded random order), `target`, `solutions` (all distinct
    minimal-parenthesis equations) and `sft_texts` (the `solutions_per_problem` solution strings the warm start
    trains on, in several orders and forms).
    """
    rng = random.Random(seed)
    tables: dict[tuple[int, ...], list] = {}
    keys = []
    for nums in itertools.combinations_with_replacement(range(1, data.max_num + 1), 3):
        tables[nums] = _table(nums)
        reachable = {int(v) for v, _, _ in tables[nums] if v.denominator == 1 and 1 <= v <= data.max_target}
        keys.extend((nums, t) for t in sorted(reachable))
    rng.shuffle(keys)
    need = data.num_train + data.num_test
    if len(keys) < need:
        raise ValueError(
            f"only {len(keys)} distinct problems with numbers 1..{data.max_num} and targets 1..{data.max_target}; "
            f"fewer than the {need} train + test problems asked for"
        )
    test_keys, train_keys = keys[: data.num_test], keys[data.num_test : need]
    assert not set(test_keys) & set(train_keys)

    def build(key, with_sft: bool) -> dict:
        nums, target = key
        shown = list(nums)
        rng.shuffle(shown)
        hits = [(m, f) for v, m, f in tables[nums] if v == target]
        rec = {"nums": shown, "target": target, "solutions": sorted({m for m, _ in hits})}
        if with_sft:
            forms = sorted({m for m, _ in hits} | {f for _, f in hits})
            rng.shuffle(forms)
            rec["sft_texts"] = forms[: data.solutions_per_problem]
        return rec

    return [build(k, True) for k in train_keys], [build(k, False) for k in test_keys]


def prompt_text(nums, target) -> str:
    return f"nums: {' '.join(str(n) for n in nums)}\ntarget: {target}\n"


# ------------------------------------------------------------------------------------------ SFT warm start
def cache_key(settings: Settings) -> str:
    payload = {"version": CACHE_VERSION, "seed": settings.seed, "data": asdict(settings.data),
               "model": asdict(settings.model), "sft": asdict(settings.sft)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "exploration_trl" / "countdown_tiny"


def _sft_batches(tokenizer, texts: list[tuple[str, str]], batch_size: int, steps: int, seed: int):
    import torch

    eos = tokenizer.eos_token_id
    encoded = []
    for prompt, completion in texts:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        encoded.append((p, c))
    g = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            perm = list(range(len(encoded)))
            g.shuffle(perm)
            order.extend(perm)
        idx, order = order[:batch_size], order[batch_size:]
        rows = [encoded[i] for i in idx]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (p, c) in enumerate(rows):
            seq = p + c
            ids[r, : len(seq)] = torch.tensor(seq)
            labels[r, len(p) : len(seq)] = torch.tensor(c)
            mask[r, : len(seq)] = 1
        yield ids, mask, labels


def train_sft(settings: Settings, train: list[dict], out_dir: Path, log=print) -> dict[str, Any]:
    """Warm-start the toy model on the training problems' solution texts; saves model + tokenizer to `out_dir`."""
    import torch

    from ..toy import build_toy, save_toy

    s = settings.sft
    model, tok = build_toy("", level="char", seed=settings.seed, max_position_embeddings=128,
                           **asdict(settings.model))
    texts = [(prompt_text(p["nums"], p["target"]), t) for p in train for t in p["sft_texts"]]
    opt = torch.optim.AdamW(model.parameters(), lr=s.learning_rate, weight_decay=s.weight_decay)

    def lr_at(step):
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        frac = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    torch.manual_seed(settings.seed)
    with _common.Timer() as t:
        for step, (ids, mask, labels) in enumerate(_sft_batches(tok, texts, s.batch_size, s.steps, settings.seed)):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if (step + 1) % max(1, s.steps // 10) == 0:
                recent = losses[-max(1, s.steps // 10):]
                log(f"[countdown-tiny] SFT step {step + 1}/{s.steps}: loss {sum(recent) / len(recent):.3f}")
    model.eval()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_toy(model, tok, tmp)
    info = {"settings": {"seed": settings.seed, "data": asdict(settings.data), "model": asdict(settings.model),
                         "sft": asdict(settings.sft)},
            "num_examples": len(texts), "final_loss": sum(losses[-50:]) / len(losses[-50:]), "seconds": t.seconds,
            "num_parameters": sum(p.numel() for p in model.parameters())}
    _common.write_json(tmp / "sft_info.json", info)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return info


def warm_start(settings: Settings, train: list[dict], cache_dir: Path, log=print) -> tuple[Path, dict, bool]:
    """`(checkpoint dir, sft info, reused)`: the cached checkpoint for these settings, trained if missing."""
    path = Path(cache_dir) / f"sft-{cache_key(settings)}"
    info_file = path / "sft_info.json"
    if info_file.is_file() and (path / "config.json").is_file():
        log(f"[countdown-tiny] reusing the cached SFT checkpoint {path}")
        return path, json.loads(info_file.read_text()), True
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"[countdown-tiny] SFT warm start -> {path}")
    return path, train_sft(settings, train, path, log), False


def load_checkpoint(path: Path):
    """`(model, tokenizer)` of a warm-start checkpoint.

    The tokenizer is rebuilt with `toy.build_toy_tokenizer` and checked against the saved vocabulary, so a cache
    written by an older toy tokenizer (before it became byte-level and `AutoTokenizer`-safe) is refused.
    """
    from transformers import AutoModelForCausalLM

    from ..toy import build_toy_tokenizer

    tok = build_toy_tokenizer("", level="char")
    saved = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    if saved != json.loads(tok.backend_tokenizer.to_str())["model"]["vocab"]:
        raise ValueError(f"{path} was not trained with the toy char tokenizer; delete it from --cache-dir")
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok


# ------------------------------------------------------------------------------------------ RL + eval
def _countdown_reward():
    from ..rewards.countdown import countdown

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


def heldout_benchmark(test: list[dict], num_problems: int):
    from ..eval.benchmarks import Benchmark

    records = [{"id": f"cd{i}", "prompt": prompt_text(p["nums"], p["target"]), "nums": list(p["nums"]),
                "target": int(p["target"])} for i, p in enumerate(test[:num_problems])]
    return Benchmark(
        name="countdown_tiny_test", reward="countdown", records=records, gold_columns=("nums", "target"),
        prompt_format="plain text 'nums: a b c\\ntarget: t\\n'; the completion is the bare equation (last line)",
        answer_type="countdown", source="exploration_trl.experiments.countdown_tiny",
    )


def evaluate(model, tok, bench, settings: Settings, out_dir: Path, seed: int | None = None) -> dict:
    """pass@k and solution multiplicity on `bench`; sampling is seeded by `seed` (default: the experiment's)."""
    from ..eval.harness import run_eval

    e = settings.eval
    return run_eval((model, tok), bench, n=e.n_samples, temperature=e.temperature, top_p=e.top_p,
                    max_tokens=settings.rl.max_completion_length, output_dir=out_dir, batch_size=e.batch_size,
                    seed=settings.seed if seed is None else seed, diversity=False, semantic=False, backend="transformers", progress=False,
                    overwrite=True, plot=False)


def _row(name: str, res: dict, ks: list[int], seconds: float | None) -> list[str]:
    s = res["summary"]
    pk = s["pass_at_k"]
    mult = s.get("solution_multiplicity") or {}
    cells = [name] + [f"{100 * pk[str(k)]:.1f}" if str(k) in pk else "-" for k in ks]
    ent = s.get("token_entropy")
    cells += [f"{ent:.3f}" if ent is not None else "-",
              f"{mult['mean']:.2f}" if mult.get("mean") is not None else "-",
              f"{mult['mean_solved']:.2f}" if mult.get("mean_solved") is not None else "-",
              f"{seconds:.0f}" if seconds is not None else "-"]
    return cells


def format_table(runs: dict[str, dict], n: int) -> str:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n] + ([n] if n not in (1, 2, 4, 8, 16, 32, 64) else [])
    header = ["model"] + [f"pass@{k} %" for k in ks] + ["entropy (nats/token)", "distinct correct / problem",
                                                        "distinct correct / solved problem", "RL seconds"]
    rows = [_row(name, r["eval"], ks, r.get("rl", {}).get("seconds")) for name, r in runs.items()]
    return _common.markdown_table(header, rows)


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


def _key(problem: dict) -> tuple:
    return tuple(sorted(problem["nums"])), int(problem["target"])


def _compact(run: dict) -> dict:
    s = run["eval"]["summary"]
    return {
        "pass_at_k": {k: v for k, v in s["pass_at_k"].items()},
        "token_entropy": s.get("token_entropy"),
        "token_entropy_correct": s.get("token_entropy_correct"),
        "token_entropy_wrong": s.get("token_entropy_wrong"),
        "solution_multiplicity": s.get("solution_multiplicity"),
        "mean_completion_tokens": s.get("mean_completion_tokens"),
        "truncated_fraction": s.get("truncated_fraction"),
        "num_problems": s.get("num_problems"),
        "n": s.get("n"),
        "rl": run.get("rl"),
        "eval_seconds": run.get("eval_seconds"),
        "cpu_seconds": run.get("cpu_seconds"),
        "results_file": run["eval"].get("path"),
    }


def log_eval(log, name, res, seconds=None, prefix="countdown-tiny"):
    """One progress line: a model's held-out pass@1 and pass@n (and its RL seconds)."""
    pk = res["summary"]["pass_at_k"]
    n = max(int(k) for k in pk)
    extra = f" (RL {seconds:.0f}s)" if seconds is not None else ""
    log(f"[{prefix}] {name:>14s}: pass@1 {100 * pk['1']:.1f}%, pass@{n} {100 * pk[str(n)]:.1f}%{extra}")


def _plot(runs: dict[str, dict], out_png: Path) -> Path | None:
    from ..eval.plots import plot_pass_at_k

    return plot_pass_at_k([r["eval"] for r in runs.values()], out_png, labels=list(runs),
                          title="countdown-tiny: pass@k on held-out problems")


# ------------------------------------------------------------------------------------------ SFT export
#: Written next to an exported checkpoint: how it was made and how it does on the held-out problems.
EXPORT_INFO = "countdown_tiny_sft.json"


def export_sft(settings: Settings, cache_dir: Path, export_dir: Path, output: Path, command: str,
               log=print) -> dict[str, Any]:
    """Train (or reuse) the warm start, copy it to `export_dir` as a self-contained checkpoint (model + tokenizer,
    `from_pretrained`-loadable offline) and write `EXPORT_INFO` there: the command, seeds, settings, size and the
    held-out pass@k, measured on the experiment's held-out problems (evaluation files go to `output`)."""
    export_dir = Path(export_dir)
    if export_dir.exists() and (not export_dir.is_dir() or any(export_dir.iterdir())):
        raise ValueError(f"--export: '{export_dir}' exists and is not an empty folder; choose a new folder")
    ws = prepare(settings, cache_dir, output, log=log)
    tmp = export_dir.with_name(export_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(ws.checkpoint, tmp, ignore=shutil.ignore_patterns("sft_info.json"))
    files = sorted(f.name for f in tmp.iterdir())
    size = sum(f.stat().st_size for f in tmp.iterdir())
    summary = ws.eval["summary"]
    info = {
        "command": command,
        "seed": settings.seed,
        "settings": {"data": asdict(settings.data), "model": asdict(settings.model), "sft": asdict(settings.sft),
                     "eval": asdict(settings.eval)},
        "heldout": {"num_problems": summary.get("num_problems"), "n_samples": summary.get("n"),
                    "temperature": settings.eval.temperature, "top_p": settings.eval.top_p,
                    "max_new_tokens": settings.rl.max_completion_length},
        "pass_at_1": summary["pass_at_k"]["1"],
        "pass_at_k": summary["pass_at_k"],
        "distinct_correct_per_problem": (summary.get("solution_multiplicity") or {}).get("mean"),
        "num_parameters": ws.info["num_parameters"],
        "size_bytes": size,
        "size_mb": size / 2**20,
        "files": files,
        "sft": {k: ws.info[k] for k in ("num_examples", "final_loss", "seconds") if k in ws.info},
        **{k: v for k, v in ws.describe().items() if k == "split"},
        "environment": _common.environment(),
    }
    _common.write_json(tmp / EXPORT_INFO, info)
    if export_dir.exists():
        export_dir.rmdir()
    tmp.rename(export_dir)
    return info


def export_command(args) -> str:
    """The command line that reproduces an export (the flags that change the checkpoint or its evaluation)."""
    parts = ["exploration-trl", "countdown-tiny", "--sft-only", "--export", str(args.export), "--seed", str(args.seed)]
    if args.quick:
        parts.append("--quick")
    for flag in ("sft_steps", "sft_hidden_size", "sft_layers", "n_samples", "num_test"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    import shlex

    return shlex.join(parts)


# ------------------------------------------------------------------------------------------ CLI
def _defaults(section: str, key: str) -> str:
    default, quick = SETTINGS_TABLE[section][key]
    return f"default {default:g}; quick {quick:g}"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "countdown-tiny", help="Countdown (3 numbers) on a CPU: SFT warm start, RL per method, pass@k comparison.",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--methods", default=None,
                   help="Comma-separated methods: grpo, grpo_entropy, progrpo, dsgrpo, casp, kl_cov, clip_cov, or "
                        f"compositions like progrpo+casp (default {DEFAULT_METHODS}; with --sweep every method of the "
                        "grid).")
    p.add_argument("--output", default=None,
                   help="Output folder (default runs/countdown_tiny; --sweep: runs/countdown_tiny_sweep; --sft-only: "
                        "runs/countdown_tiny_sft).")
    p.add_argument("--quick", action="store_true", help="A few-minute smoke run (small data, model, RL and eval).")
    p.add_argument("--seed", type=int, default=0,
                   help="Seed of the split, SFT, RL and sampling (default %(default)s).")
    p.add_argument("--rl-steps", type=int, default=None,
                   help=f"RL optimizer steps per method ({_defaults('rl', 'steps')}; --sweep: see --sweep).")
    p.add_argument("--n-samples", type=int, default=None,
                   help=f"Samples per test problem ({_defaults('eval', 'n_samples')}).")
    p.add_argument("--num-test", type=int, default=None,
                   help=f"Test problems evaluated ({_defaults('eval', 'num_problems')}).")
    p.add_argument("--rl-learning-rate", type=float, default=None,
                   help=f"RL step size (Adam; {_defaults('rl', 'learning_rate')}).")
    p.add_argument("--sft-steps", type=int, default=None, help=f"SFT optimizer steps ({_defaults('sft', 'steps')}).")
    p.add_argument("--sft-hidden-size", type=int, default=None,
                   help=f"Hidden size of the toy model ({_defaults('model', 'hidden_size')}; a multiple of 8); its MLP "
                        "width follows as 8/3 x hidden, rounded to a multiple of 16.")
    p.add_argument("--sft-layers", type=int, default=None,
                   help=f"Layers of the toy model ({_defaults('model', 'num_hidden_layers')}).")
    p.add_argument("--cache-dir", default=None,
                   help="Where SFT checkpoints are cached (default $XDG_CACHE_HOME/exploration_trl/countdown_tiny).")
    p.add_argument("--config", default=None,
                   help="YAML mapping method -> {config field: value} (and optional `all:`) overriding RL "
                        "hyperparameters (with --sweep: applied under each grid setting).")
    frontier.add_sweep_arguments(p, "pass@1 against pass@k, from the same warm start")
    p.add_argument("--rl-seeds", default=None,
                   help="With --sweep: comma-separated RL seeds per setting (default: --seed); the split and the warm "
                        "start keep --seed.")
    p.add_argument("--sft-only", action="store_true",
                   help="Train only the SFT warm start and export it with --export DIR (checkpoint + held-out pass@k).")
    p.add_argument("--export", default=None, help="With --sft-only: folder to write the checkpoint to (must not exist).")
    p.add_argument("--workers", type=int, default=2,
                   help="Methods trained in parallel processes (default %(default)s, one per core of a 2-core machine).")
    p.add_argument("--threads", type=int, default=1, help="Torch threads per process (default %(default)s).")
    p.set_defaults(func=main_from_args)


def settings_from_args(args) -> Settings:
    if args.seed is None or args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    s = quick_settings(args.seed) if args.quick else Settings(seed=args.seed)
    if args.rl_steps is not None:
        _common.check_positive(args.rl_steps, "--rl-steps")
        s.rl.steps = args.rl_steps
    if args.n_samples is not None:
        _common.check_positive(args.n_samples, "--n-samples")
        s.eval.n_samples = args.n_samples
    if args.num_test is not None:
        _common.check_positive(args.num_test, "--num-test")
        if args.num_test > s.data.num_test:
            raise ValueError(f"--num-test must be <= {s.data.num_test} (the size of the held-out split), got {args.num_test}")
        s.eval.num_problems = args.num_test
    if args.rl_learning_rate is not None:
        if not args.rl_learning_rate > 0:
            raise ValueError(f"--rl-learning-rate must be > 0, got {args.rl_learning_rate}")
        s.rl.learning_rate = args.rl_learning_rate
    if args.sft_steps is not None:
        _common.check_positive(args.sft_steps, "--sft-steps")
        s.sft.steps = args.sft_steps
    if args.sft_hidden_size is not None:
        if args.sft_hidden_size < 8 or args.sft_hidden_size % 8:
            raise ValueError(f"--sft-hidden-size must be a positive multiple of 8, got {args.sft_hidden_size}")
        s.model.hidden_size = args.sft_hidden_size
        s.model.intermediate_size = 16 * round(8 * args.sft_hidden_size / 3 / 16)
    if args.sft_layers is not None:
        _common.check_positive(args.sft_layers, "--sft-layers")
        s.model.num_hidden_layers = args.sft_layers
    return s


def main_from_args(args) -> int:
    settings = settings_from_args(args)
    _common.check_positive(args.workers, "--workers")
    _common.check_positive(args.threads, "--threads")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.export and not args.sft_only:
        raise ValueError("--export applies to --sft-only; add --sft-only")
    if args.sft_only:
        if not args.export:
            raise ValueError("--sft-only needs --export DIR, the folder to write the checkpoint to")
        if args.sweep or args.methods:
            raise ValueError("--sft-only trains no RL method; drop --sweep/--methods")
        info = export_sft(settings, cache, Path(args.export), Path(args.output or "runs/countdown_tiny_sft"),
                          export_command(args))
        print(f"\nwrote {args.export} ({info['size_mb']:.2f} MB, {info['num_parameters']:,} parameters): held-out "
              f"pass@1 {100 * info['pass_at_1']:.1f}% on {info['heldout']['num_problems']} problems x "
              f"{info['heldout']['n_samples']} samples")
        return 0
    if args.sweep:
        from .countdown_sweep import main_sweep

        return main_sweep(args, settings, cache)
    if args.grid or args.rl_seeds:
        raise ValueError(f"{'--grid' if args.grid else '--rl-seeds'} applies to a sweep; add --sweep")
    methods = [_common.validate_method(m) for m in _common.parse_list(args.methods or DEFAULT_METHODS, "--methods")]
    overrides = _common.load_overrides(args.config, methods)
    output = Path(args.output or "runs/countdown_tiny")
    result = run_countdown(methods, settings, output, cache, overrides, workers=args.workers, threads=args.threads)
    print()
    print(f"countdown-tiny: {result['split']['num_test_evaluated']} held-out problems x {settings.eval.n_samples} "
          f"samples (temperature {settings.eval.temperature}); {settings.rl.steps} RL steps per method")
    print(result["table"])
    print(f"\nwrote {output / 'countdown_tiny.json'} and {result['plot']} in {result['seconds']['total']:.0f}s")
    return 0
