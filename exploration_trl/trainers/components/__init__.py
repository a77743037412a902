"""Components: the concerns the trainer owns as objects (`trainer.rollout`, `trainer.dynamic_sampling`,
`trainer.resume`, `trainer.metrics`, `trainer.heldout`) and the small pieces they share (the metric queue, the
once-per-window warning, the collectives). A component never receives the trainer: it gets a view of it
(`trainers/view.py`) that gives only the names its class declares in `READS`, so what it depends on is one list in
its own file. It reads TRL's state only through the adapter's accessors (`exploration_trl/boundary/trl_adapter.py`),
imports the boundary and the package's lower layers, and never a method, a callback or the trainer's module.
"""
