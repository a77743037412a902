"""Is a model name something `from_pretrained` can load? Checked before any model loads, with a one-line answer.

A name is a local folder (it exists, or it can only be a path: `./x`, `/x`, `~/x`, `a/b/c`, or `a/b` where `a` is a
local folder) or a Hub id (`name` or `owner/name`). A folder must hold a `config.json` (or an adapter's
`adapter_config.json`). A Hub id is looked up the way `from_pretrained` looks it up (its `config.json`, from the
local cache when offline), so an id that cannot be loaded says why: not found, gated, offline, no network.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["check_model_source", "looks_local"]

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?$")


def looks_local(name: str) -> bool:
    """True when `name` can only be meant as a local path."""
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or "\\" in name:
        return True
    parts = name.split("/")
    return len(parts) > 2 or not _HUB_ID_RE.match(name) or (len(parts) == 2 and Path(parts[0]).is_dir())


def _first_line(e: BaseException) -> str:
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
        raise ValueError(f"{key} '{name}' could not be fetched from the Hub: {_first_line(e)}") from None
