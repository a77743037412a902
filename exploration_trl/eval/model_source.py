"""Where a model comes from: is a name something `from_pretrained` can load (checked before any model loads, with
a one-line answer), and loading it for the transformers backend (`load_model_and_tokenizer`).

A name is a local folder (it exists, or it can only be a path: `./x`, `/x`, `~/x`, `a/b/c`, or `a/b` where `a` is a
local folder) or a Hub id (`name` or `owner/name`). A folder must hold a `config.json` (or an adapter's
`adapter_config.json`). A Hub id is looked up the way `from_pretrained` looks it up (its `config.json`, from the
local cache when offline), so an id that cannot be loaded says why: not found, gated, offline, no network.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from exploration_trl.eval import EvalError

__all__ = ["adapter_dir", "check_model_source", "first_line", "load_model_and_tokenizer", "load_tokenizer", "looks_local"]

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?$")


def looks_local(name: str) -> bool:
    """True when `name` can only be meant as a local path."""
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or "\\" in name:
        return True
    parts = name.split("/")
    return len(parts) > 2 or not _HUB_ID_RE.match(name) or (len(parts) == 2 and Path(parts[0]).is_dir())


def first_line(e: BaseException) -> str:
    """An exception's first line, for one-line errors."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def check_model_source(name: str, key: str = "model_name_or_path", hub: bool = True) -> None:
    """Raise a one-line `ValueError` (naming `key`) when `name` is neither a loadable local folder nor a Hub id that
    can be fetched. Downloads nothing but the model's `config.json`, which `from_pretrained` fetches first anyway;
    `hub=False` checks local paths only (a Hub id is then left to the loader)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise ValueError(f"{key} '{name}' is a folder without config.json; point it at the folder a model was "
                             "saved to (with config.json and the weights)")
        return
    if path.exists():
        raise ValueError(f"{key} '{name}' is a file; point it at a model folder or a Hub id")
    if looks_local(name):
        raise ValueError(f"{key} '{name}': no such folder; point it at a saved model folder or a Hub id such as "
                         "Qwen/Qwen2.5-0.5B-Instruct")
    if not hub:
        return
    import huggingface_hub as hf
    from huggingface_hub import constants, errors

    try:
        hf.hf_hub_download(name, "config.json")
    except errors.GatedRepoError:
        raise ValueError(f"{key} '{name}' is a gated model; accept its terms on https://huggingface.co/{name} and log "
                         "in (`hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise ValueError(f"{key} '{name}' is neither a local folder nor a model on the Hub (if it is private, log in "
                         "with `hf auth login`); check the name") from None
    except (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            raise ValueError(f"{key} '{name}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                             f"download it once online (`hf download {name}`) or point {key} at a local folder") from None
        raise ValueError(f"{key} '{name}' is not a local folder, not in the local Hugging Face cache, and the Hub "
                         f"cannot be reached; connect to the network, or download it elsewhere (`hf download {name}`) "
                         f"and point {key} at the folder") from None
    except errors.EntryNotFoundError:
        return  # a repository without config.json (an adapter, a custom layout): from_pretrained decides
    except errors.HFValidationError:
        raise ValueError(f"{key} '{name}': no such folder, and not a valid Hub id; point it at a saved model folder "
                         "or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct") from None
    except errors.HfHubHTTPError as e:
        raise ValueError(f"{key} '{name}' could not be fetched from the Hub: {first_line(e)}") from None


# --------------------------------------------------------------------------------------------- loading
def adapter_dir(path: str) -> Path | None:
    """The folder of a LoRA adapter (it holds ``adapter_config.json``), else None."""
    p = Path(path).expanduser()
    return p if (p / "adapter_config.json").is_file() else None


def load_tokenizer(source: str, fallback: str | None = None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        if fallback is None:
            raise
        return AutoTokenizer.from_pretrained(fallback)


def load_model_and_tokenizer(model: Any, tokenizer: Any = None, dtype: Any = "auto", device: Any = None):
    """Load ``(model, tokenizer)`` for the transformers backend: a Hub id, a local checkpoint folder, a LoRA adapter
    folder (``adapter_config.json``: loaded with ``peft.AutoPeftModelForCausalLM`` and merged), an already-loaded
    model (its tokenizer from ``tokenizer`` or its ``name_or_path``) or a ``(model, tokenizer)`` pair."""
    import torch

    if isinstance(model, tuple) and len(model) == 2:
        model, tokenizer = model
    if not isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            name = getattr(model, "name_or_path", None)
            if not name:
                raise EvalError("pass the tokenizer with an in-memory model (tokenizer=... or a (model, tokenizer) pair)")
            tokenizer = load_tokenizer(name)
        return model, tokenizer

    path = str(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if looks_local(path) and not Path(path).expanduser().exists():
        raise EvalError(f"model directory not found: {path}")
    try:
        adapter = adapter_dir(path)
        if adapter is not None:
            from peft import AutoPeftModelForCausalLM

            base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
            peft_model = AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype=dtype, device_map=device)
            loaded = peft_model.merge_and_unload()
            if tokenizer is None:
                tokenizer = load_tokenizer(str(adapter), fallback=base)
        else:
            from transformers import AutoModelForCausalLM

            source = str(Path(path).expanduser()) if looks_local(path) else path
            loaded = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device)
            if tokenizer is None:
                tokenizer = load_tokenizer(source)
    except EvalError:
        raise
    except (OSError, ValueError) as e:
        raise EvalError(f"could not load model {path!r}: {first_line(e)}") from e
    loaded.to(device)
    loaded.eval()
    return loaded, tokenizer
