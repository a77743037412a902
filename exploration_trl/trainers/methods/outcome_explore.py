"""Outcome-based exploration (Song, Kempe and Munos 2025, "Outcome-based Exploration for LLM Reasoning", Sec. 3):
a historical UCB-style bonus for final answers seldom sampled so far for the same prompt, and a penalty for answers
repeated within the prompt's group.

Choices the paper leaves open, made here (docs/methods.md says why):
* The final answer is the one the reward graded (`rewards.record_outcomes`: math-verify's parse for
  `math_accuracy`, the canonical equation for `countdown`); a completion without one gets neither bonus nor penalty
  and is not counted.
* A prompt is its text (TRL's prompt, a string or messages); its counts are kept for the whole run.
* The bonus of a batch uses the counts before it (an answer never seen gets the full bonus, 1: our reading of why
  the paper caps `1/sqrt(N)` at 1, which it does not explain); the batch's answers are counted after, on training
  batches only.
* UCB-Mean's mean is the group's (`outcome_ucb_baseline: mean`); the paper does not say which, so the batch's
  (`mean_batch`) and leave-one-out (`mean_loo`) are options.
* The batch penalty's coefficient, 0.2, is not from the paper (it gives none for that term): the historical c reused.
* Every process holds the same counts: the batch's prompts and answers are gathered before counting, so two
  processes count as one does. The counts are saved in every checkpoint (`state_dict`), so resume is exact.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import torch

from ...core import bonuses as core_bonus
from ...core.utils import masked_sum
from ...errors import NoOutcomeError
from ...methods import MethodInfo, arxiv_paper, register_method
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice, check_non_negative
from ..components.window_warning import WindowWarning
from ..strategy import AdvantageStrategy

#: 1 for a generation batch in which no completion stated an answer its reward could read.
NO_ANSWER = "outcome_explore/no_answer_batch_frac"


@dataclass
class OutcomeExploreConfig(ExplorationGRPOConfig):
    """Outcome-based exploration: GRPO's advantage plus `outcome_ucb_coef * (min(1, 1/sqrt(N(x, a))) - b0)` (UCB-Con,
    N(x, a) the times answer a was sampled for prompt x before this batch) plus `outcome_batch_coef * -(1/G) *
    #{other completions of the group with the same answer}`. The paper's historical coefficient is 0.2 and b0 is 0.5
    on its "medium" data (1 on "easy"); it gives no coefficient for the batch penalty (0.2 here is unsourced: our
    choice) and studies the two terms apart (set the other coefficient to 0 for either alone)."""

    outcome_ucb_coef: float = field(
        default=0.2, metadata={"help": "Weight c of the historical bonus min(1, 1/sqrt(N)) (paper: 0.2; 0: off)."})
    outcome_ucb_baseline: str = field(
        default="constant",
        metadata={"help": "What the bonus is measured from: 'constant' (UCB-Con: minus outcome_ucb_b0, the paper's "
                  "best historical variant), 'mean' (UCB-Mean: minus the group's mean bonus; which mean the paper "
                  "takes is open, the group's is our choice), 'mean_batch' (minus the batch's mean bonus), 'mean_loo' "
                  "(minus the mean of the group's other completions) or 'none' (UCB)."},
    )
    outcome_ucb_b0: float = field(
        default=0.5, metadata={"help": "UCB-Con's constant b0 (paper: 0.5 on its medium data, 1 on its easy data): "
                                       "answers seen more than 1/b0^2 times get a negative bonus."})
    outcome_batch_coef: float = field(
        default=0.2, metadata={"help": "Weight of the batch penalty -(1/G) * (completions of the group with the same "
                                       "answer) (0.2: unsourced, the paper gives none for this term; 0: off)."})
    outcome_answer_reward: str | None = field(
        default=None,
        metadata={"help": "The reward whose extracted answers are the outcomes (a name TRL logs it under, e.g. "
                  "math_accuracy or countdown); null: the one reward that records answers."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_non_negative(self, {
            "outcome_ucb_coef": "the weight of the historical answer bonus (paper: 0.2; 0 switches it off)",
            "outcome_batch_coef": "the weight of the repeated-answer penalty (default 0.2, not from the paper; 0 "
                                  "switches it off)",
            "outcome_ucb_b0": "UCB-Con's constant (paper: 0.5 or 1)",
        })
        check_choice(self, "outcome_ucb_baseline", core_bonus.OUTCOME_UCB_BASELINES)


def _stable_key(value) -> int:
    """A 63-bit key of a prompt or an answer, the same in every process and run (Python's `hash` is salted)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def _no_answers(ctx, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    return (f"outcome_explore: in {share:.0%} of the generation batches since the last log no completion stated a "
            f"final answer its reward could read, so the exploration bonus did nothing there (logged as {NO_ANSWER}). "
            "Warned once.")


