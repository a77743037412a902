"""What `push` uploads in place of files that name a local path.

PEFT writes the base model's `name_or_path` into `adapter_config.json` (`base_model_name_or_path`): for a base
model loaded from a local folder that is its absolute path (home folder, user name). The uploaded copy names the
base model by its Hub id when the folder is an adapter of a Hub model, else by the folder's name; the local file is
left as it is (local loading still finds the base model), see `push.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .card_data import resolve_base_model

ADAPTER_CONFIG = "adapter_config.json"


def public_name(path: str) -> str:
    """The Hub id behind a local model folder when there is one, else the folder's name; a Hub id as it is."""
    if not os.path.isabs(os.path.expanduser(path)):
        return path
    hub, _ = resolve_base_model(path, Path(path))
    return hub or Path(path).name or path


def public_copies(output_dir: str | Path) -> dict[str, bytes]:
    """`{relative name: bytes to upload instead}` for every `adapter_config.json` in `output_dir` whose
    `base_model_name_or_path` is an absolute local path (checkpoints are not uploaded, so not looked at)."""
    output_dir = Path(output_dir)
    copies = {}
    for path in sorted(output_dir.rglob(ADAPTER_CONFIG)):
        name = path.relative_to(output_dir).as_posix()
        if name.startswith(("checkpoint-", ".")):
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        base = config.get("base_model_name_or_path")
        if isinstance(base, str) and os.path.isabs(os.path.expanduser(base)):
            config["base_model_name_or_path"] = public_name(base)
            copies[name] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
    return copies
