"""Correctness under vLLM's inputs, on CPU and without vLLM.

In vLLM mode with importance-sampling correction, TRL 1.16's `_generate_and_score_completions` returns
`old_per_token_logps` (the trainer's own no-grad pass over the sampled tokens), `sampling_per_token_logps` (vLLM's
log-probs) and `importance_sampling_ratio` (exp(old - sampling), truncated or masked), and `_compute_loss`
multiplies the per-token loss by that ratio. These tests drive TRL's real vLLM code path with a stand-in for the
vLLM engine (`trainer.vllm_generation`) and check that

(a) the rollout statistics the methods use (ProGRPO's confidences, DS-GRPO's log-probs, CaSP's top-N candidates)
    come from the trainer's own pass whenever TRL runs one (the correction on, or off-policy training), and the loss
    never reads vLLM's log-probs; with the correction off and on-policy, TRL runs none, and DS-GRPO / ProGRPO take
    vLLM's log-probs instead of an added forward (`boundary/vllm_support.py`), where they are TRL's quantity;
(b) TRL's importance-sampling ratio still multiplies each method's modified loss;
(c) the dictionary keys involved are the ones TRL 1.16 writes and reads (so a rename in TRL fails here).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from trl import GRPOTrainer

import exploration_trl as et
from exploration_trl.core import advantages as core_adv
from exploration_trl.core.utils import broadcast_advantages
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset

TEMPERATURE = 0.7
#: Per-method settings that make each method's effect visible on a 4-completion toy batch.
METHOD_OVERRIDES = {
    "grpo": {},
    "progrpo": {"progrpo_alpha": 0.5},
    "dsgrpo": {"ds_gamma_p": 0.3, "ds_gamma_n": 0.3},
    "casp": {"casp_entropy_quantile": 0.3, "casp_alpha": 0.5, "casp_top1_penalty": 1.5},
    "kl_cov": {"kl_cov_ratio": 0.3},
    "clip_cov": {"clip_cov_ratio": 0.3, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0},
}
METHODS = tuple(METHOD_OVERRIDES)
#: Completions as vLLM would return them (token strings; "<eos>" ends a completion, the others were truncated).
COMPLETIONS = [list("abca") + ["<eos>"], list("aaab"), list("cb") + ["<eos>"], list("bacab")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


class FakeVLLMGeneration:
    """Stands in for `trl.generation.vllm_generation.VLLMGeneration`: canned completions and sampling log-probs.

    `generate` follows the documented return value: `(prompt_ids, completion_ids, logprobs, logprob_token_ids)`
    with `logprobs[i][t]` the list of top log-probs at token `t`, the sampled token's first.
    """

    def __init__(self, completion_ids, sampling_logps):
        self.completion_ids, self.sampling_logps = completion_ids, sampling_logps
        self.generate_calls, self.sync_calls = 0, 0

    def sync_weights(self):
        self.sync_calls += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        self.generate_calls += 1
        assert len(prompts) == len(self.completion_ids)
        logprobs = [[[lp] for lp in row] for row in self.sampling_logps]
        token_ids = [[[t] for t in row] for row in self.completion_ids]
        return prompts, [list(r) for r in self.completion_ids], logprobs, token_ids


def make_trainer(ckpt, tmp_path, method, **overrides):
    cls = et.get_trainer_class(method)
    kwargs = grpo_kwargs(tmp_path, temperature=TEMPERATURE, **{**METHOD_OVERRIDES[method], **overrides})
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=cls.config_class(**kwargs), train_dataset=toy_dataset())
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.model.train()
    return trainer


def completion_ids(trainer):
    tok = trainer.processing_class
    return [[tok.eos_token_id if s == "<eos>" else tok.convert_tokens_to_ids(s) for s in row] for row in COMPLETIONS]


def as_vllm(trainer, sampling_logps, mode="token_truncate", correction=True):
    """Switch the trainer to TRL's vLLM path (colocate or server: the same code after `generate`)."""
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = correction
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_generation = FakeVLLMGeneration(completion_ids(trainer), sampling_logps)
    trainer._last_loaded_step = -1
    return trainer.vllm_generation


