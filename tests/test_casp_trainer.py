"""CaSP through the real trainer: the gradient of `compute_loss` equals a dense reference built from
full-vocabulary logits, `core.casp_ratio` and TRL's clipped `dapo` objective (CaSP Eq. 4/5)."""

import pytest
import torch

from exploration_trl.core.losses import casp_ratio, forking_mask
from helpers import toy_checkpoint
from test_trl_contract import hand_inputs, make_trainer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def dense_casp_loss(model, inputs, alpha, penalty, quantile, top_n, temperature, eps_low, eps_high):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, -t - 1 : -1] / temperature
    logp_all = torch.log_softmax(logits.float(), -1)
    lp = logp_all.gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    old = lp.detach()
    mask = inputs["completion_mask"]
    entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
    forking = forking_mask(entropy, mask, quantile)
    top = logp_all.detach().topk(top_n, -1)
    is_top1 = top.indices[..., 0] == inputs["completion_ids"]
    cur_topn = logp_all.gather(-1, top.indices)
    a = inputs["advantages"][:, None]
    ratio = casp_ratio(lp - old, cur_topn - top.values, a, forking, is_top1, alpha, penalty)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
    return (per_token * mask).sum() / inputs["num_items_in_batch"], forking, is_top1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_casp_trainer_gradient_matches_dense_reference(ckpt, tmp_path, temperature):
    cfg = dict(casp_alpha=0.5, casp_top1_penalty=1.5, casp_entropy_quantile=0.3, casp_top_n=3)
    trainer = make_trainer(ckpt, tmp_path, method="casp", temperature=temperature, epsilon_high=0.28,
                           exploration_metrics=False, **cfg)
    model = trainer.model
    inputs = hand_inputs(trainer, seed=3)
    # Make the sampled token the rank-1 candidate at some positions so the top-1 penalty (Eq. 5) is exercised.
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        logits = model(input_ids=ids).logits[:, -6:-1]
        inputs["completion_ids"][:, ::2] = logits.argmax(-1)[:, ::2]

    model.zero_grad()
    trainer.compute_loss(model, dict(inputs)).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    ref, forking, is_top1 = dense_casp_loss(model, inputs, cfg["casp_alpha"], cfg["casp_top1_penalty"],
                                            cfg["casp_entropy_quantile"], 3, temperature, 0.2, 0.28)
    ref.backward()
    valid = inputs["completion_mask"].bool()
    adv_neg = (inputs["advantages"] < 0)[:, None]
    assert (forking & valid).any() and (forking & is_top1 & adv_neg & valid).any(), "test must exercise both branches"
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=2e-4, atol=1e-6, msg=name)


def test_casp_alpha_changes_gradient(ckpt, tmp_path):
    """Guard against a vacuous match: the smoothed target must move the gradient away from plain GRPO's."""
    grads = []
    for alpha in (0.0, 0.5):
        trainer = make_trainer(ckpt, tmp_path, method="casp", casp_alpha=alpha, casp_top1_penalty=1.0,
                               casp_entropy_quantile=0.0, exploration_metrics=False)
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, hand_inputs(trainer)).backward()
        grads.append(trainer.model.lm_head.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() > 1e-6
