"""Model cards for trained output folders: `README.md` with Hub metadata, method, results, curves and citations.

`write_model_card(output_dir, method, base_model, ...)` renders the packaged template
`exploration_trl/hub/templates/model_card.md.j2` with `huggingface_hub.ModelCard.from_template`, so the YAML header
is exactly what `ModelCard.load` reads back. The parts of a card come from:

* :mod:`~exploration_trl.hub.card_data` - the YAML header: metadata and the `model-index`;
* :mod:`~exploration_trl.hub.eval_results` - pass@k results, from `exploration-trl eval`'s `results.json` files;
* :mod:`~exploration_trl.hub.tables` - the pass@k and hyperparameter tables (the versions: `eval.results`);
* :mod:`~exploration_trl.hub.curves` - `training_curves.png` and the one-line training summary;
* :mod:`~exploration_trl.hub.protocol_verdict` - "Does it beat GRPO?": the pre-registered verdict of the method;
* :mod:`~exploration_trl.hub.usage` - "How to use": loading, sampling and evaluating the model;
* :mod:`~exploration_trl.hub.state` - the inputs kept in the card, so that a second call updates it in place.

The card is *updated* in place on a second call: `write_model_card(output_dir)` (as `exploration-trl push` does)
re-renders it with new results while keeping the method, hyperparameters, curves and framework versions recorded
at training time. Metadata keys the card does not manage (`license`, `language`, ...) and text between
`<!-- exploration-trl:keep -->` and `<!-- /exploration-trl:keep -->` survive updates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from exploration_trl.eval.model_source import looks_local
from exploration_trl.eval.results import package_versions, write_atomic

from .. import PROJECT_URL
from ..methods import METHODS, method_infos, shapings, trainer_name
from .card_data import (
    adapter_settings,
    adapter_type,
    build_card_data,
    detect_adapter,
    eval_results_from,
    existing_metadata,
    resolve_base_model,
    resolve_dataset,
)
from .citations import bibtex_for
from .curves import CURVES_FILE, card_curves, plot_training_curves
from .eval_results import card_results, collect_results, normalize_results
from .outcome import outcome_notes
from .protocol_verdict import verdict_section
from .state import CARD_FILE, STATE_VERSION, dump_state, kept_notes, load_card_state, state_result
from .tables import extract_hyperparameters, result_table, still_on
from .usage import usage_section

__all__ = [
    "CARD_FILE",
    "CURVES_FILE",
    "RenderedCard",
    "write_model_card",
    "render_model_card",
    "load_card_state",
    "normalize_results",
    "collect_results",
    "eval_results_from",
    "extract_hyperparameters",
    "plot_training_curves",
    "detect_adapter",
    "TEMPLATE_NAME",
]

TEMPLATE_NAME = "model_card.md.j2"


@dataclass
class RenderedCard:
    """A rendered card and the files it refers to, not yet written. `files` maps names relative to
    `output_dir` to bytes (`README.md` and, when curves were drawn, `training_curves.png`)."""

    output_dir: Path
    text: str
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.output_dir / CARD_FILE

    def snapshot(self) -> dict[str, bytes | None]:
        """Current bytes of every file :meth:`write` would replace (`None`: absent), for :func:`restore_files`."""
        return {name: ((self.output_dir / name).read_bytes() if (self.output_dir / name).is_file() else None)
                for name in self.files}

    def write(self) -> Path:
        """Write each file atomically (temporary file in the folder + `os.replace`), the card last."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name in sorted(self.files, key=lambda n: n == CARD_FILE):
            write_atomic(self.output_dir / name, self.files[name])
        return self.path


def restore_files(output_dir: str | Path, snapshot: Mapping[str, bytes | None]) -> None:
    """Put back the bytes recorded by :meth:`RenderedCard.snapshot` (deleting files that did not exist)."""
    for name, data in snapshot.items():
        p = Path(output_dir) / name
        if data is None:
            if p.exists():
                p.unlink()
        else:
            write_atomic(p, data)


def _template_text(template: str | Path | None) -> str:
    if template is not None:
        return Path(template).read_text(encoding="utf-8")
    packaged = resources.files("exploration_trl.hub").joinpath("templates").joinpath(TEMPLATE_NAME)
    return packaged.read_text(encoding="utf-8")


def _mentions(dataset: Any, word: str) -> bool:
    """Does the dataset name (or any of a list of names) contain `word`?"""
    names = [dataset] if isinstance(dataset, str) else list(dataset or [])
    return any(word in str(n).lower() for n in names)


class _Training(NamedTuple):
    """What the card says about the training run: the settings, whether STILL shaping was on, the framework versions
    and the trainer class."""

    hyperparameters: dict
    still: bool
    versions: list
    trainer: str


def _training_record(infos: list | None, training_args: Any, state: Mapping) -> _Training:
    """From this call's config, else as recorded when the card was first written. `infos`: the method's records
    (None: not registered in this process)."""
    if training_args is not None:
        hp = extract_hyperparameters(_need(infos), training_args)
        return _Training(hp, still_on(training_args), list(package_versions().items()), trainer_name(_need(infos)))
    hp = {k: [tuple(x) for x in v] for k, v in (state.get("hyperparameters") or {"method": [], "grpo": []}).items()}
    versions = [tuple(x) for x in state.get("versions") or package_versions().items()]
    return _Training(hp, bool(state.get("still")), versions, state.get("trainer") or trainer_name(_need(infos)))


def _recorded(method: str, state: Mapping) -> dict | None:
    """The method section a card recorded for `method` (None: it recorded none, or for another method)."""
    return state.get("method_section") if state.get("method") == method else None


def _parsed_method(method: str, state: Mapping) -> tuple[str, list | None]:
    """`(method in canonical order, its records)`, the one parse of the method string a card makes (`casp+progrpo`
    -> `progrpo+casp`); a card's own method as it recorded it, and no records, when this process has not registered
    that method (see `_method_section`)."""
    try:
        infos = method_infos(method)
    except ValueError:
        if _recorded(method, state):
            return method, None
        raise
    return "+".join(info.name for info in infos), infos


def _need(infos: list | None) -> list:
    if infos is None:  # only a card that recorded its method section gets here without records
        raise ValueError("the card's method is not registered in this process; import the module that defines it")
    return infos


def _public_name(path: str) -> str:
    """A path as a pushed card may show it: a relative path as given, an absolute one by its folder name only."""
    return Path(path).name or path if os.path.isabs(os.path.expanduser(path)) else path


def render_model_card(
    output_dir: str | Path,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    training_args: Any = None,
    log_history: Sequence[Mapping] | None = None,
    is_adapter: bool | None = None,
    results: Any = None,
    repo_id: str | None = None,
    reward_funcs: Sequence[str] | None = None,
    template: str | Path | None = None,
    outcome: Mapping | None = None,
    adapter_config: Mapping | None = None,
    heldout_benchmark: str | None = None,
) -> RenderedCard:
    """Render the card for `output_dir` without writing anything (see :func:`write_model_card`).

    The inputs are gathered first (`_card_inputs`, `_training_record`, the results and curves, `_card_names`); then
    each section of the template gets its values from one function, in the card's order: `_card_header`, `_intro`,
    `_method_part`, `_evaluation_part`, `_training_part`, `usage.usage_section`, `_card_state`."""
    from huggingface_hub import ModelCard

    card = _card_inputs(output_dir, method, base_model, dataset, is_adapter, repo_id, reward_funcs, outcome,
                        adapter_config, heldout_benchmark)
    training = _training_record(card.infos, training_args, card.state)
    found = card_results(card.output_dir, results, card.base_model, card.state.get("results") or [])
    png, curves, summary = card_curves(card.output_dir, log_history, card.state.get("training_summary"),
                                       _final_heldout_pass_at_k(found, card.heldout_benchmark))
    names = _card_names(card)
    section = _method_section(card.method, card.infos, training.still, card.state)
    countdown = _mentions(card.dataset, "countdown")
    rendered = ModelCard.from_template(
        _card_header(card, names, section, found),
        template_str=_template_text(template),
        model_name=names.model,
        intro=_intro(card, names, section["display"]),
        **_method_part(section, training.trainer),
        protocol_verdict=verdict_section(card.method, training.still),  # "Does it beat GRPO?"
        **_evaluation_part(found, names, countdown, card.repo_id),
        **_training_part(card, names, training, summary, curves),
        usage=usage_section(names.load_id, card.adapter, countdown=countdown,
                     countdown_tiny=_mentions(card.dataset, "countdown-tiny")),
        versions=training.versions,
        bibtex=section["bibtex"],
        user_notes=kept_notes(card.readme),
        state=dump_state(_card_state(card, names, training, section, summary, found)),
    )
    text = re.sub(r"\n{3,}", "\n\n", str(rendered)).rstrip("\n") + "\n"
    files = {CURVES_FILE: png} if png is not None else {}
    files[CARD_FILE] = text.encode("utf-8")
    return RenderedCard(output_dir=card.output_dir, text=text, files=files)


# ---- the inputs: this call's arguments, else what the card recorded
@dataclass
class _CardInputs:
    """What a card is made from: each argument of this call, else what the card recorded when it was last written
    (its state), so that `write_model_card(output_dir)` alone re-renders a card with nothing lost."""

    output_dir: Path
    readme: Path
    state: Mapping
    method: str
    infos: list | None
    base_model: str | None
    base_model_from_state: bool
    dataset: Any
    repo_id: str | None
    reward_funcs: list | None
    is_adapter: bool
    adapter: str | None
    lora: list
    outcome: dict
    heldout_benchmark: str | None


def _card_inputs(output_dir, method, base_model, dataset, is_adapter, repo_id, reward_funcs, outcome, adapter_config,
                 heldout_benchmark) -> _CardInputs:
    """The card's inputs (see `_CardInputs`); refuses a folder that does not exist, and a first card without a
    method (nothing recorded says which)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise ValueError(f"output dir '{output_dir}' not found")
    readme = output_dir / CARD_FILE
    state = load_card_state(readme) or {}
    method = method or state.get("method")
    if method is None:
        raise ValueError(
            f"{readme} is not an exploration-trl model card yet, so the method is unknown; pass method= "
            "(or --method) and base_model= (or --base-model)"
        )
    method, infos = _parsed_method(method, state)
    # The state names a local base model by its folder name only (`base_model_local`), never by its path.
    from_state = base_model is None and state.get("base_model") is not None
    base_model = base_model if base_model is not None else state.get("base_model")
    dataset = dataset if dataset is not None else state.get("dataset")
    repo_id = repo_id or state.get("repo_id")
    reward_funcs = list(reward_funcs) if reward_funcs is not None else state.get("reward_funcs")
    is_adapter, adapter, lora = _adapter_facts(output_dir, is_adapter, adapter_config, state)
    outcome = dict(outcome) if outcome is not None else dict(state.get("outcome") or {})
    return _CardInputs(
        output_dir=output_dir, readme=readme, state=state, method=method, infos=infos, base_model=base_model,
        base_model_from_state=from_state, dataset=dataset, repo_id=repo_id, reward_funcs=reward_funcs,
        is_adapter=is_adapter, adapter=adapter, lora=lora, outcome=outcome,
        heldout_benchmark=heldout_benchmark if heldout_benchmark is not None else state.get("heldout_benchmark"),
    )


def _adapter_facts(output_dir: Path, is_adapter: bool | None, adapter_config: Mapping | None,
                   state: Mapping) -> tuple[bool, str | None, list]:
    """`(is it an adapter, its type (e.g. LoRA), its settings)`: from the folder's `adapter_config.json` unless the
    caller passed the PEFT config; the settings a card recorded when the folder no longer says."""
    is_adapter = bool(detect_adapter(output_dir) if is_adapter is None else is_adapter)
    adapter = adapter_type(output_dir) if is_adapter else None
    if adapter is not None and adapter_config is not None and adapter_config.get("peft_type"):
        adapter = adapter_type(output_dir, adapter_config)
    lora = (adapter_settings(output_dir, adapter_config) or [tuple(x) for x in state.get("adapter_settings") or []]
            if is_adapter else [])
    return is_adapter, adapter, lora


def _final_heldout_pass_at_k(found: list[dict], heldout_benchmark: str | None) -> dict | None:
    """The held-out benchmark evaluated during training: its row of the table (the final evaluation) ends the
    training sentence's held-out pass@k."""
    return next((r["pass_at_k"] for r in found if heldout_benchmark and r["benchmark"] == heldout_benchmark), None)


@dataclass
class _CardNames:
    """How the card names the model, its base, its data and its folder: as the Hub may show them (no absolute local
    path, which `push` would publish)."""

    model: str
    hub_base: str | None
    base_display: str
    base_public: str | None
    dataset_ids: Any
    dataset_display: str | None
    shown_dir: str
    load_id: str


