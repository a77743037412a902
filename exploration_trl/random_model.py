"""Random-weight models of named architectures, built offline from a shipped config (`data/model_configs/*.json`).

A GPU benchmark or smoke test measures the cost of an architecture (its layers, heads and vocabulary), not what
its weights know, so it needs neither the Hub nor a download: the model is initialised at random from the shipped
config and paired with a stand-in byte-level tokenizer of the same vocabulary size (`toy.build_toy_tokenizer`, padded
with unused tokens). `random:NAME` names one wherever a model path is expected (`scripts/gpu_smoke.sh`,
`benchmarks/overhead.py`); `save_random_checkpoint` writes a directory `from_pretrained` loads like any checkpoint.

    python -m exploration_trl.random_model qwen2.5-0.5b /tmp/qwen-random      # prints the directory
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "data" / "model_configs"
PREFIX = "random:"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def architectures() -> list[str]:
    """Names of the shipped configs (`random:NAME`)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_config(name: str):
    """The transformers config of architecture `name` (one of `architectures()`)."""
    from transformers import AutoConfig

    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no shipped model config '{name}'; choose one of: {', '.join(architectures())}")
    values = json.loads(path.read_text())
    return AutoConfig.for_model(values.pop("model_type"), **values)


def build_random_model(name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, device=None, tokenizer=None):
    """`(model, tokenizer)`: architecture `name` at random weights (deterministic for `seed`), stand-in tokenizer
    (`tokenizer`: one built before for the same architecture, reused; a 152k vocabulary takes seconds to build)."""
    from transformers import AutoModelForCausalLM

    from .toy import IM_END, build_toy_tokenizer

    config = load_config(name)
    tokenizer = tokenizer or build_toy_tokenizer(vocab_size=config.vocab_size)
    config.pad_token_id, config.bos_token_id = tokenizer.pad_token_id, tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]), torch.device(device or "cpu"):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    return model, tokenizer


def save_random_checkpoint(name: str, path: str | Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """Write architecture `name` at random weights and its stand-in tokenizer to `path` (kept if already there)."""
    path = Path(path)
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    model, tokenizer = build_random_model(name, dtype=dtype, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def resolve(model: str, workdir: str | Path, dtype: torch.dtype = torch.bfloat16) -> str:
    """`model` itself, or for `random:NAME` the directory of that random checkpoint, written under `workdir`."""
    if not model.startswith(PREFIX):
        return model
    name = model[len(PREFIX):]
    return str(save_random_checkpoint(name, Path(workdir) / f"random-{name}", dtype=dtype))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"architecture: {', '.join(architectures())}")
    parser.add_argument("output_dir")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        path = save_random_checkpoint(args.name, args.output_dir, dtype=DTYPES[args.dtype], seed=args.seed)
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