@register_method(MethodInfo(
    name="outcome_explore", side="advantage", display="Outcome-based exploration",
    summary="Outcome exploration: UCB bonus for rarely seen final answers, penalty for repeated ones",
    description="Exploration over final answers rather than tokens: a bonus for answers seldom sampled so far for "
                "the same prompt (UCB over the training history) and a penalty for answers repeated within the "
                "prompt's group.",
    paper=arxiv_paper(
        "song2025outcome", "Outcome-based Exploration for LLM Reasoning", "Song et al., 2025",
        ["Yuda Song", "Julia Kempe", "Remi Munos"], 2025, "2509.06941", "cs.LG"),
    config_prefixes=("outcome_",), metric_prefixes=("outcome_explore/",),
    coefficients={"outcome_ucb_coef": 0, "outcome_batch_coef": 0},
    published={"outcome_ucb_coef": 0.2, "outcome_ucb_b0": 0.5}, chosen={"outcome_batch_coef": 0.2},
    knobs_note="(the paper gives no coefficient for the batch penalty)",
    where="Sec. 3 (no code public; choices in docs/methods.md)",
    changes=("GRPO's advantage plus `c·(min(1, 1/√N(x,a)) − b0)` for final answers `a` seen N times so far for "
             "prompt `x` (UCB-Con), and `−c_b·(1/G)·#(same answer in the group)`; answers from the reward's own "
             "extraction"),
))
class OutcomeExplore(AdvantageStrategy):
    """Advantage-side: GRPO's advantages plus the outcome bonuses (`core.outcome_ucb_bonus`,
    `core.outcome_batch_penalty`), with the answer counts of every prompt seen so far."""

    config_class = OutcomeExploreConfig
    window_warnings = (WindowWarning(NO_ANSWER, _no_answers),)

    def __init__(self, ctx):
        super().__init__(ctx)
        self._outcome_counts: dict[int, dict[int, int]] = {}  # prompt key -> answer key -> times sampled

    def state_dict(self) -> dict:
        return {"outcome_counts": self._outcome_counts}

    def load_state_dict(self, state: dict) -> None:
        self._outcome_counts = {int(p): {int(a): int(n) for a, n in answers.items()}
                                for p, answers in (state.get("outcome_counts") or {}).items()}

    def local_answers(self, n: int) -> tuple[list, list[str | None]]:
        """This process's prompts and the final answers its reward read, one per completion."""
        prompts, recorded = self.ctx.reward_outcomes
        wanted = self.args.outcome_answer_reward
        usable = {name: a for name, a in recorded.items() if len(a) == n}
        if wanted is not None:
            if wanted not in usable:
                raise NoOutcomeError(
                    f"outcome_answer_reward is {wanted!r} but that reward recorded no final answers for this batch "
                    f"(rewards that did: {', '.join(usable) or 'none'}); name one of them")
            return prompts, usable[wanted]
        if len(usable) != 1:
            raise NoOutcomeError(
                "outcome_explore needs each completion's final answer from its reward: "
                + ("no reward recorded any (math_accuracy and countdown do; a custom reward can call "
                   "exploration_trl.rewards.record_outcomes(name, answers))" if not usable else
                   f"{', '.join(usable)} all recorded answers; set outcome_answer_reward to the one to use"))
        return prompts, next(iter(usable.values()))

    def gathered(self, values: list) -> list:
        if self.ctx.num_processes == 1:
            return values
        from accelerate.utils import gather_object

        return gather_object(values)  # in process order, as the batch's rows

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, a, g = self.ctx, self.args, batch.num_generations
        if a.outcome_ucb_coef == 0 and a.outcome_batch_coef == 0:  # switched off: GRPO's advantages, no answers read
            return advantages
        n_local = batch.process_slice.stop - batch.process_slice.start
        prompts, answers = self.local_answers(n_local)
        keys = self.gathered([(_stable_key(p), None if x is None else _stable_key(x))
                              for p, x in zip(prompts, answers)])
        seen = [0 if x is None else self._outcome_counts.get(p, {}).get(x, 0) for p, x in keys]
        device = advantages.device
        has = torch.tensor([x is not None for _, x in keys], dtype=torch.bool).to(device, non_blocking=True)
        counts = torch.tensor(seen, dtype=torch.float32).to(device, non_blocking=True)
        ids = torch.tensor([0 if x is None else x for _, x in keys], dtype=torch.int64).to(device, non_blocking=True)
        ucb = core_bonus.outcome_ucb_bonus(counts, has, g, a.outcome_ucb_baseline, a.outcome_ucb_b0)
        penalty = core_bonus.outcome_batch_penalty(ids, has, g)
        bonus = a.outcome_ucb_coef * ucb + a.outcome_batch_coef * penalty
        if ctx.training:  # evaluation batches are not part of the training history
            for p, x in keys:
                if x is not None:
                    answers_of = self._outcome_counts.setdefault(p, {})
                    answers_of[x] = answers_of.get(x, 0) + 1
        groups = has.view(-1, g)
        repeated = (penalty < 0) & has
        ctx.queue_metrics({  # global already (every process's rows): kept on the device until the log
            "outcome_explore/answered_frac": (has.sum(), has.numel()),
            "outcome_explore/new_answer_frac": (((counts == 0) & has).sum(), has.sum()),
            "outcome_explore/ucb_bonus_mean": (masked_sum(ucb, has), has.sum()),
            "outcome_explore/repeated_answer_frac": (repeated.sum(), has.sum()),
            "outcome_explore/bonus_abs_mean": (bonus.abs().sum(), bonus.numel()),
            NO_ANSWER: ((~groups.any()).double(), 1.0),
        }, reduce=False)
        local = bonus[batch.process_slice]
        return advantages + (local.unsqueeze(-1) if advantages.dim() == 2 else local)


class OutcomeExploreTrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with outcome-based exploration (the `OutcomeExplore` strategy)."""

    method = "outcome_explore"
