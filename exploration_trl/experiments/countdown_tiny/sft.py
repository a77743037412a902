"""Countdown-tiny's warm start: a plain torch SFT loop on the training problems' solutions, cached by its settings."""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import _common
from .task import Settings, prompt_text

#: Bump when problem generation, solution rendering or the SFT loop changes, so old caches are not reused.
CACHE_VERSION = 1


def cache_key(settings: Settings) -> str:
    data = asdict(settings.data)
    if data.get("numbers_per_problem") == 3:  # the default: caches written before the key existed stay valid
        del data["numbers_per_problem"]
    payload = {"version": CACHE_VERSION, "seed": settings.seed, "data": data,
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

    from ...toy import build_toy, save_toy

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

    from ...toy import build_toy_tokenizer

    tok = build_toy_tokenizer("", level="char")
    saved = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    if saved != json.loads(tok.backend_tokenizer.to_str())["model"]["vocab"]:
        raise ValueError(f"{path} was not trained with the toy char tokenizer; delete it from --cache-dir")
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok
