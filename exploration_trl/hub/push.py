"""Upload a trained output folder, with its model card, to the Hugging Face Hub.

Order of operations (so that a failure never leaves a half-written folder behind):

1. a token is looked up (`token=` or `huggingface_hub.get_token()`: `HF_TOKEN` or `hf auth login`);
2. the card is rendered in memory (errors in its inputs surface before any network call);
3. `create_repo(repo_id, exist_ok=True)` - the first network call;
4. the card is written into the folder (atomically) and the folder is uploaded with `upload_folder`;
5. if the upload fails, the previous `README.md` / `training_curves.png` bytes are put back, so the folder is
   byte-for-byte what it was before the call.

Every failure is a :class:`HubError` (a `ValueError`) with a one-line message starting with
`cannot push to the Hub:`; the CLI prints it as `error: ...` and exits with status 2.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cards import CARD_FILE, render_model_card, restore_files
from ..eval.results import write_atomic
from .privacy import public_copies
from .state import state_in

__all__ = ["HubError", "push_output_dir", "DEFAULT_IGNORE_PATTERNS", "describe_hub_error", "check_push_ready",
           "plan_push", "PushPlan"]

logger = logging.getLogger(__name__)

#: Not uploaded: intermediate checkpoints, hidden files, temporary files, caches, and `training_args.bin` (a pickle
#: of the TrainingArguments: it holds the local output path, and a `hub_token` when one was set in the config).
DEFAULT_IGNORE_PATTERNS = (
    "training_args.bin",
    "**/training_args.bin",
    "checkpoint-*",
    "checkpoint-*/**",
    ".*",
    "**/.*",
    "*.tmp",
    "**/__pycache__/**",
)
_REPO_ID_RE = re.compile(r"^(?:[A-Za-z0-9][\w.\-]{0,95}/)?[A-Za-z0-9][\w.\-]{0,95}$")
_NO_TOKEN = "cannot push to the Hub: no token found (run `hf auth login`, or set HF_TOKEN)"


class HubError(ValueError):
    """A push that cannot go ahead or failed; the message is one line and says what to do."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def describe_hub_error(e: BaseException, repo_id: str) -> str:
    """One line for an exception raised by `huggingface_hub` (network, auth, permission, ...)."""
    try:
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    except ImportError:  # pragma: no cover - very old huggingface_hub
        HfHubHTTPError = OfflineModeIsEnabled = ()
    if OfflineModeIsEnabled and isinstance(e, OfflineModeIsEnabled):
        return "cannot push to the Hub: offline mode is on (HF_HUB_OFFLINE=1); unset it to push"
    if HfHubHTTPError and isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            return ("cannot push to the Hub: the token was rejected (401); run `hf auth login` again "
                    "or set a valid HF_TOKEN")
        if status == 403:
            return f"cannot push to the Hub: the token may not write to {repo_id} (403); use a token with write access"
        if status == 404:
            return f"cannot push to the Hub: {repo_id} not found (404); check the namespace in --repo-id"
        return f"cannot push to the Hub: {_first_line(e)}"
    if _is_network_error(e):
        return f"cannot push to the Hub: network unreachable ({_first_line(e)})"
    return f"cannot push to the Hub: {type(e).__name__}: {_first_line(e)}"


