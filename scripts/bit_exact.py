"""Train every method 4 steps on the toy and save what came out, to compare two versions of the package bit for bit.

    # the code under test, then a reference version (e.g. `git archive 2ff4872 | tar -x -C /tmp/v070`):
    python scripts/bit_exact.py run out/new.pt
    PYTHONPATH=/tmp/v070 python scripts/bit_exact.py run out/old.pt
    python scripts/bit_exact.py compare out/old.pt out/new.pt

`run` trains each method (and two compositions) for 4 optimizer steps with a graded reward, the exploration metrics
on and 2 optimizer steps per rollout (so old log-probs, the rollout capture and the loss hooks all act), in one
process, and saves every trainable parameter and every logged value. `compare` says, per method, whether the
parameters and the logged values are identical (exact equality, NaN equal to NaN) and lists every difference; it exits
1 on any. Methods one version does not have are listed and skipped. Run both on the same machine: the CPU's kernels
decide the last bits (docs/demo.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

#: Trained besides every registered method (the registry of the version under test: a new method is run without an
#: edit here, and a method one version lacks is listed and skipped).
COMPOSITIONS = ("progrpo+casp", "maxrl+entropy_adv")
#: Settings that make each method act on the toy's graded reward within 4 steps.
SETTINGS = {
    "progrpo": {"correct_reward_threshold": 0.3}, "passk": {"correct_reward_threshold": 0.3, "passk_k": 2},
    "unlikely": {"correct_reward_threshold": 0.3}, "maxrl": {"correct_reward_threshold": 0.3},
    "wreinforce": {"correct_reward_threshold": 0.3}, "progrpo+casp": {"correct_reward_threshold": 0.3},
    "maxrl+entropy_adv": {"correct_reward_threshold": 0.3}, "casp": {"casp_entropy_quantile": 0.5},
    "clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": -1e9}, "kl_cov": {"kl_cov_ratio": 0.2},
}


def _reward(completions, **kwargs):
    """Distinct characters per completion (graded); its last character is the "final answer" (outcome_explore)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    try:
        from exploration_trl.rewards import record_outcomes
    except ImportError:  # a version without outcomes
        pass
    else:
        record_outcomes("reward", [t[-1:] or None for t in texts])
    return [len(set(t)) / 8 for t in texts]


def run(out: str) -> int:
    import torch
    from datasets import Dataset

    import exploration_trl as et
    import exploration_trl.trainers  # noqa: F401  (registers the methods)
    from exploration_trl.methods import METHODS as REGISTERED
    from exploration_trl.toy import build_toy, save_toy

    torch.set_num_threads(1)
    results = {"version": et.__version__, "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(save_toy(*build_toy("abc", seed=0), Path(tmp) / "ckpt"))
        for method in [*REGISTERED, *COMPOSITIONS]:
            if any(part not in REGISTERED for part in method.split("+")):
                results["methods"][method] = None
                continue
            cls = et.get_trainer_class(method)
            args = cls.config_class(
                output_dir=str(Path(tmp) / method.replace("+", "_")), per_device_train_batch_size=8,
                num_generations=4, max_completion_length=8, max_steps=4, learning_rate=5e-2, logging_steps=1,
                save_strategy="no", report_to=[], use_cpu=True, seed=42, bf16=False, disable_tqdm=True,
                steps_per_generation=2, **SETTINGS.get(method, {}),
            )
            prompts = ["ab", "ba", "abc", "cab", "bca", "acb", "cc", "aa"]
            trainer = cls(model=ckpt, reward_funcs=_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts * 4}))
            trainer.train()
            results["methods"][method] = {
                "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                "logs": [{k: v for k, v in e.items() if k not in ("train_runtime", "train_samples_per_second",
                                                                   "train_steps_per_second", "step_time")}
                         for e in trainer.state.log_history],
            }
            print(f"{method}: trained", flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(results, out)
    return 0


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(old_path: str, new_path: str) -> int:
    import torch

    old, new = torch.load(old_path, weights_only=False), torch.load(new_path, weights_only=False)
    bad = compared = 0
    for method in dict.fromkeys([*old["methods"], *new["methods"]]):
        a, b = old["methods"].get(method), new["methods"].get(method)
        if a is None or b is None:
            print(f"{method}: skipped (not in {'the reference' if a is None else 'the version under test'})")
            continue
        diffs = [f"param {n}: max |diff| {(a['params'][n] - b['params'][n]).abs().max().item():.3g}"
                 for n in a["params"] if not torch.equal(a["params"][n], b["params"][n])]
        if len(a["logs"]) != len(b["logs"]):
            diffs.append(f"{len(a['logs'])} log entries against {len(b['logs'])}")
        for i, (x, y) in enumerate(zip(a["logs"], b["logs"])):
            for key in sorted(set(x) | set(y)):
                if key not in x or key not in y or not _same(x[key], y[key]):
                    diffs.append(f"log {i} {key}: {x.get(key, '(absent)')} against {y.get(key, '(absent)')}")
        compared += 1
        print(f"{method}: " + ("identical (parameters and logged values)" if not diffs else
                               f"{len(diffs)} differences: " + "; ".join(diffs[:8])))
        bad += bool(diffs)
    verdict = f"{bad} of {compared} methods differ" if bad else f"bit for bit, {compared} methods"
    print(f"{old['version']} against {new['version']}: " + (verdict if compared else "nothing compared"))
    return 1 if bad or not compared else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    args = parser.parse_args(argv)
    return run(args.out) if args.command == "run" else compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