def wild_sampling_logps(seed=0):
    """Log-probs nothing like the model's: what a badly mismatched engine could report."""
    g = torch.Generator().manual_seed(seed)
    return [(-12.0 * torch.rand(len(row), generator=g) - 0.01).tolist() for row in COMPLETIONS]


def rollout(trainer, sampling_logps, count_passes=False, correction=True):
    """TRL's `_generate_and_score_completions` on one group of 4 (the same prompt, as TRL's sampler repeats it)."""
    fake = as_vllm(trainer, sampling_logps, correction=correction)
    batch = [dict(trainer.train_dataset[0]) for _ in COMPLETIONS]
    calls = []
    original = trainer._get_per_token_logps_and_entropies
    if count_passes:
        def counting(*args, **kwargs):
            calls.append(args[0])
            return original(*args, **kwargs)
        trainer._get_per_token_logps_and_entropies = counting
    try:
        out = trainer._generate_and_score_completions(batch)
    finally:
        if count_passes:
            del trainer._get_per_token_logps_and_entropies
    assert fake.generate_calls == 1
    return (out, calls) if count_passes else out


@torch.no_grad()
def dense_stats(trainer, out, top_n=3):
    """The trainer model's own (B, T) log-probs of the sampled tokens and its top-N, from plain logits."""
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    t = out["completion_ids"].size(1)
    logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -t - 1:-1].float() / TEMPERATURE
    logp = torch.log_softmax(logits, -1)
    target = logp.gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)
    top = logp.topk(top_n, dim=-1)
    return target, top.values, top.indices


def padded(rows, t):
    x = torch.zeros(len(rows), t)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor(r)
    return x


# ------------------------------------------------------------------------------------------ rollout side
@pytest.mark.parametrize("method", ["casp", "progrpo", "dsgrpo"])
def test_rollout_outputs_under_vllm(ckpt, tmp_path, method):
    """TRL's vLLM-mode keys are there, computed as TRL documents, and the package's extras come from the same pass."""
    trainer = make_trainer(ckpt, tmp_path, method)
    sampling = wild_sampling_logps()
    out, passes = rollout(trainer, sampling, count_passes=True)
    mask = out["completion_mask"].bool()
    assert mask.sum(1).tolist() == [len(r) for r in COMPLETIONS]

    for key in ("old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "advantages",
                "exploration_correct"):
        assert key in out, key
    own, top_vals, top_ids = dense_stats(trainer, out)
    torch.testing.assert_close(out["old_per_token_logps"][mask], own[mask], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["sampling_per_token_logps"], padded(sampling, mask.size(1)))
    # token_truncate: exp(old - sampling) per token, clipped at vllm_importance_sampling_clip_max.
    expected_ratio = torch.exp((own - out["sampling_per_token_logps"]) * mask).clamp(
        max=trainer.vllm_importance_sampling_clip_max)
    torch.testing.assert_close(out["importance_sampling_ratio"], expected_ratio, rtol=1e-4, atol=1e-4)
    # One no-grad pass of the trainer's model (TRL's own), reused by the method: no extra pass.
    assert len(passes) == 1 and passes[0] is trainer.model

    if method == "casp":
        for key in ("casp_forking", "casp_topn_ids", "casp_topn_old_logps", "casp_is_top1"):
            assert key in out, key
        forking = out["casp_forking"]
        assert forking.any()
        torch.testing.assert_close(out["casp_topn_old_logps"][forking], top_vals[forking], rtol=1e-4, atol=1e-4)
        assert torch.equal(out["casp_topn_ids"][forking], top_ids[forking])
        assert torch.equal(out["casp_is_top1"][forking], (top_ids[..., 0] == out["completion_ids"])[forking])
    if method == "progrpo":
        conf = core_adv.confidence(own, out["completion_mask"], trainer.args.progrpo_low_prob_fraction)
        trainer._flush_device_metrics()  # metrics wait on the device until the next log
        logged = trainer._metrics["train"]["progrpo/confidence_mean"][-1]
        assert logged == pytest.approx(torch.nanmean(conf).item(), rel=1e-4)
        wrong = core_adv.confidence(out["sampling_per_token_logps"], out["completion_mask"],
                                    trainer.args.progrpo_low_prob_fraction)
        assert logged != pytest.approx(torch.nanmean(wrong).item(), rel=1e-2)
    if method == "dsgrpo":
        grpo = rollout(make_trainer(ckpt, tmp_path / "grpo", "grpo"), sampling)
        rewards = torch.tensor(letter_reward(trainer.processing_class.batch_decode(
            out["completion_ids"], skip_special_tokens=True)))
        expected = core_adv.dsgrpo_advantages(grpo["advantages"], rewards, own, out["completion_mask"], gamma_p=0.3,
                                              gamma_n=0.3, correct_threshold=trainer.args.correct_reward_threshold)
        torch.testing.assert_close(out["advantages"].float(), expected.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["casp", "progrpo", "dsgrpo"])