def _card_names(card: _CardInputs) -> _CardNames:
    """The names of `_CardNames`; a local base model the card recorded stays "a local checkpoint", by its name."""
    model_name = (card.repo_id.split("/")[-1] if card.repo_id else None) or card.output_dir.resolve().name
    if card.base_model_from_state and card.state.get("base_model_local"):
        hub_base, base_display = None, f"`{card.base_model}` (a local checkpoint, not on the Hub)"
    else:
        hub_base, base_display = resolve_base_model(card.base_model, card.output_dir)
    base_public = hub_base or (None if card.base_model is None else _public_name(str(card.base_model)))
    dataset_ids, dataset_display = resolve_dataset(card.dataset)
    shown_dir = _public_name(str(card.output_dir))  # commands in the card: no absolute local path
    return _CardNames(model=model_name, hub_base=hub_base, base_display=base_display, base_public=base_public,
                      dataset_ids=dataset_ids, dataset_display=dataset_display, shown_dir=shown_dir,
                      load_id=card.repo_id or shown_dir)


# ---- the card's sections, top to bottom
def _card_header(card: _CardInputs, names: _CardNames, section: dict, found: list[dict]):
    """The YAML header (Hub metadata and the `model-index`). The method tags this card wrote before are replaced, so
    that a card re-rendered for another method does not keep the old ones; metadata it does not manage is kept."""
    previous = card.state.get("method_section") or {}
    replaced = {*METHODS, *(s.name for s in shapings()), *previous.get("tags", []), *previous.get("shaping_tags", [])}
    return build_card_data(existing_metadata(card.readme), section["tags"], section["shaping_tags"], replaced,
                           names.hub_base, card.adapter, names.dataset_ids, names.model, found)


def _intro(card: _CardInputs, names: _CardNames, method_display: str) -> str:
    """The sentence under the title: what the model is and how it was trained. A run that changed no weight says so
    first: the card must not present the base model as a trained one."""
    base_display, adapter = names.base_display, card.adapter
    what = f"a fine-tuned version of {base_display}" if adapter is None else f"a {adapter} adapter for {base_display}"
    how = (f"**{method_display}** in [exploration-trl]({PROJECT_URL}) "
           "(exploration-preserving RLVR methods for [TRL](https://github.com/huggingface/trl))"
           + (f" on {names.dataset_display}" if names.dataset_display else ""))
    if card.outcome.get("weights_changed") is False:
        return (f"This model is {base_display} **unchanged**: a reinforcement-learning run with {how} changed no "
                "weight (see [Training](#training)).")
    return f"This model is {what}, trained with reinforcement learning from verifiable rewards using {how}."


def _method_section(method: str, infos: list | None, still: bool, state: Mapping) -> dict:
    """What the card says about its method: the display name, the section's entries (name, description, paper),
    its tags and BibTeX, all from the method records (`exploration_trl.methods`). A process that has not imported the
    method's module (e.g. `write_model_card(output_dir)` alone, updating a card) uses what the card recorded."""
    recorded = _recorded(method, state)
    if recorded and bool(state.get("still")) == still and infos is None:
        return recorded
    infos = _need(infos)
    shown = infos + (shapings() if still else [])
    return {
        "display": " + ".join(info.display for info in infos),
        "entries": [{"name": info.display, "description": info.description, "cite": info.paper.short,
                     "url": info.paper.url} for info in shown],
        "tags": [info.name for info in infos],
        "shaping_tags": [shaping.name for shaping in shapings()] if still else [],
        "bibtex": bibtex_for(infos, still=still),
    }


def _method_part(section: dict, trainer: str) -> dict:
    """The "Method" section: each method's (and shaping's) entry and the trainer class that ran it."""
    return {"method_display": section["display"], "methods": section["entries"], "trainer_name": trainer,
            "project_url": PROJECT_URL}


def _evaluation_part(found: list[dict], names: _CardNames, countdown: bool, repo_id: str | None) -> dict:
    """The "Evaluation" section: the pass@k table, or, before any evaluation, the commands that fill it in."""
    header, rows = result_table(found)
    return {"results": found, "result_header": header, "result_rows": rows, "load_id": names.load_id,
            "eval_hint_bench": "countdown3" if countdown else "gsm8k", "eval_hint_dir": names.shown_dir,
            "repo_hint": repo_id or "USER/NAME"}


def _training_part(card: _CardInputs, names: _CardNames, training: _Training, summary: str | None,
                   curves: str | None) -> dict:
    """The "Training" section: data, rewards, base model, what kind of weights, what the run did, the curves and the
    settings (adapter, method, GRPO)."""
    return {
        "dataset_display": names.dataset_display,
        "reward_funcs": ", ".join(f"`{r}`" for r in card.reward_funcs) if card.reward_funcs else None,
        "base_display": names.base_display,
        "weights_display": (f"{card.adapter} adapter (`library_name: peft`)" if card.adapter is not None
                            else "full model (`library_name: transformers`)"),
        "training_summary": summary,
        "outcome_notes": outcome_notes(card.outcome),
        "adapter_settings": card.lora,
        "curves": curves,
        "method_hparams": training.hyperparameters.get("method") or [],
        "grpo_hparams": training.hyperparameters.get("grpo") or [],
    }


