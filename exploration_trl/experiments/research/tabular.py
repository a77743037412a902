"""A tabular policy for the tree: one categorical distribution over actions per tree state, as a transformers model.

CaSP's toy (Sec. 4.3) is tabular: "the policy samples actions from a categorical distribution at each state".
A transformer shares its parameters between states, so a push on one state leaks to the others; this model does
not. It is nevertheless an ordinary `PreTrainedModel` + `GenerationMixin`, so TRL's `GRPOTrainer` and this
package's trainers train it unchanged, through the same code path as any LM:

* the backbone (`model.base_model`, no parameters) maps each position's token prefix to the tree state it has
  reached (the actions read so far) and returns that state as a one-hot `last_hidden_state`, so
  `hidden_size == num_states`;
* the LM head is `nn.Linear(num_states, vocab, bias=False)`; its weight column `s` is state `s`'s row of logits.
  TRL's fused head projects the one-hot hidden states through that weight, which *is* a table lookup, and the
  trainers' hidden-state capture, forking masks, top-N candidates and metrics read the same tensors.

States: every tree node of depth `0..horizon-1` (the actions taken so far), then one `done` state for prefixes
holding `horizon` actions or more. Tokens that are not actions (the prompt, padding) do not move the state, so every
prompt position is the root. Non-action logits are `MASK_LOGIT` (probability exactly 0 in float32) and receive
no gradient, so the model's own next-token distribution is the action distribution; the `done` row puts all its
mass on EOS, so unconstrained generation stops after `horizon` actions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

#: Logit of tokens that are not actions: exp(-1e4) is exactly 0 in float32, and 0 * -1e4 stays finite.
MASK_LOGIT = -1e4


class TabularTreeConfig(PretrainedConfig):
    """`vocab_size`, the action token ids (in action order), the horizon and the EOS id fix the table's layout;
    `init_std` is the standard deviation of the initial action logits (0: the uniform policy)."""

    model_type = "exploration_trl_tabular_tree"

    def __init__(self, vocab_size: int = 0, action_token_ids: Sequence[int] = (), horizon: int = 1,
                 init_std: float = 0.0, mask_logit: float = MASK_LOGIT, **kwargs):
        self.vocab_size = int(vocab_size)
        self.action_token_ids = [int(i) for i in action_token_ids]
        self.horizon = int(horizon)
        self.init_std = float(init_std)
        self.mask_logit = float(mask_logit)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def num_actions(self) -> int:
        return len(self.action_token_ids)

    @property
    def num_states(self) -> int:
        """Tree nodes of depth < horizon, plus the `done` state."""
        a = self.num_actions
        return sum(a ** d for d in range(self.horizon)) + 1

    @property
    def hidden_size(self) -> int:
        return self.num_states


def state_offsets(num_actions: int, horizon: int) -> list[int]:
    """Index of the first state of each depth: depth `d`'s node with action code `c` is `offsets[d] + c`."""
    out, total = [], 0
    for d in range(horizon):
        out.append(total)
        total += num_actions ** d
    return out


