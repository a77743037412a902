"""The tree's task and policy model: the rewarding sequences, the toy LM over the actions (masked head, generation
restricted to `horizon` actions) and the exact distribution over every action sequence."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import _common

DEFAULT_ACTIONS = "ABCD"
DEFAULT_HORIZON = 3
DEFAULT_REWARDING = "ACD,ACB,BDC,BDA,CAB,DBA"
#: Toy backbone for the tree (kwargs of `exploration_trl.toy.build_toy_model`).
DEFAULT_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128)
#: A sequence counts as a covered mode when it holds at least this much probability.
MODE_THRESHOLD = 0.01
#: Guard on `|actions| ** horizon` for the exact enumeration.
MAX_SEQUENCES = 200_000

PROMPT_TOKEN = "<q>"
#: Two prompt tokens, so ProGRPO's prompt confidence (which skips the first prompt token) is defined.
PROMPT = f"{PROMPT_TOKEN} {PROMPT_TOKEN}"


@dataclass(frozen=True)
class TreeTask:
    actions: tuple[str, ...]
    horizon: int
    rewarding: tuple[str, ...]

    @classmethod
    def from_flags(cls, actions: str, horizon: int, rewarding: str) -> TreeTask:
        acts = tuple(actions)
        if not acts:
            raise ValueError("--actions is empty; give the action symbols, e.g. ABCD")
        bad = [a for a in acts if a.isspace() or not a.isprintable()]
        if bad:
            raise ValueError(f"--actions must be printable non-space characters; got {actions!r}")
        if len(set(acts)) != len(acts):
            raise ValueError(f"--actions has repeated symbols: {actions!r}; each action must be one distinct character")
        if len(acts) < 2:
            raise ValueError("--actions needs at least 2 symbols")
        if horizon is None or horizon < 1:
            raise ValueError(f"--horizon must be >= 1, got {horizon}")
        if len(acts) ** horizon > MAX_SEQUENCES:
            raise ValueError(
                f"--actions/--horizon give {len(acts)}^{horizon} sequences, more than the {MAX_SEQUENCES} the exact "
                "enumeration allows; use fewer actions or a shorter horizon"
            )
        seqs = _common.parse_list(rewarding, "--rewarding")
        for s in seqs:
            if len(s) != horizon or any(ch not in acts for ch in s):
                raise ValueError(
                    f"--rewarding: '{s}' is not {horizon} symbols from --actions {''.join(acts)}; "
                    f"give comma-separated sequences like {''.join(acts[:horizon]) if len(acts) >= horizon else acts[0] * horizon}"
                )
        if len(seqs) == len(acts) ** horizon:
            raise ValueError("--rewarding lists every sequence; leave at least one non-rewarding sequence")
        return cls(acts, int(horizon), tuple(seqs))

    def describe(self) -> dict[str, Any]:
        return {"actions": "".join(self.actions), "horizon": self.horizon, "rewarding": list(self.rewarding),
                "num_sequences": self.num_sequences, "mode_threshold": MODE_THRESHOLD, "prompt": PROMPT}

    @property
    def num_sequences(self) -> int:
        return len(self.actions) ** self.horizon

    def sequences(self) -> list[str]:
        """Every action sequence, in `itertools.product` order (the order of `sequence_log_probs`)."""
        return ["".join(s) for s in itertools.product(self.actions, repeat=self.horizon)]


# ------------------------------------------------------------------------------------------ policy
def build_tree_tokenizer(task: TreeTask):
    from ....toy import build_toy_tokenizer

    return build_toy_tokenizer([PROMPT_TOKEN, *task.actions], level="word")


def build_tree_policy(task: TreeTask, seed: int = 0, mask_head: bool = True, **model_kwargs):
    """`(model, tokenizer)`: the toy Qwen2 over a vocabulary of special tokens, the prompt token and the actions.

    With `mask_head` (the default) the output layer gets a frozen bias of `MASK_LOGIT` on every non-action token,
    so the model's own next-token distribution *is* the action distribution: the log-probs, entropies and top-N
    candidates the trainers compute are those of the policy that generation samples from. Without it, only
    generation is restricted (`suppress_tokens`) while the trainers see the full vocabulary, and an entropy bonus
    (or any push-down) can park probability on never-sampled tokens (see docs/what_it_shows.md).
    """
    from ....toy import build_toy_model

    tok = build_tree_tokenizer(task)
    kwargs = {**DEFAULT_MODEL, **model_kwargs}
    model = build_toy_model(tok, seed=seed, **kwargs)
    if mask_head:
        mask_output_head(model, action_token_ids(tok, task))
    return model, tok


#: Bias of non-action logits in the masked head: exp(-1e4) is exactly 0 in float32, and 0 * -1e4 stays finite.
MASK_LOGIT = -1e4


def mask_output_head(model, allowed_ids: Sequence[int], value: float = MASK_LOGIT) -> None:
    """Give `model.lm_head` a frozen bias: 0 on `allowed_ids`, `value` elsewhere (TRL's fused head and this
    package's `ops.lm_head` read `lm_head.bias`)."""
    import torch

    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.fill_(value)
        new.bias[list(allowed_ids)] = 0.0
    new.bias.requires_grad_(False)
    model.set_output_embeddings(new)


def action_token_ids(tokenizer, task: TreeTask) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(a) for a in task.actions]
    if tokenizer.unk_token_id in ids or len(set(ids)) != len(ids):
        raise ValueError(f"the tokenizer does not have one token per action {task.actions}")
    return ids


