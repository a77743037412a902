"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv 2503.14476, Sec. 3.2, Eq. 11): which groups a batch keeps.

DAPO's constraint (Eq. 11) is `0 < |{o_i : is_equivalent(a, o_i)}| < G`: a group whose completions are all correct
or all wrong has zero advantage under group normalisation, so it is dropped and more prompts are sampled until the
batch holds `needed` groups that vary. Pure selection logic: no TRL, no trainer state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: What "the group's rewards vary" is judged on. `correct`: the number of correct completions is neither 0 nor G
#: (DAPO's Eq. 11, verl's `filter_groups.metric: acc`), with the package's one definition of correct
#: (`rewards.is_correct`: total reward > `correct_reward_threshold`). `reward`: the total rewards are not all
#: equal (verl's `metric: score` / `seq_reward`), i.e. exactly the groups whose GRPO advantage is not all zero.
DYNAMIC_SAMPLING_METRICS = ("correct", "reward")

#: Two total rewards closer than this count as equal under `metric="reward"` (sums of the same float terms).
REWARD_ATOL = 1e-6


def group_varies(
    rewards: torch.Tensor, num_generations: int, metric: str = "correct", correct_threshold: float = 0.0
) -> torch.Tensor:
    """`(B,)` total rewards, groups of `num_generations` contiguous rows -> `(B / G,)` bool: the group is kept.

    `metric="correct"`: kept iff `0 < #{r_i > correct_threshold} < G` (DAPO Eq. 11; a NaN reward is wrong, as in
    `rewards.is_correct`). `metric="reward"`: kept iff the finite rewards of the group differ by more than
    `REWARD_ATOL` (a group with fewer than two finite rewards does not vary).
    """
    if metric not in DYNAMIC_SAMPLING_METRICS:
        raise ValueError(f"metric must be one of {', '.join(DYNAMIC_SAMPLING_METRICS)}; got {metric!r}")
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    grouped = rewards.float().view(-1, num_generations)
    if metric == "correct":
        n_correct = (grouped > correct_threshold).sum(dim=1)
        return (n_correct > 0) & (n_correct < num_generations)
    finite = torch.isfinite(grouped)
    high = torch.where(finite, grouped, torch.full_like(grouped, -torch.inf)).max(dim=1).values
    low = torch.where(finite, grouped, torch.full_like(grouped, torch.inf)).min(dim=1).values
    return (finite.sum(dim=1) >= 2) & ((high - low) > REWARD_ATOL)


@dataclass
class GroupSelection:
    """The groups one generation batch trains on, as `(round, group index within that round)` pairs, in order.

    `kept` are groups that vary; `filled` are non-varying groups added because `max_rounds` ran out (the earliest
    dropped ones, so the batch keeps its size); `dropped` counts the non-varying groups seen over all rounds.
    """

    kept: list[tuple[int, int]] = field(default_factory=list)
    filled: list[tuple[int, int]] = field(default_factory=list)
    dropped: int = 0
    rounds: int = 0

    @property
    def groups(self) -> list[tuple[int, int]]:
        return self.kept + self.filled


class GroupSelector:
    """Accumulates rounds of group decisions until `needed` varying groups are kept.

    Feed each round's `group_varies` result to `add_round`; `full` says whether to stop. `finish()` returns the
    selection: the first `needed` varying groups in (round, group) order (surplus varying groups of the last round
    are discarded, as verl does), then, if fewer were found, the earliest non-varying groups to fill the batch.
    """

    def __init__(self, needed: int):
        if needed < 1:
            raise ValueError(f"needed must be >= 1, got {needed}")
        self.needed = needed
        self._kept: list[tuple[int, int]] = []
        self._dropped: list[tuple[int, int]] = []
        self._rounds = 0

    def add_round(self, varies: torch.Tensor | list[bool]) -> None:
        r = self._rounds
        self._rounds += 1
        for g, keep in enumerate(bool(v) for v in varies):
            (self._kept if keep else self._dropped).append((r, g))

    @property
    def full(self) -> bool:
        return len(self._kept) >= self.needed

    def finish(self) -> GroupSelection:
        kept = self._kept[: self.needed]
        filled = self._dropped[: self.needed - len(kept)]
        return GroupSelection(kept=kept, filled=filled, dropped=len(self._dropped), rounds=self._rounds)


def rows_of_groups(groups: list[tuple[int, int]], num_generations: int) -> list[tuple[int, int]]:
    """`(round, group)` pairs -> `(round, row)` pairs: the `num_generations` contiguous rows of each group."""
    return [(r, g * num_generations + i) for r, g in groups for i in range(num_generations)]
