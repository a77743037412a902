"""entropy_adv in the trainer: the gradient of a training step is the gradient of TRL's loss with the shaped
advantages held constant (docs/math.md, "Entropy-based advantage": `psi(H_t)` uses `H_t.detach()`).

In the loss pass `capture.entropies` carries a gradient, so without the detach the entropy term would add
`-alpha * grad H_t` (where the cap does not bind) to every step. The expected gradient here is computed from a forward
pass of its own, independent of the package's capture and of `core.entropy_shaped_advantages`; the undetached
gradient is computed beside it to show that the comparison can tell the two apart on this batch.
"""

from __future__ import annotations

import pytest
import torch

import exploration_trl as et
from exploration_trl.toy import build_toy, save_toy
from helpers import distinct_char_reward, train

ALPHA, KAPPA = 0.4, 2.0  # the paper's values, the config's defaults
#: The untrained toy is near-uniform over its ~100 tokens (entropy ~4.5 nats, near its maximum, where the entropy's
#: gradient vanishes and alpha * H caps every token): its output layer is scaled up so that the policy is peaked and
#: token entropies spread below the cap.
HEAD_SCALE = 30.0


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model, tok = build_toy("abc", seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return str(save_toy(model, tok, tmp_path_factory.mktemp("toy") / "ckpt"))


def params(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def grads(loss, model, **kwargs) -> list[torch.Tensor]:
    got = torch.autograd.grad(loss, params(model), allow_unused=True, **kwargs)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(got, params(model))]


def expected_grads(trainer, model, inputs, advantages, detach_entropy: bool) -> list[torch.Tensor]:
    """The gradient of TRL 1.16's `dapo` loss (on-policy, beta 0) at these inputs, its advantages shaped per token
    with the policy's entropies: `A + min(alpha * H, |A| / kappa)` on completion tokens."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    t = inputs["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1][:, -t:] / trainer.temperature
    logp_all = logits.float().log_softmax(dim=-1)
    logps = logp_all.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    h = entropy.detach() if detach_entropy else entropy
    mask = inputs["completion_mask"].float()
    a = advantages.float().unsqueeze(1).expand_as(logps)
    shaped = torch.where(mask.bool(), a + torch.minimum(ALPHA * h, a.abs() / KAPPA), a)
    old = inputs.get("old_per_token_logps")
    ratio = torch.exp(logps - (logps.detach() if old is None else old))
    clipped = torch.clamp(ratio, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    per_token = -torch.min(ratio * shaped, clipped * shaped)
    loss = (per_token * mask).sum() / inputs["num_items_in_batch"].clamp(min=1.0)
    return grads(loss, model)


def test_a_step_s_gradient_holds_the_entropy_term_constant(ckpt, tmp_path):
    seen = []

    class Spy(et.get_trainer_class("entropy_adv")):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            snapshot = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            real = grads(loss, model, retain_graph=True)  # the loss is backpropagated again by the trainer
            detached = expected_grads(self, model, snapshot, snapshot["advantages"], detach_entropy=True)
            undetached = expected_grads(self, model, snapshot, snapshot["advantages"], detach_entropy=False)
            seen.append((real, detached, undetached, snapshot))
            return loss

    trainer = train(Spy, Spy.config_class, ckpt, tmp_path, reward=distinct_char_reward, max_steps=2)
    assert (trainer.args.entropy_adv_alpha, trainer.args.entropy_adv_kappa) == (ALPHA, KAPPA)
    assert len(seen) == 2  # one micro-batch per step: the gradient computed here is the step's
    for real, detached, undetached, inputs in seen:
        assert inputs["advantages"].abs().sum() > 0  # the term acts (groups whose rewards differ)
        scale = max(g.abs().max().item() for g in detached)
        gap = max((u - d).abs().max().item() for u, d in zip(undetached, detached))
        assert gap > 0.05 * scale  # the entropy's own gradient is not negligible on this batch
        for r, d in zip(real, detached):
            torch.testing.assert_close(r, d, rtol=1e-4, atol=1e-4 * scale)