def test_rollout_statistics_ignore_vllm_logprobs(ckpt, tmp_path, method):
    """(a) Only `sampling_per_token_logps` and the ratio change when vLLM's log-probs change; what the methods
    computed (advantages, CaSP candidates) stays the same, and it differs from plain GRPO's."""
    trainer = make_trainer(ckpt, tmp_path, method)
    a = rollout(trainer, wild_sampling_logps(0))
    own = a["old_per_token_logps"].tolist()
    b = rollout(trainer, [row[: len(c)] for row, c in zip(own, COMPLETIONS, strict=True)])  # vLLM == trainer
    assert not torch.allclose(a["importance_sampling_ratio"], b["importance_sampling_ratio"])
    for key in a:
        if key in ("sampling_per_token_logps", "importance_sampling_ratio"):
            continue
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
    grpo = rollout(make_trainer(ckpt, tmp_path / "grpo", "grpo"), wild_sampling_logps(0))
    if method == "casp":
        assert a["casp_forking"].any()
    else:  # the advantage-side methods really changed the advantages (the invariance is not vacuous)
        ours = broadcast_advantages(a["advantages"], a["completion_mask"].shape)
        assert not torch.allclose(ours, broadcast_advantages(grpo["advantages"], ours.shape))


# ------------------------------------------------------------------------------------------ loss side
def loss_inputs(trainer, seed=0):
    """A rollout dict as TRL builds it under vLLM, a few optimizer steps later (old log-probs != current)."""
    out = rollout(trainer, wild_sampling_logps(seed))
    g = torch.Generator().manual_seed(seed)
    out["old_per_token_logps"] = out["old_per_token_logps"] + 0.3 * torch.randn(
        out["old_per_token_logps"].shape, generator=g)
    return out


