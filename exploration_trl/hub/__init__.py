"""Sharing trained models: Hub model cards (`write_model_card`) and uploads (`push_output_dir`).

* :mod:`~exploration_trl.hub.cards` - `write_model_card` / `render_model_card`: `README.md` with Hub metadata,
  the method and its citation, pass@k, hyperparameters, training curves, loading instructions and framework
  versions, rendered from `templates/model_card.md.j2`. Its parts:
  :mod:`~exploration_trl.hub.card_data` (the YAML header: `base_model`, `library_name`, `tags`, `datasets`,
  `model-index` with pass@k), :mod:`~exploration_trl.hub.eval_results` (pass@k from `results.json` files),
  :mod:`~exploration_trl.hub.tables` (pass@k and hyperparameter tables; the versions are `eval.results`'s),
  :mod:`~exploration_trl.hub.curves` (`training_curves.png`) and :mod:`~exploration_trl.hub.state` (the inputs
  kept in the card so that a later call updates it).
* :mod:`~exploration_trl.hub.trainer_card` - `write_trainer_card`: the card a trainer writes from `save_model()`,
  `push_to_hub()` and checkpoints; :mod:`~exploration_trl.hub.outcome` - what a run did, in words (no weight
  changed, a reward that never varied within a group).
* :mod:`~exploration_trl.hub.push` - `push_output_dir`: card + `create_repo` + `upload_folder`, with one-line
  errors and no partial writes; `check_push_ready` (token and network, before training) and `plan_push` (the
  card and file list of a dry run).
* `check_model_source` (:mod:`~exploration_trl.eval.model_source`, which `eval` shares): a model path or Hub id that
  can be loaded, checked before any model loads.
* :mod:`~exploration_trl.hub.citations` - BibTeX of the papers behind a trained model (each method's paper is in its
  record, `exploration_trl.methods`).
* :mod:`~exploration_trl.hub.command` - the `exploration-trl push` subcommand.

What a card says about its method (name, trainer, description, paper, hyperparameter prefixes) is the method's record
in the registry (`exploration_trl.methods`), which imports the method modules on its first read: the trainers write
cards, so this package sits below them and never imports them. A card records its method section, so updating
it (`write_model_card(output_dir)`, `exploration-trl push`) needs no registry; a card for a new method name does.

Imports are lazy: `import exploration_trl.hub` loads neither `huggingface_hub` nor matplotlib.
"""

from __future__ import annotations

_LAZY = {
    "write_model_card": "exploration_trl.hub.cards",
    "render_model_card": "exploration_trl.hub.cards",
    "RenderedCard": "exploration_trl.hub.cards",
    "load_card_state": "exploration_trl.hub.state",
    "collect_results": "exploration_trl.hub.eval_results",
    "normalize_results": "exploration_trl.hub.eval_results",
    "eval_results_from": "exploration_trl.hub.card_data",
    "detect_adapter": "exploration_trl.hub.card_data",
    "plot_training_curves": "exploration_trl.hub.curves",
    "extract_hyperparameters": "exploration_trl.hub.tables",
    "write_trainer_card": "exploration_trl.hub.trainer_card",
    "outcome_notes": "exploration_trl.hub.outcome",
    "check_model_source": "exploration_trl.eval.model_source",
    "check_push_ready": "exploration_trl.hub.push",
    "plan_push": "exploration_trl.hub.push",
    "push_output_dir": "exploration_trl.hub.push",
    "HubError": "exploration_trl.hub.push",
    "PAPERS": "exploration_trl.hub.citations",
    "bibtex_for": "exploration_trl.hub.citations",
    "papers_for": "exploration_trl.hub.citations",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'exploration_trl.hub' has no attribute {name!r}")
