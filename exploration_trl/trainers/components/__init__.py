"""Components: the concerns the trainer owns as objects (`trainer.rollout`, `trainer.dynamic_sampling`,
`trainer.resume`, `trainer.metrics`, `trainer.heldout`) and the small pieces they share (the metric queue, the
once-per-window warning, the collectives). A component reads TRL's state only through the trainer's accessors
(`exploration_trl/boundary/trl_adapter.py`), imports the boundary and the package's lower layers, and never a method, a callback or
the trainer itself.
"""
