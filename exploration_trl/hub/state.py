"""What a card remembers: its inputs, kept in an HTML comment at its end, so a later call can update it.

`write_model_card(output_dir)` (as `exploration-trl push` does) re-renders a card from what the first call
recorded here, plus whatever is new (results). Text between `<!-- exploration-trl:keep -->` and
`<!-- /exploration-trl:keep -->` is the user's and is carried over as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CARD_FILE", "STATE_VERSION", "dump_state", "kept_notes", "load_card_state", "state_in", "state_result"]

CARD_FILE = "README.md"
STATE_TAG = "exploration-trl-card"
STATE_VERSION = 1
_STATE_RE = re.compile(r"<!-- " + STATE_TAG + r" (\{.*?\}) -->", re.DOTALL)
_KEEP_RE = re.compile(r"<!-- exploration-trl:keep -->.*?<!-- /exploration-trl:keep -->", re.DOTALL)


def state_in(card_text: str) -> dict | None:
    """The state recorded in a card's text, or None when it has none (or a broken one)."""
    m = _STATE_RE.search(card_text)
    if not m:
        return None
    try:
        state = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return state if isinstance(state, dict) else None


def load_card_state(path: str | Path) -> dict | None:
    """The inputs recorded in a card written by `write_model_card` (`README.md` path or its folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / CARD_FILE
    if not p.is_file():
        return None
    return state_in(p.read_text(encoding="utf-8"))


def dump_state(state: dict) -> str:
    """The state as the JSON that goes into the card's closing comment (strict: NaN/inf become null)."""
    # `<` and `>` only occur inside JSON strings, where \u003c/\u003e decode to the same text: no `-->` can appear.
    text = json.dumps(_json_safe(state), ensure_ascii=False, sort_keys=True, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def _json_safe(x):
    """NaN/inf -> None and keys -> str, recursively (so keys sort the way they read back)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def state_result(r: Mapping, output_dir: Path) -> dict:
    """A result as recorded in the card: no local paths (only a path inside the folder, relative to it)."""
    out = {k: v for k, v in r.items() if k not in ("plot", "display", "model", "path")}
    if r.get("path"):
        try:
            out["path"] = Path(r["path"]).resolve().relative_to(output_dir.resolve()).as_posix()
        except (ValueError, OSError):
            pass
    return out


def kept_notes(readme: Path) -> str | None:
    """The user's `<!-- exploration-trl:keep -->` block of an existing card, markers included."""
    keep = _KEEP_RE.search(readme.read_text(encoding="utf-8")) if readme.is_file() else None
    return keep.group(0) if keep else None