def _card_state(card: _CardInputs, names: _CardNames, training: _Training, section: dict, summary: str | None,
                found: list[dict]) -> dict:
    """The inputs kept in the card (an HTML comment at its end), so that the next call can update it without them.
    Local paths are kept as names only: the card is pushed."""
    base_model = card.base_model
    return {
        "version": STATE_VERSION,
        "method": card.method,
        "base_model": names.base_public,
        "base_model_local": bool(base_model is not None and names.hub_base is None and (
            (card.base_model_from_state and card.state.get("base_model_local")) or looks_local(str(base_model)))),
        "dataset": card.dataset if card.dataset is None or isinstance(card.dataset, str)
        else [str(d) for d in card.dataset],
        "repo_id": card.repo_id,
        "reward_funcs": card.reward_funcs,
        "is_adapter": card.is_adapter,
        "trainer": training.trainer,
        "still": training.still,
        "method_section": section,
        "hyperparameters": training.hyperparameters,
        "versions": training.versions,
        "training_summary": summary,
        "heldout_benchmark": card.heldout_benchmark,
        "outcome": card.outcome or None,
        "adapter_settings": card.lora or None,
        "results": [state_result(r, card.output_dir) for r in found],
    }


def write_model_card(
    output_dir: str | Path,
    method: str | None = None,
    base_model: str | None = None,
    dataset: Any = None,
    training_args: Any = None,
    log_history: Sequence[Mapping] | None = None,
    is_adapter: bool | None = None,
    results: Any = None,
    repo_id: str | None = None,
    reward_funcs: Sequence[str] | None = None,
    template: str | Path | None = None,
    outcome: Mapping | None = None,
    adapter_config: Mapping | None = None,
    heldout_benchmark: str | None = None,
) -> Path:
    """Write or update `output_dir/README.md` (and `training_curves.png`); returns the card's path.

    Args:
        output_dir: the trained folder (full model, or a PEFT adapter with `adapter_config.json`).
        method: a registered method (`exploration-trl train --help` lists them; the registry loads the built-in ones
            on its first read) or a composition of an advantage-side and a loss-side one. May be left
            out when the folder already has a card written by this function.
        base_model: Hub id (or local path) of the model training started from.
        dataset: training dataset: Hub id, built-in name (`gsm8k`, `countdown`, ...) or local file.
        training_args: the trainer's config (or a dict): the method's own fields and key GRPO settings are listed.
        log_history: `trainer.state.log_history`; `reward` and `entropy` give `training_curves.png`. When `None`,
            `trainer_state.json` in the folder (or its newest checkpoint) is used if present.
        is_adapter: `None` detects `adapter_config.json`.
        results: `results.json` paths / folders / dicts of `exploration-trl eval`; `None` reads
            `output_dir/eval*/results.json`. They fill the pass@k table and the `model-index`.
        repo_id: `USER/NAME` on the Hub, used for the title and the loading snippet.
        reward_funcs: names of the training rewards, listed in the card.
        template: another Jinja template (default: the packaged `model_card.md.j2`).
        outcome: what the run did: `weights_changed` (bool, None: not measured) and `reward_never_varied`; a run
            that changed no weight, or whose reward never varied within a group, is said so in words.
        adapter_config: the PEFT config (a dict) of an adapter; default: the folder's `adapter_config.json`. Its
            rank, alpha, dropout and target modules are listed.
        heldout_benchmark: the name of the benchmark evaluated during training (`eval_pass@k` in `log_history`; the
            trainer's `heldout_benchmark`); its result in the table, the final evaluation, ends the training
            sentence's held-out pass@k. Default: the one the card recorded.

    Every file is written atomically: a failure leaves the previous card in place.
    """
    return render_model_card(
        output_dir, method=method, base_model=base_model, dataset=dataset, training_args=training_args,
        log_history=log_history, is_adapter=is_adapter, results=results, repo_id=repo_id,
        reward_funcs=reward_funcs, template=template, outcome=outcome, adapter_config=adapter_config,
        heldout_benchmark=heldout_benchmark,
    ).write()
