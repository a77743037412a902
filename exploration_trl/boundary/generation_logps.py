"""The sampled tokens' log-probabilities, read from the logits `generate` already computes.

ProGRPO, DS-GRPO and the STILL perplexity shaping need the rollout policy's log-probs before the loss. Off-policy
(or under vLLM) TRL computes them in its own pass, which the trainer reuses; fully on-policy TRL computes none, and
a second forward over every prompt and completion would cost as much as the loss's own forward. But the policy has
already produced those logits once, to sample the tokens: a forward hook on the model records, at each decoding
step, `log_softmax(logits / temperature)` (TRL's definition, before any sampling processor such as top-p), and
gathers it at the token fed back on the next step. Only one `(batch, vocab)` row set is kept at a time.

The values are the sampling distribution's own log-probs; a recomputation differs only by the numerics of cached
versus full-sequence attention (about 1e-6 in float32, more in bf16). `rollout_logps_from_generation: false`
restores the recomputation.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class GenerationLogps:
    """Forward hook that turns a `generate` call's raw logits into per-token log-probs of the sampled tokens."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # (B, V) log-softmax of the last step's logits
        self.steps: list[torch.Tensor] = []  # (B,) log-prob of the token sampled at each finished step
        self.usable = True

    def _hook(self, _module, _args, kwargs, output):
        input_ids = kwargs.get("input_ids")
        logits = getattr(output, "logits", None)
        if input_ids is None or logits is None:  # inputs_embeds or a custom head: cannot follow the tokens
            self.usable = False
            return
        if self.previous is not None:
            fed_back = input_ids[:, -1:].to(self.previous.device)
            self.steps.append(self.previous.gather(-1, fed_back).squeeze(-1))
        self.previous = torch.log_softmax(self._scaled(logits[:, -1]), dim=-1)

    def _scaled(self, last: torch.Tensor) -> torch.Tensor:
        """`last.float() / temperature` with one `(B, V)` write fewer per decoding step: none at temperature 1
        (TRL's default; dividing by 1 is exact) and the division in place on a float copy of bf16/fp16 logits.
        The values are the same bits as the plain expression's."""
        scaled = last.float()
        if self.temperature == 1.0:
            return scaled
        if scaled.data_ptr() != last.data_ptr():  # a copy of ours: divide it in place
            return scaled.div_(self.temperature)
        return scaled / self.temperature

    @contextmanager
    def attached(self, model: torch.nn.Module):
        handle = model.register_forward_hook(self._hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()

    def per_row(self, completion_ids: list[list[int]]) -> list[torch.Tensor] | None:
        """Log-probs of each row's completion tokens, or None when they cannot be matched to the completions."""
        if not self.usable or self.previous is None or len(completion_ids) != self.previous.size(0):
            return None
        finished = len(self.steps)  # the last sampled token was never fed back: its log-prob is in `previous`
        rows = []
        for i, ids in enumerate(completion_ids):
            n = len(ids)
            if n > finished + 1:
                return None
            values = [step[i] for step in self.steps[:n]]
            if n == finished + 1:
                values.append(self.previous[i, ids[-1]])
            rows.append(torch.stack(values) if values else self.previous.new_zeros(0))
        return rows


def padded(rows: list[torch.Tensor], width: int, device) -> torch.Tensor:
    """Right-pad per-row log-probs into `(B, width)` with zeros, as TRL pads completions."""
    out = torch.zeros(len(rows), width, device=device)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row.to(device)
    return out