def loss_and_grads(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss_side = trainer._strategy("loss")
    if hasattr(loss_side, "_clip_cov_generator"):  # same random Clip-Cov selection in every call
        loss_side._clip_cov_generator.manual_seed(1234)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("method", METHODS)
def test_loss_never_reads_vllm_logprobs(ckpt, tmp_path, method):
    """(a) Given TRL's ratio, vLLM's raw log-probs have no effect on any method's loss or gradient."""
    trainer = make_trainer(ckpt, tmp_path, method)
    inputs = loss_inputs(trainer)
    loss_a, grads_a = loss_and_grads(trainer, inputs)
    other = dict(inputs, sampling_per_token_logps=inputs["sampling_per_token_logps"] - 25.0)
    loss_b, grads_b = loss_and_grads(trainer, other)
    assert torch.equal(loss_a, loss_b)
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name
    gone = {k: v for k, v in inputs.items() if k != "sampling_per_token_logps"}
    loss_c, _ = loss_and_grads(trainer, gone)
    assert torch.equal(loss_a, loss_c)


@pytest.mark.parametrize("shape", ["token", "sequence"])
@pytest.mark.parametrize("method", METHODS)
def test_importance_ratio_multiplies_modified_loss(ckpt, tmp_path, method, shape):
    """(b) With ratio 2 instead of 1, every method's (modified) policy loss and its gradient double."""
    trainer = make_trainer(ckpt, tmp_path, method)
    inputs = loss_inputs(trainer)
    b, t = inputs["completion_mask"].shape
    ones = torch.ones(b, t) if shape == "token" else torch.ones(b, 1)
    loss1, grads1 = loss_and_grads(trainer, dict(inputs, importance_sampling_ratio=ones))
    loss2, grads2 = loss_and_grads(trainer, dict(inputs, importance_sampling_ratio=2 * ones))
    loss0, grads0 = loss_and_grads(trainer, dict(inputs, importance_sampling_ratio=0 * ones))
    assert loss1.abs() > 0
    # Every per-token term, KL-Cov's penalty included, is weighted by the ratio: loss(0) == 0.
    torch.testing.assert_close(loss2 - loss0, 2 * (loss1 - loss0), rtol=1e-5, atol=1e-7)
    for name in grads1:
        scale = grads1[name].abs().max().item() + grads0[name].abs().max().item()
        torch.testing.assert_close(grads2[name] - grads0[name], 2 * (grads1[name] - grads0[name]),
                                   rtol=1e-4, atol=1e-5 * scale + 1e-9)
    assert loss0 == 0  # nothing escapes the ratio


def test_importance_ratio_is_token_local(ckpt, tmp_path):
    """(b) A ratio of 2 on one token changes the CaSP loss by exactly that token's (modified) loss term."""
    trainer = make_trainer(ckpt, tmp_path, "casp")
    inputs = loss_inputs(trainer)
    b, t = inputs["completion_mask"].shape
    ratio = torch.ones(b, t, requires_grad=True)
    trainer.model.zero_grad(set_to_none=True)
    loss1 = trainer.compute_loss(trainer.model, dict(inputs, importance_sampling_ratio=ratio))
    (per_token,) = torch.autograd.grad(loss1, ratio)  # d loss / d ratio = the per-token loss TRL weighted
    mask = inputs["completion_mask"].bool()
    assert torch.all(per_token[~mask] == 0) and per_token[mask].abs().gt(0).all()
    forking = inputs["casp_forking"] & mask
    i, j = forking.nonzero()[0].tolist()
    bumped = torch.ones(b, t)
    bumped[i, j] = 2.0
    with torch.no_grad():
        loss2 = trainer.compute_loss(trainer.model, dict(inputs, importance_sampling_ratio=bumped))
    torch.testing.assert_close(loss2 - loss1.detach(), per_token[i, j], rtol=1e-4, atol=1e-7)
    # What the ratio weights is CaSP's objective: its gradient differs from plain GRPO's on the same inputs (CaSP
    # keeps the ratio's value and changes its gradient), and the ratio scales it (test above).
    grpo = make_trainer(ckpt, tmp_path / "grpo", "grpo")
    as_vllm(grpo, wild_sampling_logps())
    grpo.model.load_state_dict(trainer.model.state_dict())
    _, casp_grads = loss_and_grads(trainer, dict(inputs, importance_sampling_ratio=bumped))
    _, grpo_grads = loss_and_grads(grpo, dict(inputs, importance_sampling_ratio=bumped))
    assert not torch.allclose(casp_grads["lm_head.weight"], grpo_grads["lm_head.weight"])


def test_kl_cov_penalty_is_importance_weighted(ckpt, tmp_path):
    """KL-Cov's |logp - old| penalty is weighted by vLLM's importance ratio, as verl's kl_cov loss is."""
    trainer = make_trainer(ckpt, tmp_path, "kl_cov")
    inputs = loss_inputs(trainer)
    b, t = inputs["completion_mask"].shape
    loss0, _ = loss_and_grads(trainer, dict(inputs, importance_sampling_ratio=torch.zeros(b, t)))
    assert loss0 == 0


# ------------------------------------------------------------------------------------------ key contract
TRL_WRITES = ("old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "advantages",
              "completion_mask", "completion_ids", "prompt_ids", "prompt_mask", "num_items_in_batch", "tool_mask",
              "ref_per_token_logps")
PACKAGE_KEYS = ("exploration_correct", "casp_forking", "casp_topn_ids", "casp_topn_old_logps", "casp_is_top1")


#: The trainers' code: `trainers/` and the boundary below it (the TRL adapter, the vLLM support).
TRAINER_CODE = (Path(et.__file__).parent / "trainers", Path(et.__file__).parent / "boundary")


def _trainer_files() -> list[Path]:
    return [p for root in TRAINER_CODE for p in sorted(root.rglob("*.py"))]


def _trainer_sources() -> str:
    return "\n".join(p.read_text() for p in _trainer_files())


def _written_keys(src: str) -> set[str]:
    return set(re.findall(r'output\["(\w+)"\]\s*=', src)) | set(re.findall(r'^\s*"(\w+)": \w+,$', src, re.M))


def test_trl_writes_and_reads_the_vllm_keys():
    """(c) The key names as TRL 1.16 writes them in vLLM mode and reads them in the loss."""
    gen = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    written = _written_keys(gen)
    for key in TRL_WRITES:
        assert key in written, f"TRL no longer writes {key!r} in _generate_and_score_completions"
    assert 'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio' in gen
    assert 'output["sampling_per_token_logps"] = sampling_per_token_logps' in gen
    assert 'output["old_per_token_logps"] = old_per_token_logps' in gen
    # The old log-probs are the trainer's own pass over the sampled tokens, computed before the ratio uses them.
    assert re.search(r"old_per_token_logps, _, _ = self\._get_per_token_logps_and_entropies\(\s*self\.model,", gen)
    assert "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask" in gen

    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'inputs.get("old_per_token_logps")' in loss
    assert 'per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]' in loss
    assert 'inputs["advantages"]' in loss and 'inputs["num_items_in_batch"]' in loss
    assert '"tool_mask" not in inputs' in loss
    # ... and it weights the loss before adding the beta-KL term (the convention `_extra_per_token_loss` follows).
    assert loss.index('* inputs["importance_sampling_ratio"]') < loss.index("per_token_loss + self.beta * per_token_kl")


def test_package_reads_only_keys_that_are_written():
    """(c) Every input key the trainers read is written by TRL's vLLM-mode rollout or by the package itself."""
    src = _trainer_sources()
    read = set(re.findall(r'(?:inputs|output)(?:\.get\(|\[)"(\w+)"', src)) | set(
        re.findall(r'"(\w+)" (?:not )?in inputs', src))
    trl_written = _written_keys(inspect.getsource(GRPOTrainer._generate_and_score_completions))
    package_written = set(PACKAGE_KEYS)
    assert read, "no input keys found: the regexes no longer match the trainers' code"
    unknown = read - trl_written - package_written
    assert not unknown, f"trainers read keys nobody writes: {sorted(unknown)}"
    # The keys this file is about are among them (so a TRL rename of one of them fails above).
    assert {"old_per_token_logps", "advantages", "completion_mask", "tool_mask"} <= read
    # vLLM's log-probs are read in one place only: the rollout statistics when TRL computed no old log-probs.
    readers = [p.name for p in _trainer_files() if "sampling_per_token_logps" in p.read_text()]
    assert readers == ["vllm_support.py"]
    support = (Path(et.__file__).parent / "boundary" / "vllm_support.py").read_text()
    assert support.count('"sampling_per_token_logps"') == 1 and 'output.get("sampling_per_token_logps")' in support


def test_package_keys_reach_the_loss(ckpt, tmp_path):
    """(c) The package's extra keys survive TRL's batch splitting: they are per-completion tensors TRL slices."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    trainer = make_trainer(ckpt, tmp_path, "casp")
    out = rollout(trainer, wild_sampling_logps())
    for key in PACKAGE_KEYS:
        assert isinstance(out[key], torch.Tensor) and out[key].size(0) == len(COMPLETIONS), key
    out["row"] = torch.arange(len(COMPLETIONS))
    shuffled = shuffle_sequence_dict(out)
    for key in PACKAGE_KEYS + ("completion_ids", "old_per_token_logps"):
        assert torch.equal(shuffled[key], out[key][shuffled["row"]]), key
    halves = split_tensor_dict(shuffled, 2)
    assert all(key in h and h[key].size(0) == len(COMPLETIONS) // 2 for h in halves for key in PACKAGE_KEYS)
    loss = trainer.compute_loss(trainer.model, {k: v for k, v in halves[0].items() if k != "row"})
    assert torch.isfinite(loss)


# ------------------------------------------------------------------------------------------ vLLM's own log-probs
@pytest.mark.parametrize("method", ["dsgrpo", "progrpo"])
def test_vllm_logprobs_replace_the_added_pass_without_correction(ckpt, tmp_path, method):
    """Correction off, on-policy: TRL computes no old log-probs; DS-GRPO and ProGRPO read vLLM's completion log-probs
    (no forward over the completions). ProGRPO's prompt log-probs then come from one pass over the unique prompts
    (vLLM scores prompt tokens at temperature 1 only; this temperature is 0.7)."""
    trainer = make_trainer(ckpt, tmp_path, method)
    sampling = wild_sampling_logps()
    out, passes = rollout(trainer, sampling, count_passes=True, correction=False)
    assert "old_per_token_logps" not in out and "importance_sampling_ratio" not in out
    width = out["completion_ids"].size(1)
    if method == "dsgrpo":
        assert passes == []
        grpo = rollout(make_trainer(ckpt, tmp_path / "grpo", "grpo"), sampling, correction=False)
        rewards = torch.tensor(letter_reward(trainer.processing_class.batch_decode(
            out["completion_ids"], skip_special_tokens=True)))
        expected = core_adv.dsgrpo_advantages(grpo["advantages"], rewards, padded(sampling, width),
                                              out["completion_mask"], gamma_p=0.3, gamma_n=0.3,
                                              correct_threshold=trainer.args.correct_reward_threshold)
        torch.testing.assert_close(out["advantages"].float(), expected.float(), rtol=1e-5, atol=1e-6)
    else:
        assert len(passes) == 1 and passes[0] is trainer.model  # the prompts alone, once
        conf = core_adv.confidence(padded(sampling, width), out["completion_mask"],
                                   trainer.args.progrpo_low_prob_fraction)
        trainer._flush_device_metrics()  # metrics wait on the device until the next log
        logged = trainer._metrics["train"]["progrpo/confidence_mean"][-1]
        assert logged == pytest.approx(torch.nanmean(conf).item(), rel=1e-5)
    assert trainer._metrics["train"]["vllm/rollout_logps_from_vllm"] == [1.0]


@pytest.mark.parametrize("setting", [{"top_p": 0.9}, {"top_k": 3}, {"repetition_penalty": 1.1}])
def test_truncated_sampling_keeps_the_trainers_pass(ckpt, tmp_path, setting):
    """vLLM's processed log-probs come after top-p/top-k and penalties, so they are not TRL's log_softmax(z / T): the
    trainer's own no-grad pass runs instead, and the method uses it."""
    trainer = make_trainer(ckpt, tmp_path, "dsgrpo", **setting)
    out, passes = rollout(trainer, wild_sampling_logps(), count_passes=True, correction=False)
    assert len(passes) == 1 and passes[0] is trainer.model
    assert "vllm/rollout_logps_from_vllm" not in trainer._metrics["train"]
    own, _, _ = dense_stats(trainer, out)
    grpo = rollout(make_trainer(ckpt, tmp_path / "grpo", "grpo", **setting), wild_sampling_logps(), correction=False)
    rewards = torch.tensor(letter_reward(trainer.processing_class.batch_decode(
        out["completion_ids"], skip_special_tokens=True)))
    expected = core_adv.dsgrpo_advantages(grpo["advantages"], rewards, own, out["completion_mask"], gamma_p=0.3,
                                          gamma_n=0.3, correct_threshold=trainer.args.correct_reward_threshold)
    torch.testing.assert_close(out["advantages"].float(), expected.float(), rtol=1e-4, atol=1e-4)
