"""A method is a registered strategy: one object that says once what the method is and does, and that
`ExplorationGRPOTrainer` calls at fixed points of TRL's step (in the spirit of verl's `core_algos` registry, where an
algorithm is a function registered by name).

A strategy class declares, as class attributes and methods:

* its record, by `@register_method(MethodInfo(...))` on the class (`exploration_trl.methods`), and `config_class`, the
  dataclass of its config keys and of the TRL defaults it changes (its presets);
* what it needs from the rollout (`needs_rollout_logps`, `needs_prompt_logps`, `needs_rollout_candidates`) and from
  the loss pass (`needs_loss_capture`);
* its hooks, by side: an advantage-side strategy `advantages(batch, advantages)`, once per generation batch; a
  loss-side one `transform_logps(logps, capture, inputs, state)` (the log-probs TRL's ratio sees) and/or
  `extra_loss(inputs, capture, state)` (a per-token term reduced as TRL's `loss_type` reduces its own), on every
  micro-batch; either may add per-completion tensors to the batch (`rollout_extras`);
* its metrics, queued on the device with `self.ctx.queue_metrics({name: (sum, count)})` and read at the next log, and
  its warnings decided from one metric's window at a log (`window_warnings`), each given once per run;
* nothing for "did nothing this step": the trainer marks each hook it calls (`run_hook`), and a step on which a
  strategy's hook was not called stops training (`HookDidNotRunError`), never silently GRPO;
* what it keeps between steps (`state_dict` / `load_state_dict`) and its private random generators (`generators`),
  saved in every checkpoint and restored on resume.

One trainer holds at most one strategy of each side (`method: progrpo+casp`; the loss side's presets win). A
strategy does not hold its trainer: it reads its run through `self.ctx`, a `MethodContext` (`trainers/context.py`)
that names everything a method may read or call (the settings as `self.args`, the loss pass's helpers, the metrics
queue, the warnings, the collectives). The worked example: `docs/writing_a_method.md`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..boundary.capture import Capture
    from .context import MethodContext
    from .components.window_warning import WindowWarning
    from .components.rollout import RolloutBatch

__all__ = ["Strategy", "AdvantageStrategy", "LossStrategy", "bind_public_class", "build_strategies",
           "expected_hooks", "check_hooks_ran", "run_hook"]


class Strategy:
    """The base of every method (see the module docstring). One instance per trainer, made once TRL's set-up ran."""

    #: Marks a strategy class for `register_method` (only GRPO's trainer class is registered directly).
    is_strategy = True
    #: Set by `register_method`: the record (`MethodInfo`), its name and its side.
    info: Any = None
    name: str = ""
    side: str = ""
    #: The method's config dataclass (its keys and presets); every strategy sets it.
    config_class: type | None = None
    #: Warnings decided at a log from one metric's window (`metrics_logging.WindowWarning`), given once per run.
    window_warnings: tuple[WindowWarning, ...] = ()

    def __init__(self, ctx: MethodContext):
        """Checks and warnings that need the run (its layout, its settings) belong here."""
        self.ctx = ctx

    @property
    def args(self):
        """The run's config (`self.ctx.args`)."""
        return self.ctx.args

    @property
    def trainer(self):
        raise AttributeError(f"{type(self).__name__}.trainer: a strategy no longer holds its trainer (0.9); read "
                             "the run through self.ctx (trainers/context.py, docs/writing_a_method.md)")

    # -------------------------------------------------------------------------------------------- what it needs
    def needs_rollout_logps(self) -> bool:
        """The rollout policy's per-token log-probs and entropies of the completions, in `batch`."""
        return False

    def needs_prompt_logps(self) -> bool:
        """log p(q_t | q_<t) of the prompt tokens, in `batch` (ProGRPO's prompt confidence)."""
        return False

    def needs_rollout_candidates(self) -> bool:
        """The rollout pass's hidden states, kept for the loss (CaSP's candidates when off-policy)."""
        return False

    def needs_loss_capture(self) -> bool:
        """The loss pass's hidden states and entropies (every loss-side hook that reads the policy)."""
        return False

    # ------------------------------------------------------------------------------------------------ the hooks
    def rollout_extras(self, batch: RolloutBatch, capture: Capture | None) -> dict:
        """Per-completion tensors the loss reads (TRL shuffles and splits them with the batch)."""
        return {}

    def prompt_logps(self, logps: torch.Tensor, mask: torch.Tensor, output) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt log-probs and mask the advantage hook reads (e.g. only the user's tokens)."""
        return logps, mask

    def before_loss(self, model, inputs) -> None:
        """On every micro-batch, before TRL's loss (e.g. KL-Cov's global selection on a step's first one)."""

    # ------------------------------------------------------------------------------------- state between steps
    def state_dict(self) -> dict:
        """Plain Python values that must survive a resume (the file is loaded with `weights_only`)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` saved (an empty dict for checkpoints written before it existed)."""

    def generators(self) -> dict[str, torch.Generator]:
        """Private random generators by a name unique to the method, saved and restored with every checkpoint."""
        return {}


class AdvantageStrategy(Strategy):
    """A method that changes the advantages, once per generation batch."""

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        """This process's new advantages, `(B_local,)` or `(B_local, T)`, from TRL's (`advantages`) and `batch`."""
        raise NotImplementedError


class LossStrategy(Strategy):
    """A method that changes the per-token loss, on every micro-batch (it reads TRL's own forward pass)."""

    def needs_loss_capture(self) -> bool:
        return True

    def transform_logps(self, logps: torch.Tensor, capture: Capture, inputs, state: dict) -> torch.Tensor:
        """The log-probs TRL's loss should see: TRL forms its ratio as `exp(returned - old)`, so a method that wants
        ratio `R` returns `old + log(R)`."""
        return logps

    def extra_loss(self, inputs, capture: Capture, state: dict) -> torch.Tensor | None:
        """A `(B, T)` term added to TRL's loss, reduced exactly as TRL's `loss_type` reduces its own. None: none."""
        return None


def run_hook(trainer, strategy: Strategy, hook: str, *args):
    """Call `strategy.<hook>(*args)` for `trainer`, marking first that the strategy acted on this step when it defines
    that hook (a loss-side strategy may define only one of `transform_logps` and `extra_loss`). The dispatcher marks,
    so no hook can forget to; `check_hooks_ran` then stops a step on which a strategy's hook was never called."""
    base = AdvantageStrategy if strategy.side == "advantage" else LossStrategy
    if getattr(type(strategy), hook) is not getattr(base, hook):
        trainer.mark_hook_ran(strategy.name)
    return getattr(strategy, hook)(*args)


def build_strategies(trainer) -> list[Strategy]:
    """The strategies of `trainer.method` (advantage side first), each given the trainer's one `MethodContext`;
    none for GRPO."""
    from ..methods import strategy_of
    from .context import MethodContext

    strategies, ctx = [], MethodContext(trainer)
    for part in type(trainer).method_parts:
        cls = strategy_of(part)
        if cls is None:  # GRPO, the one method registered as a trainer class: no strategy
            continue
        if not isinstance(trainer.args, cls.config_class):
            name = type(trainer).__name__
            raise ValueError(f"{name} runs {part}, whose keys are in {cls.config_class.__name__}, but args is "
                             f"{type(trainer.args).__name__}; build args with {name}.config_class(...)")
        strategies.append(cls(ctx))
    return strategies


def bind_public_class(cls: type) -> None:
    """Called for every trainer class: a public method class is thin, `method = "<name>"`, and this binds it to the
    registered strategy (its config class, its hook and name for cards) and records it as the method's trainer
    (`methods.bind_trainer`). A composition's class (`"a+b"`) is built by the registry with its own config. Either
    way the method string is parsed here, once, into `method_parts`, which the strategies and the card read."""
    from ..methods import bind_trainer, parse_method, strategy_of

    method = cls.__dict__.get("method")
    if method is None:
        return
    if "method_parts" not in cls.__dict__:  # the registry's composed classes bring theirs
        cls.method_parts = parse_method(method)
    if len(cls.method_parts) > 1:
        return
    strategy = strategy_of(cls.method_parts[0])
    if strategy is None:
        raise ValueError(f"{cls.__name__} binds method {method!r}, which is not a registered strategy")
    if "config_class" not in cls.__dict__:
        cls.config_class = strategy.config_class
    cls.method_name = strategy.name
    if strategy.side != "none":
        cls.hook = (strategy.side, strategy.name)
    bind_trainer(strategy.name, cls)


def expected_hooks(trainer, side: str) -> list[str]:
    """Names of the hooks `trainer` must run on every step of `side` ("advantage" or "loss"): its strategies' of that
    side, and on the loss side the exploration metrics when they are switched on."""
    names = [s.name for s in trainer.strategies if s.side == side]
    if side == "loss" and trainer.args.exploration_metrics:
        names.append("exploration metrics")
    return names


def check_hooks_ran(trainer, side: str, reason: str) -> None:
    """No silent no-op: stop when a hook expected on this step (`expected_hooks`) did not mark that it acted."""
    from ..errors import HookDidNotRunError

    missing = [n for n in trainer._expected_hooks(side) if n not in trainer._ran_hooks]
    if missing:
        mode = "training" if trainer.model.training else "evaluation"
        raise HookDidNotRunError(
            f"{' and '.join(missing)}: the {side}-side hook did not run on this {mode} step ({reason}); "
            f"stopping rather than silently training plain GRPO. Please report this with your TRL version and "
            f"launcher (accelerate/DeepSpeed/FSDP config)."
        )
