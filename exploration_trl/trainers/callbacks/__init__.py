"""Callbacks: the concerns that run at TRL's events (`transformers.TrainerCallback`s added by `base.py`), by what they
do:

* `divergence` observes: it reads the logged history and warns (and notes it for the card) when a run diverges;
* `correctness_guard` checks: the methods that split completions into correct and wrong feed it each batch's split
  (`MethodContext.guard_correctness`), and it warns when no group ever mixed;
* `entropy_band` acts: a controller that moves one config knob (TRL's `entropy_coef`, or a method's coefficient)
  after every optimizer step.

A callback gets, as a component does, a view of the trainer limited to its `READS` (and the controller's `WRITES`:
`entropy_coef`; `trainers/view.py`), reads the logged metrics, never TRL's internals (those are the boundary's), and
imports nothing of the other wings of `trainers`.
"""
