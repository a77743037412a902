"""Step CPU time of KL-Cov / Clip-Cov with `cov_selection` local vs global (toy Qwen2, 32k vocab, 64 tokens, G=8).

    python benchmarks/cov_selection.py main ROUNDS      # writes benchmarks/cov_selection.json

Each trial runs in its own process; the CPU seconds of each optimizer step are timed (steps alternate between one
that generates and one that reuses the rollout); the summary keeps the fastest round of each.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).with_suffix(".json")

def trial(method, selection, ckpt, out):
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    import exploration_trl as et
    torch.set_num_threads(1)
    cls = et.get_trainer_class(method)
    extra = dict(kl_cov_ratio=0.002) if method == "kl_cov" else dict(clip_cov_ratio=2e-4)
    args = cls.config_class(output_dir=out, per_device_train_batch_size=8, num_generations=8, max_completion_length=64,
        max_steps=5, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
        seed=0, disable_tqdm=True, gradient_accumulation_steps=2, steps_per_generation=4,
        generation_kwargs={"min_new_tokens": 64}, cov_selection=selection, **extra)
    ds = Dataset.from_dict({"prompt": ["abc", "bca", "cab", "acb"] * 16})
    cpu = []
    class T(TrainerCallback):
        def on_step_begin(self, *a, **k): self.t = time.process_time()
        def on_step_end(self, *a, **k): cpu.append(time.process_time() - self.t)
    tr = cls(model=ckpt, reward_funcs=lambda completions, **k: [len(set(c)) / 32 for c in completions], args=args,
             train_dataset=ds, callbacks=[T()])
    tr.train()
    # steps alternate: a generating step and a reusing step (steps_per_generation = 2 x GA)
    return {"gen": statistics.mean(cpu[2::2]), "reuse": statistics.mean(cpu[1::2]), "all": statistics.mean(cpu[1:])}

if __name__ == "__main__":
    if sys.argv[1] == "trial":
        print("RESULT", json.dumps(trial(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])))
        sys.exit(0)
    from exploration_trl.toy import make_toy_checkpoint
    tmp = tempfile.mkdtemp()
    ckpt = str(make_toy_checkpoint(Path(tmp) / "ckpt", alphabet="abc", vocab_size=32768))
    res = {}
    for rnd in range(int(sys.argv[2])):
        for m in ["kl_cov", "clip_cov"]:
            for sel in ["local", "global"]:
                p = subprocess.run([sys.executable, __file__, "trial", m, sel, ckpt, f"{tmp}/{m}_{sel}"],
                                   capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
                if not line: print(p.stderr[-2000:]); sys.exit(1)
                res.setdefault(f"{m}/{sel}", []).append(json.loads(line[0][7:]))
                print(rnd, m, sel, res[f"{m}/{sel}"][-1], flush=True)
    summary = {}
    for m in ["kl_cov", "clip_cov"]:
        for key in ["all", "gen", "reuse"]:
            lo = min(r[key] for r in res[f"{m}/local"]); gl = min(r[key] for r in res[f"{m}/global"])
            summary[f"{m}/{key}"] = {"local_s": round(lo, 3), "global_s": round(gl, 3), "ratio": round(gl / lo, 3)}
    print(json.dumps(summary, indent=1))
    OUT.write_text(json.dumps({"rounds": res, "summary": summary}, indent=1))