def _is_network_error(e: BaseException) -> bool:
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    for module, names in (("httpx", ("TransportError", "TimeoutException")),
                          ("httpx2", ("TransportError", "TimeoutException")),
                          ("requests.exceptions", ("ConnectionError", "Timeout"))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        if isinstance(e, tuple(getattr(mod, n) for n in names if hasattr(mod, n))):
            return True
    return False


def _check_folder(output_dir: Path) -> None:
    if not output_dir.is_dir():
        raise HubError(f"cannot push to the Hub: output dir '{output_dir}' not found")
    weights = [p for p in output_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf")]
    if not weights:
        raise HubError(
            f"cannot push to the Hub: '{output_dir}' holds no model or adapter weights (*.safetensors / *.bin); "
            "point --output-dir at the folder the trainer saved"
        )


def _check_repo_id(repo_id: str) -> None:
    if not _REPO_ID_RE.match(repo_id) or ".." in repo_id or "--" in repo_id:
        raise HubError(f"cannot push to the Hub: '{repo_id}' is not a valid repo id; use USER/NAME")


def check_push_ready(repo_id: str | None = None, token: str | None = None) -> str:
    """Check, before a long run, that a push at its end can work: a valid repo id, a token, and a Hub that answers
    and accepts the token (`whoami`). Returns the account name; raises :class:`HubError` (one line) otherwise."""
    import huggingface_hub as hf

    if repo_id is not None:
        _check_repo_id(repo_id)
    token = token or hf.get_token()
    if not token:
        raise HubError(_NO_TOKEN)
    try:
        who = hf.whoami(token=token)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line
        raise HubError(describe_hub_error(e, repo_id or "the Hub")) from None
    return str((who or {}).get("name") or "")


@dataclass
class PushPlan:
    """What a push would do, worked out without a network: the card it would write and the files it would upload."""

    repo_id: str
    card: Any  # RenderedCard, or None with write_card=False
    files: list[tuple[str, int]]  # (path relative to the folder, size in bytes), sorted
    public: dict = field(default_factory=dict)  # files uploaded with other bytes than on disk (`privacy.py`)

    def describe(self) -> str:
        total = sum(size for _, size in self.files)
        lines = [f"dry run: would upload {len(self.files)} files ({total / 1e6:.1f} MB) from "
                 f"{self.card.output_dir if self.card is not None else 'the folder'} to "
                 f"https://huggingface.co/{self.repo_id}:"]
        lines += [f"  {name}  ({size:,} bytes)" for name, size in self.files]
        if self.card is not None:
            lines += ["", f"{CARD_FILE} as it would be uploaded:", "", self.card.text.rstrip("\n")]
        return "\n".join(lines)


def plan_push(
    output_dir: str | Path,
    repo_id: str | None = None,
    results: Sequence[Any] | None = None,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    ignore_patterns: Sequence[str] | None = None,
    write_card: bool = True,
) -> PushPlan:
    """The card and the file list of a push (`exploration-trl push --dry-run`): no network, no token, and nothing
    written. Raises :class:`HubError` for the same bad input a push would reject."""
    from huggingface_hub.utils import filter_repo_objects

    output_dir = Path(output_dir)
    _check_folder(output_dir)
    repo_id = repo_id or output_dir.resolve().name
    _check_repo_id(repo_id)
    rendered = None
    if write_card:
        try:
            rendered = render_model_card(output_dir, method=method, base_model=base_model, dataset=dataset,
                                         results=results, repo_id=repo_id)
        except ValueError as e:
            raise HubError(f"cannot push to the Hub: {_first_line(e)}") from None
    sizes = {p.relative_to(output_dir).as_posix(): p.stat().st_size for p in output_dir.rglob("*") if p.is_file()}
    if rendered is not None:
        sizes.update({name: len(data) for name, data in rendered.files.items()})
    public = public_copies(output_dir)
    sizes.update({name: len(data) for name, data in public.items()})
    patterns = list(ignore_patterns if ignore_patterns is not None else DEFAULT_IGNORE_PATTERNS)
    kept = sorted(filter_repo_objects(sizes, ignore_patterns=patterns))
    return PushPlan(repo_id=repo_id, card=rendered, files=[(name, sizes[name]) for name in kept],
                    public={name: data for name, data in public.items() if name in kept})


def push_output_dir(
    output_dir: str | Path,
    repo_id: str | None = None,
    private: bool = False,
    results: Sequence[Any] | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    revision: str | None = None,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    ignore_patterns: Sequence[str] | None = None,
    write_card: bool = True,
) -> str:
    """Write or update the model card of `output_dir`, then upload the folder to `repo_id`; returns the commit URL.

    Args:
        output_dir: the folder the trainer saved (model or adapter weights, tokenizer, ...).
        repo_id: `USER/NAME` (or `NAME`, in the token's own namespace); default: the folder's name.
        private: create the repository private (an existing repository keeps its visibility).
        results: `results.json` files for the card (default: `output_dir/eval*/results.json` plus the ones
            recorded in the card already).
        commit_message: default `"Upload <method> model with exploration-trl"`.
        token: default `huggingface_hub.get_token()` (`HF_TOKEN` or the token saved by `hf auth login`).
        revision: branch to push to (default: the main branch).
        method / base_model / dataset: needed only when the folder has no card from `write_model_card` yet.
        ignore_patterns: files not uploaded (default :data:`DEFAULT_IGNORE_PATTERNS`).
        write_card: `False` uploads the folder as it is.

    Raises:
        HubError: one line; the folder is left byte-identical to what it was before the call.
    """
    output_dir = Path(output_dir)
    _check_folder(output_dir)
    repo_id = repo_id or output_dir.resolve().name
    _check_repo_id(repo_id)

    import huggingface_hub as hf

    token = token or hf.get_token()
    if not token:
        raise HubError(_NO_TOKEN)
    if write_card:  # the card is written into the folder before the upload
        from ..io_safety import check_output_dir

        try:
            check_output_dir(output_dir, key="--output-dir")
        except ValueError as e:
            raise HubError(f"cannot push to the Hub: {e}") from None

    rendered = None
    if write_card:  # rendered in memory only; written just before the upload
        try:
            rendered = render_model_card(output_dir, method=method, base_model=base_model, dataset=dataset,
                                         results=results, repo_id=repo_id)
        except ValueError as e:
            raise HubError(f"cannot push to the Hub: {_first_line(e)}") from None

    try:
        url = hf.create_repo(repo_id, token=token, private=bool(private), exist_ok=True, repo_type="model")
    except Exception as e:  # noqa: BLE001 - every failure becomes one line
        raise HubError(describe_hub_error(e, repo_id)) from None
    full_id = getattr(url, "repo_id", None)
    if full_id and full_id != repo_id:  # a bare NAME went to the token's namespace: name the card after it
        repo_id = full_id
        if rendered is not None:
            rendered = render_model_card(output_dir, method=method, base_model=base_model, dataset=dataset,
                                         results=results, repo_id=repo_id)

    snapshot = rendered.snapshot() if rendered is not None else {}
    # adapter_config.json naming a local base model by its absolute path is uploaded with its public name; the
    # local file is put back after the upload, whatever happens.
    public = public_copies(output_dir)
    originals = {name: (output_dir / name).read_bytes() for name in public}
    snapshot.update(originals)
    try:
        if rendered is not None:
            rendered.write()
        for name, data in public.items():
            write_atomic(output_dir / name, data)
        method_name = (rendered and _method_of(rendered.text)) or "GRPO"
        commit = hf.upload_folder(
            repo_id=repo_id,
            folder_path=str(output_dir),
            token=token,
            repo_type="model",
            revision=revision,
            commit_message=commit_message or f"Upload {method_name} model with exploration-trl",
            ignore_patterns=list(ignore_patterns if ignore_patterns is not None else DEFAULT_IGNORE_PATTERNS),
        )
    except BaseException as e:
        try:
            restore_files(output_dir, snapshot)
        except OSError as restore_error:  # pragma: no cover - disk trouble on top of a failed upload
            logger.error("could not restore %s: %s", output_dir / CARD_FILE, restore_error)
        if isinstance(e, Exception):
            raise HubError(describe_hub_error(e, repo_id)) from None
        raise
    restore_files(output_dir, originals)
    return str(getattr(commit, "commit_url", None) or commit)


def _method_of(card_text: str) -> str | None:
    return (state_in(card_text) or {}).get("method")