def tree_generation_kwargs(tokenizer, task: TreeTask) -> dict[str, Any]:
    """Extra `generate` kwargs (TRL's `generation_kwargs`) so a completion is exactly `horizon` action tokens."""
    actions = set(action_token_ids(tokenizer, task))
    suppress = [i for i in range(len(tokenizer)) if i not in actions]
    return {"min_new_tokens": task.horizon, "suppress_tokens": suppress}


def sequence_log_probs(model, tokenizer, task: TreeTask, temperature: float = 1.0, prompt: str = PROMPT,
                       batch_size: int = 4096):
    """Exact log-probability (float64, shape `(|A|^H,)`, `task.sequences()` order) of every action sequence under
    the distribution generation samples from: at each step `softmax(logits[action tokens] / temperature)`.

    One teacher-forced forward pass per chunk of sequences; the logits at prompt position `P-1+t` give step `t`.
    """
    import torch

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for an exact distribution, got {temperature}")
    action_ids = torch.tensor(action_token_ids(tokenizer, task))
    prompt_ids = torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    p, h = prompt_ids.numel(), task.horizon
    index = torch.tensor(list(itertools.product(range(len(task.actions)), repeat=h)), dtype=torch.long).view(-1, h)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for s in range(0, index.size(0), batch_size):
                idx = index[s : s + batch_size]
                ids = torch.cat([prompt_ids.expand(idx.size(0), p), action_ids[idx]], dim=1).to(device)
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                step_logits = logits[:, p - 1 : p - 1 + h][:, :, action_ids.to(device)].double() / temperature
                logps = torch.log_softmax(step_logits, dim=-1)
                out.append(logps.gather(-1, idx.to(device).unsqueeze(-1)).squeeze(-1).sum(-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)


def distribution_metrics(task: TreeTask, probs: Sequence[float], threshold: float = MODE_THRESHOLD) -> dict[str, Any]:
    """Accuracy (mass on rewarding sequences), modes covered (rewarding sequences with >= `threshold` mass),
    entropy of the sequence distribution (nats), and the mass of every rewarding sequence."""
    seqs = task.sequences()
    probs = [float(x) for x in probs]
    if len(probs) != len(seqs):
        raise ValueError(f"{len(probs)} probabilities for {len(seqs)} sequences")
    by_seq = dict(zip(seqs, probs))
    mass = {s: by_seq[s] for s in task.rewarding}
    accuracy = sum(mass.values())
    entropy = -sum(q * math.log(q) for q in probs if q > 0)
    top = max(range(len(seqs)), key=lambda i: probs[i])
    wrong_top = max((s for s in seqs if s not in mass), key=lambda s: by_seq[s])
    return {
        "accuracy": accuracy,
        "modes_covered": sum(1 for v in mass.values() if v >= threshold),
        "entropy": entropy,
        "entropy_max": math.log(len(seqs)),
        "mass": mass,
        "non_rewarding_mass": 1.0 - accuracy,
        "top_sequence": seqs[top],
        "top_mass": probs[top],
        "top_non_rewarding": {"sequence": wrong_top, "mass": by_seq[wrong_top]},
        "total_mass": sum(probs),
    }


def exact_metrics(model, tokenizer, task: TreeTask, temperature: float = 1.0) -> dict[str, Any]:
    return distribution_metrics(task, sequence_log_probs(model, tokenizer, task, temperature).exp().tolist())
