"""Reading what TRL's own forward passes compute: the policy under any wrapper, its LM head under any sharding, and
the backbone's hidden states captured from TRL's fused-head forward (`CaptureMixin`, mixed into the trainer)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from torch.distributed.tensor import DTensor
from trl.trainer.utils import maybe_gather_lm_head_ctx


@dataclass
class _Capture:
    """Records what one `_get_per_token_logps_and_entropies` call computed (see `_capturing`)."""

    mode: str  # "rollout" or "loss"
    logps: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # (B, L, H) last hidden states of the backbone
    input_ids: torch.Tensor | None = None
    logits_to_keep: int = 0

    @property
    def done(self) -> bool:
        return self.logps is not None

    def completion_hidden(self) -> torch.Tensor:
        # TRL's fused head scores label t with hidden state t-1; completions are the last `logits_to_keep` labels.
        return self.hidden[:, -self.logits_to_keep - 1 : -1]


class CaptureMixin:
    """The capture plumbing of `ExplorationGRPOTrainer`. `self._capture` (a `_Capture` or None) asks the next
    policy call of `_get_per_token_logps_and_entropies` to record its log-probs, entropies and hidden states."""

    def _lm_head(self, model):
        """`(hf_model, lm_head)` under any accelerate/PEFT wrapping; cached, as `is_peft_model` costs ~10 ms a call."""
        cached = getattr(self, "_lm_head_cache", None)
        if cached is not None and cached[0] is model:
            return cached[1], cached[2]
        base = self.accelerator.unwrap_model(model)
        if is_peft_model(base):
            base = base.get_base_model()
        self._lm_head_cache = (model, base, base.get_output_embeddings())
        return base, self._lm_head_cache[2]

    def _is_policy(self, model) -> bool:
        """True when `model` is the policy under any wrapper (DDP, DeepSpeed engine, FSDP, PEFT), not the reference.

        TRL calls `_get_per_token_logps_and_entropies` with `self.model` in the rollout pass but with the *wrapped*
        model (`self.model_wrapped`: the DDP module, the DeepSpeed engine) in the loss pass.
        """
        if model is self.model or model is self.model_wrapped:
            return True
        if self.ref_model is not None and model is self.ref_model:
            return False
        return self.accelerator.unwrap_model(model) is self.accelerator.unwrap_model(self.model)

    @contextmanager
    def _lm_head_weights(self):
        """Yield `(weight, bias, regather)`: the LM head's full parameters for a direct projection, under any sharding.

        ZeRO-3 keeps the head partitioned outside its module's forward, so it is gathered for the duration with
        TRL's `maybe_gather_lm_head_ctx` (`regather` re-enters that context, for a custom backward that recomputes
        with the weight). FSDP2 holds DTensors: `full_tensor()` all-gathers with autograd, so gradients reach the
        shards. Gathering is a collective: every process must enter this context the same number of times, so
        callers enter it even when they have no rows to project.
        """
        _, head = self._lm_head(self.model)
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

    @contextmanager
    def _capturing(self, model, capture: _Capture):
        """Keep the backbone's last hidden states during TRL's fused-head forward.

        Relies on TRL 1.16's `add_fused_lm_head`, whose forward calls the backbone (`model.base_model`) as a
        module and projects its `last_hidden_state`; a forward hook on that module sees the same tensor (with
        its autograd graph in the loss pass). `tests/test_trl_contract.py` fails if that stops being true.
        """
        base, _ = self._lm_head(model)
        chunks: list[torch.Tensor] = []

        def hook(_module, _args, output):
            chunks.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

        handle = base.base_model.register_forward_hook(hook)
        try:
            yield chunks
        finally:
            handle.remove()

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        capture = self._capture
        if capture is None or capture.done or not self._is_policy(model):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs
            )
        with self._capturing(model, capture) as chunks:
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, True, **kwargs
            )
        capture.logps, capture.entropies = logps, entropies
        capture.hidden = torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]
        capture.input_ids, capture.logits_to_keep = input_ids, logits_to_keep
        if capture.mode == "loss":
            logps = self._transform_policy_logps(logps, capture, self._loss_inputs, self._loss_state)
        return logps, (entropies if compute_entropy else None), aux