class TabularTreeBackbone(nn.Module):
    """Token prefix -> one-hot tree state (no parameters). `forward` accepts and ignores the keywords a decoder
    backbone receives (`use_cache`, `position_ids`, ...)."""

    def __init__(self, config: TabularTreeConfig):
        super().__init__()
        # Plain attributes, not buffers: `from_pretrained` builds modules on the meta device and would leave
        # non-persistent buffers uninitialised.
        self.num_actions, self.horizon, self.num_states = config.num_actions, config.horizon, config.num_states
        self.vocab_size, self.action_token_ids = config.vocab_size, list(config.action_token_ids)
        self.offsets = state_offsets(config.num_actions, config.horizon)

    def states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`(B, L)` state index after reading `input_ids[:, : t + 1]`."""
        index = torch.full((self.vocab_size,), -1, dtype=torch.long, device=input_ids.device)
        index[self.action_token_ids] = torch.arange(self.num_actions, device=input_ids.device)
        offsets = torch.tensor(self.offsets, device=input_ids.device)
        action = index[input_ids]
        code = torch.zeros(input_ids.size(0), dtype=torch.long, device=input_ids.device)
        depth = torch.zeros_like(code)
        out = []
        for t in range(input_ids.size(1)):  # a few positions: a loop is clearer than a closed form
            is_action = action[:, t] >= 0
            code = torch.where(is_action & (depth < self.horizon), code * self.num_actions + action[:, t], code)
            depth = depth + is_action.long()
            inside = depth < self.horizon
            node = offsets[depth.clamp(max=self.horizon - 1)] + code
            out.append(torch.where(inside, node, torch.full_like(node, self.num_states - 1)))
        return torch.stack(out, dim=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_ignored):
        hidden = nn.functional.one_hot(self.states(input_ids), self.num_states).float()
        return BaseModelOutput(last_hidden_state=hidden)


class TabularTreeForCausalLM(PreTrainedModel, GenerationMixin):
    """`logits[b, t] = lm_head.weight[:, state(b, t)]`: a table of logits, one column per tree state."""

    config_class = TabularTreeConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: list[str] = []

    def __init__(self, config: TabularTreeConfig):
        super().__init__(config)
        self.model = TabularTreeBackbone(config)
        self.lm_head = nn.Linear(config.num_states, config.vocab_size, bias=False)
        self.post_init()
        self.freeze_non_action_logits()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        model.freeze_non_action_logits()  # loading may put new Parameter objects in place, without the hook
        return model

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # no KV cache: every forward reads the whole prefix (a few tokens)

    def _init_weights(self, module):
        if module is not getattr(self, "lm_head", None):
            return
        cfg = self.config
        with torch.no_grad():
            w = module.weight
            w.fill_(cfg.mask_logit)
            table = torch.zeros(cfg.num_actions, cfg.num_states - 1)
            if cfg.init_std > 0:
                table.normal_(0.0, cfg.init_std)
            w[torch.tensor(cfg.action_token_ids).unsqueeze(1), torch.arange(cfg.num_states - 1)] = table.to(w.dtype)
            if cfg.eos_token_id is not None:
                eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else cfg.eos_token_id[0]
                w[eos, cfg.num_states - 1] = 0.0

    def get_input_embeddings(self):
        return None

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def freeze_non_action_logits(self) -> None:
        """Zero the gradient of every non-action logit (they are `mask_logit` and must stay so under any optimizer,
        e.g. a CaSP candidate set larger than the action set)."""
        w = self.lm_head.weight
        mask = torch.zeros(w.size(0), 1, dtype=w.dtype, device=w.device)
        mask[self.config.action_token_ids] = 1.0
        w.register_hook(lambda g: g * mask.to(g.device, g.dtype))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def action_table(self) -> torch.Tensor:
        """`(num_states - 1, num_actions)` action logits of every non-`done` state."""
        ids = torch.tensor(self.config.action_token_ids, device=self.lm_head.weight.device)
        return self.lm_head.weight[ids, : self.config.num_states - 1].T


AutoConfig.register(TabularTreeConfig.model_type, TabularTreeConfig, exist_ok=True)
AutoModelForCausalLM.register(TabularTreeConfig, TabularTreeForCausalLM, exist_ok=True)


def build_tabular_model(tokenizer, action_ids: Sequence[int], horizon: int, init_std: float = 0.0,
                        seed: int = 0) -> TabularTreeForCausalLM:
    """A tabular tree policy for `tokenizer`'s vocabulary; uniform over actions at every state unless `init_std`."""
    config = TabularTreeConfig(
        vocab_size=len(tokenizer), action_token_ids=list(action_ids), horizon=horizon, init_std=init_std,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TabularTreeForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.use_cache = False
    return model
