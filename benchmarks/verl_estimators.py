"""Time per batch of each `etrl_*` advantage estimator against verl's `grpo`, as verl's trainer calls them.

Run in the verl environment (scripts/install_verl_cpu.sh), from the repository root:

    .venv-verl/bin/python benchmarks/verl_estimators.py [--repeats 9] [--load-note "..."]

A batch of 512 prompts x 16 rows (verl's `rollout.n`), each row's outcome reward on its last response token
(binary, 40% correct), response masks of random length, rows shuffled as verl's batch balancing leaves them, is
handed to verl's own `compute_advantage` on a `DataProto`, with the algorithm config as the `algorithm` node of a
composed `ppo_trainer` config (as the trainer passes it, so the checks that read the whole config run too). The
estimators are timed in paired repeats: each repeat times every estimator once, in an order rotated from repeat to
repeat, so that whatever else the machine runs falls on all of them alike and the ratios to `grpo` stay fair on a
loaded machine. Reported per estimator: the min and the median wall-clock time over the repeats, each divided by
grpo's, and the median CPU time of the process (all its threads), which counts the work done whatever share of the
cores the process got, and its ratio to grpo's.

Writes benchmarks/verl_estimators.json (the machine's CPU model, core count, versions, load averages and the
`--load-note` beside the numbers), then docs/verl.md's table from it (`exploration_trl.integrations.verl_reference`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from datetime import date
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "verl_estimators.json"
#: (name, etrl options): verl's grpo first (the reference), then verl's vectorised grpo, then the package's.
RUNS = [
    ("grpo", {}),
    ("grpo_vectorized", {}),
    ("etrl_passk", {"passk_k": 4}),
    ("etrl_pkpo", {"pkpo_k": 4}),
    ("etrl_maxrl", {}),
    ("etrl_wreinforce", {}),
    ("etrl_qae", {}),
    ("etrl_position_bonus", {"position_bonus_gamma": 0.1, "position_bonus_base": "grpo"}),
    ("etrl_position_bonus", {"position_bonus_gamma": 0.1, "position_bonus_base": "etrl_maxrl"}),
]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_batch(prompts: int, n: int, length: int, seed: int = 0):
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    rows = prompts * n
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), lengths - 1] = (torch.rand(rows, generator=g) < 0.4).float()
    uids = np.array([f"prompt-{i}" for i in range(prompts) for _ in range(n)], dtype=object)
    perm = torch.randperm(rows, generator=g)
    return DataProto.from_dict(tensors={"token_level_rewards": rewards[perm], "response_mask": mask[perm]},
                               non_tensors={"uid": uids[perm.numpy()]})


def config_for(name: str, etrl: dict, n: int, prompts: int):
    from hydra import compose, initialize_config_module

    overrides = [f"algorithm.adv_estimator={name}", f"actor_rollout_ref.rollout.n={n}",
                 f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}"]
    overrides += [f"+algorithm.etrl.{k}={v}" for k, v in etrl.items()]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=16, help="rows per prompt (verl's rollout.n)")
    parser.add_argument("--length", type=int, default=1024, help="response tokens per row")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--load-note", default="", help="what else ran on the machine, said beside the numbers")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/verl.md's table")
    args = parser.parse_args(argv)

    import verl
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import exploration_trl.integrations.verl  # noqa: F401 - registers the etrl_* names (also done by import verl)

    warnings.simplefilter("ignore")
    data = make_batch(args.prompts, args.n, args.length)
    runs = [(name, etrl, config_for(name, etrl, args.n, args.prompts)) for name, etrl in RUNS]

    def call(name, cfg):
        compute_advantage(data, adv_estimator=name, norm_adv_by_std_in_grpo=True, config=cfg.algorithm)

    for _ in range(args.warmup):
        for name, _, cfg in runs:
            call(name, cfg)
    load_before = os.getloadavg()
    times: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    for r in range(args.repeats):
        for j in range(len(runs)):
            i = (j + r) % len(runs)  # rotate the order: no estimator always runs right after the same one
            name, _, cfg = runs[i]
            start, start_cpu = time.perf_counter(), time.process_time()
            call(name, cfg)
            times[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    load_after = os.getloadavg()

    base_min, base_median, base_cpu = min(times[0]), statistics.median(times[0]), statistics.median(cpu[0])
    results = []
    for (name, etrl, _), t, c in zip(runs, times, cpu):
        results.append({"name": name, "options": ", ".join(f"{k}={v}" for k, v in etrl.items()),
                        "min_s": min(t), "median_s": statistics.median(t), "all_s": t,
                        "median_ratio": statistics.median(t) / base_median, "min_ratio": min(t) / base_min,
                        "cpu_median_s": statistics.median(c), "cpu_all_s": c,
                        "cpu_median_ratio": statistics.median(c) / base_cpu})
    load = (f"Load averages (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in load_before)} before the timed repeats and "
            f"{', '.join(f'{x:.1f}' for x in load_after)} after.")
    if args.load_note:
        load = f"{args.load_note.strip()} {load}"
    out = {
        "date": date.today().isoformat(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "verl": verl.__version__, "python": platform.python_version()},
        "load": load,
        "batch": {"prompts": args.prompts, "rows_per_prompt": args.n, "response_length": args.length,
                  "rewards": "binary, 40% correct, on each row's last token; rows shuffled"},
        "repeats": args.repeats, "warmup": args.warmup,
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    for r in results:
        print(f"{r['name']:22s} {r['options']:55s} min {r['min_s'] * 1e3:8.1f} ms  median {r['median_s'] * 1e3:8.1f} ms"
              f"  x{r['median_ratio']:.2f} of grpo's median; CPU {r['cpu_median_s'] * 1e3:8.1f} ms "
              f"x{r['cpu_median_ratio']:.2f}")
    if not args.no_docs and args.out == OUT:
        from exploration_trl.integrations import verl_reference

        verl_reference.main(["--root", str(ROOT)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
