"""Reading what TRL's own forward passes compute: the policy's LM head under any wrapper and sharding, and the
backbone's hidden states captured from TRL's fused-head forward (`LMHead`, a component of the trainer).

The trainer's override of TRL's `_get_per_token_logps_and_entropies` (`trl_adapter.py`) fills a `Capture`
while a capture is asked for: the rollout pass (a method needs the rollout policy's statistics) or the loss pass (a
loss hook or the exploration metrics read the hidden states).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from torch.distributed.tensor import DTensor
from trl.trainer.utils import maybe_gather_lm_head_ctx


@dataclass
class Capture:
    """Records what one `_get_per_token_logps_and_entropies` call computed."""

    mode: str  # "rollout" or "loss"
    logps: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # (B, L, H) last hidden states of the backbone
    input_ids: torch.Tensor | None = None
    logits_to_keep: int = 0
    # What the pass folded in for a `CandidateRequest` (`fused_head.py`), `(B, T, K)` at the completion positions;
    # None where nothing was folded.
    candidate_ids: torch.Tensor | None = None  # the pass's own top-K ids (rank order); None when they were given
    candidate_logps: torch.Tensor | None = None  # their log-probs under the pass's policy (with its gradient)

    @property
    def done(self) -> bool:
        return self.logps is not None

    def completion_hidden(self) -> torch.Tensor:
        # TRL's fused head scores label t with hidden state t-1; completions are the last `logits_to_keep` labels.
        return self.hidden[:, -self.logits_to_keep - 1 : -1]


class LMHead:
    """The policy's LM head of one trainer (`trainer.model`, any accelerate / PEFT wrapping)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self._cache = None
        self._candidate_source = None

    def fold_candidates(self, source) -> None:
        """Have the captured passes fold candidates into TRL's head: `source(mode, inputs)` returns the
        `fused_head.CandidateRequest` of a capture (`mode` "rollout" or "loss"; `inputs` the loss's micro-batch, None
        at the rollout), or None for none."""
        self._candidate_source = source

    def candidate_request(self, mode: str, inputs):
        """The candidates the next captured pass in `mode` should fold in (None: none)."""
        return None if self._candidate_source is None else self._candidate_source(mode, inputs)

    def of(self, model):
        """`(hf_model, lm_head)` under any accelerate/PEFT wrapper; cached, as `is_peft_model` costs ~10 ms a call."""
        if self._cache is not None and self._cache[0] is model:
            return self._cache[1], self._cache[2]
        base = self.trainer.accelerator.unwrap_model(model)
        if is_peft_model(base):
            base = base.get_base_model()
        self._cache = (model, base, base.get_output_embeddings())
        return base, self._cache[2]

    def is_policy(self, model) -> bool:
        """True when `model` is the policy under any wrapper (DDP, DeepSpeed engine, FSDP, PEFT), not the reference.

        TRL calls `_get_per_token_logps_and_entropies` with `self.model` in the rollout pass but with the *wrapped*
        model (`self.model_wrapped`: the DDP module, the DeepSpeed engine) in the loss pass.
        """
        t = self.trainer
        if model is t.model or model is t.model_wrapped:
            return True
        if t.ref_model is not None and model is t.ref_model:
            return False
        return t.accelerator.unwrap_model(model) is t.accelerator.unwrap_model(t.model)

    def weights(self):
        """`head_weights` of the policy's LM head (a context manager)."""
        return head_weights(self.of(self.trainer.model)[1])

    @contextmanager
    def capturing(self, model):
        """Keep the backbone's last hidden states during TRL's fused-head forward (yields the list they fill).

        Relies on TRL 1.16's `add_fused_lm_head`, whose forward calls the backbone (`model.base_model`) as a
        module and projects its `last_hidden_state`; a forward hook on that module sees the same tensor (with
        its autograd graph in the loss pass). `tests/test_trl_contract.py` fails if that stops being true.
        """
        base, _ = self.of(model)
        chunks: list[torch.Tensor] = []

        def hook(_module, _args, output):
            chunks.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

        handle = base.base_model.register_forward_hook(hook)
        try:
            yield chunks
        finally:
            handle.remove()


@contextmanager
def head_weights(head):
    """Yield `(weight, bias, regather)`: an LM head's full parameters for a direct projection, under any sharding.

    ZeRO-3 keeps the head partitioned outside its module's forward, so it is gathered for the duration with
    TRL's `maybe_gather_lm_head_ctx` (`regather` re-enters that context, for a custom backward that recomputes
    with the weight). FSDP2 holds DTensors: `full_tensor()` all-gathers with autograd, so gradients reach the
    shards. Gathering is a collective: every process must enter this context the same number of times, so
    callers enter it even when they have no rows to project.
    """
    weight, bias = head.weight, head.bias
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
        bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
        regather = nullcontext
    else:
        def regather():
            return maybe_gather_lm_head_ctx(head.weight, head.bias)
    with regather():
        yield weight, bias, regather


def fill(capture: Capture, logps, entropies, chunks: list[torch.Tensor], input_ids, logits_to_keep: int,
         folded=None) -> None:
    """Record one captured call's results in `capture` (`folded`: its `fused_head.FoldedCandidates`, if any)."""
    capture.logps, capture.entropies = logps, entropies
    capture.hidden = torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]
    capture.input_ids, capture.logits_to_keep = input_ids, logits_to_keep
    result = folded.result() if folded is not None else None
    if result is not None:
        capture.candidate_ids, capture.candidate_logps = result
