"""Quantile Advantage Estimation (Wu et al. 2025, arXiv 2509.22611, Sec. 4, Eq. 3-4): GRPO with a K-quantile group
baseline."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core import estimators as core_est
from ...methods import MethodInfo, arxiv_paper, register_method
from ..base import ExplorationGRPOConfig, ExplorationGRPOTrainer, RolloutBatch, check_choice
from ..config import check_sum_then_normalize
from ..components.window_warning import WindowWarning
from ..strategy import AdvantageStrategy

#: 1 for a generation batch whose advantages were all 0 (every group's rewards equal).
ZERO_BATCH = "qae/zero_advantage_batch_frac"


@dataclass
class QAEConfig(ExplorationGRPOConfig):
    """QAE: `A = (r - b_K) / (std_group(r) + qae_eps)` with `b_K` the group's K-quantile reward instead of its mean;
    the division follows TRL's `scale_rewards` as GRPO's does. On binary rewards a hard group (at most `1 - K`
    correct) trains only its correct completions and an easy group only its wrong ones.

    The authors' README says their runs add one flag (`quantile_k`) to verl's DAPO recipe; the set-up is therefore
    inferred from that recipe (clip 0.2 / 0.28, token-level loss, 16 completions per prompt), not stated by the paper.

    `qae_eps` keeps TRL's 1e-4, the eps of the package's GRPO advantages, although the authors' code divides by
    `std + 1e-6` (verl's `compute_grpo_outcome_advantage` default, which their one-line change inherits): the eps is
    the host trainer's constant, shared there by QAE and the GRPO/DAPO it is compared with, so keeping TRL's leaves
    the baseline as the only difference from this package's GRPO, as in the paper's comparison; and the registered
    confirmatory arm `qae` (its defaults) and `scripts/bit_exact.py`'s references were fixed at 1e-4. The two differ
    by the factor `(std + 1e-4) / (std + 1e-6)`, 1.0002 at std 0.5 (the 4th digit). `qae_eps: 1.0e-6` gives the
    authors' number."""

    qae_k: float = field(default=0.4, metadata={"help": "Quantile level K of the baseline, in (0, 1) (paper: 0.4; "
                                                        "the authors suggest 0.6 if entropy collapses early)."})
    qae_quantile_method: str = field(
        default="inverted_cdf",
        metadata={"help": "'inverted_cdf' (the paper's right-continuous quantile inf{x: F(x) >= K}; default) or "
                  "'linear' (torch.quantile's interpolation, as the authors' code; the two agree when K * (G - 1) is "
                  "an integer)."},
    )
    qae_eps: float = field(
        default=1e-4,
        metadata={"help": "Added to the std before dividing (scale_rewards group or batch). 1e-4 is TRL's, as the "
                  "package's GRPO; the authors' code uses verl's 1e-6 (QAEConfig says why the default stays)."},
    )
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip: ratio <= 1 + epsilon_high "
                                                                       "(DAPO's clip-higher, the authors' recipe)."})

    def __post_init__(self):
        super().__post_init__()
        check_qae_options(self)
        check_sum_then_normalize(self, "qae")


def check_qae_options(config) -> None:
    """The checks on QAE's own keys, for `QAEConfig` and for any other front end that reads the same keys
    (`exploration_trl.integrations.verl`)."""
    if not 0.0 < config.qae_k < 1.0:
        raise ValueError(f"qae_k is {config.qae_k} but must lie in (0, 1): it is the quantile level K of the "
                         "baseline (paper: 0.4)")
    check_choice(config, "qae_quantile_method", core_est.QAE_QUANTILE_METHODS)
    if not config.qae_eps >= 0.0:
        raise ValueError(f"qae_eps is {config.qae_eps} but must be >= 0: it is added to the group's std before the "
                         "division (TRL's 1e-4 by default; the authors' code 1e-6)")


def _zero_batches(ctx, values: list[float]) -> str:
    share = sum(v > 0 for v in values) / len(values)
    return (f"qae: every group of {share:.0%} of the generation batches since the last log had equal rewards, so "
            f"QAE's advantages were all 0 and those batches taught nothing (logged as {ZERO_BATCH}; the share of "
            "completions with advantage 0 as qae/zero_adv_frac). dynamic_sampling: true drops such groups. Warned "
            "once.")


@register_method(MethodInfo(
    name="qae", side="advantage", display="QAE (Quantile Advantage Estimation)",
    summary="QAE: GRPO with a K-quantile group baseline instead of the mean",
    description="GRPO's advantages with the group's K-quantile reward as the baseline instead of its mean: on hard "
                "prompts only the rare correct completions are reinforced, on easy prompts only the rare wrong ones "
                "are penalised, and most completions get no update.",
    paper=arxiv_paper(
        "wu2025qae", "Quantile Advantage Estimation: Stabilizing RLVR for LLM Reasoning", "Wu et al., 2025",
        ["Junkang Wu", "Kexin Huang", "Jiancan Wu", "An Zhang", "Xiang Wang", "Xiangnan He"], 2025, "2509.22611"),
    config_prefixes=("qae_",), metric_prefixes=("qae/",),
    coefficients={"qae_k": 0}, published={"qae_k": 0.4}, chosen={"qae_eps": 1e-4},
    where="Sec. 4, Eq. 3–4",
    changes=("GRPO with the group's K-quantile reward as the baseline instead of its mean, `A = (r − b_K)/(std + "
             "eps)`: on binary rewards only the rare outcome of a group moves (`qae/zero_adv_frac` logs the share "
             "left at 0)"),
))
class QAE(AdvantageStrategy):
    """Advantage-side: the K-quantile baseline on the batch's summed rewards (`core.quantile_advantages`)."""

    config_class = QAEConfig
    window_warnings = (WindowWarning(ZERO_BATCH, _zero_batches),)

    def advantages(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        ctx, a = self.ctx, self.args  # TRL's advantages are replaced
        adv = core_est.quantile_advantages(batch.rewards, batch.num_generations, k=a.qae_k,
                                           method=a.qae_quantile_method, scale=a.scale_rewards, eps=a.qae_eps)
        zero = adv == 0
        ctx.queue_metrics({  # global already (the gathered rewards): kept on the device until the log
            "qae/zero_adv_frac": (zero.sum(), zero.numel()),
            "qae/positive_adv_frac": ((adv > 0).sum(), adv.numel()),
            ZERO_BATCH: (zero.all().double(), 1.0),
        }, reduce=False)
        return adv.to(batch.advantages.device)[batch.process_slice]


class QAETrainer(ExplorationGRPOTrainer):
    """TRL's `GRPOTrainer` with QAE's quantile baseline (the `QAE` strategy)."""

    method = "qae"
