"""Callbacks: concerns that only observe training (divergence, the entropy band, the correctness guard), added to the
trainer by `base.py` as `transformers.TrainerCallback`s. A callback reads the trainer's public state and the logged
metrics, never TRL's internals (those are the boundary's), and imports nothing of the other wings of `trainers`.
"""
