"""`cov_selection: global` for KL-Cov and Clip-Cov: the tokens are chosen over the whole optimizer step.

Single process: with two micro-batches per optimizer step (gradient accumulation 2) the global selection of the first
step picks exactly the tokens a single micro-batch holding the same completions picks, while the local one (the
official per-micro-batch choice) does not. Clip-Cov's global draw cuts exactly the drawn number of tokens, with keys
that follow the token, not the split. The 2-process = 1-process check is in tests/test_multiprocess.py
(`kl_cov-global`, `clip_cov-global`, selection ratio 0.2) and, for the k-th key alone, tests/test_collectives.py.
"""

from __future__ import annotations

import pytest
import torch

import exploration_trl as et
from exploration_trl.core.losses import token_covariance
from exploration_trl.trainers.methods.cov_global import GlobalCovSelection
from helpers import toy_checkpoint, toy_dataset, train


def reward(completions, **kwargs):
    return [len(set(c)) / 8 for c in completions]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def test_token_covariance_with_given_means():
    lp = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    # given means (mean lp, mean A) = (-1, 0.5): (A - 0.5) * (lp + 1)
    cov = token_covariance(lp, adv, mask, means=(torch.tensor(-1.0), torch.tensor(0.5)))
    torch.testing.assert_close(cov[mask.bool()], torch.tensor([0.0, -0.5, 3.0]))
    assert torch.isnan(cov[1, 1])


@pytest.mark.parametrize("method, kwargs, text", [
    ("kl_cov", dict(cov_selection="all"), "cov_selection must be one of local, global"),
    ("clip_cov", dict(cov_selection="global", gradient_accumulation_steps=2, steps_per_generation=3),
     "cov_selection: global needs steps_per_generation"),
])
def test_config_errors(method, kwargs, text, tmp_path):
    with pytest.raises(ValueError, match=text):
        et.get_config_class(method)(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                                    report_to=[], **kwargs)


#: The unpatched method: each call of `_first_step_selection` patches the class again within one test.
_FOR_INPUTS = GlobalCovSelection.for_inputs


def _first_step_selection(method, selection, ga, ckpt, path, monkeypatch, **extra):
    """The (prompt, completion, position) triples the first optimizer step selects, whatever micro-batch held them."""
    from exploration_trl.trainers.methods import cov as cov_module

    base = et.get_trainer_class(method)
    chosen: set = set()
    current = {}

    def note(selected):
        if current["step"] == 0:
            inputs = current["inputs"]
            for r, c in zip(*selected.nonzero(as_tuple=True), strict=True):
                chosen.add((tuple(inputs["prompt_ids"][r].tolist()), tuple(inputs["completion_ids"][r].tolist()),
                            int(c)))
        return selected

    class Recording(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            current.update(inputs=inputs, step=self.state.global_step)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def noted_for_inputs(selection):
        out = _FOR_INPUTS(selection)
        if out is not None:
            note(out[0])
        return out

    monkeypatch.setattr(GlobalCovSelection, "for_inputs", noted_for_inputs)
    name = "kl_cov_select" if method == "kl_cov" else "clip_cov_select"
    original = getattr(cov_module.core_loss, name)
    monkeypatch.setattr(cov_module.core_loss, name, lambda *a, **k: note(original(*a, **k)))
    train(Recording, base.config_class, ckpt, path, reward=reward, cov_selection=selection,
          per_device_train_batch_size=8 // ga, gradient_accumulation_steps=ga, steps_per_generation=ga,
          num_iterations=2, max_steps=1, **extra)
    return chosen


SETTINGS = {"kl_cov": dict(kl_cov_ratio=0.2), "clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=-1e9, clip_cov_ub=1e9)}


@pytest.mark.parametrize("method", ["kl_cov", "clip_cov"])
def test_global_selection_spans_the_micro_batches_of_a_step(method, ckpt, tmp_path, monkeypatch):
    one = _first_step_selection(method, "global", 1, ckpt, tmp_path / "g1", monkeypatch, **SETTINGS[method])
    two = _first_step_selection(method, "global", 2, ckpt, tmp_path / "g2", monkeypatch, **SETTINGS[method])
    assert len(one) >= 2 and one == two
    if method == "kl_cov":  # the official per-micro-batch choice picks top tokens of each half instead
        local = _first_step_selection(method, "local", 2, ckpt, tmp_path / "l2", monkeypatch, **SETTINGS[method])
        assert len(local) >= 2 and local != one


def _global_clip_cov_trainer(ckpt, path, **kwargs):
    cls = et.get_trainer_class("clip_cov")
    args = cls.config_class(output_dir=str(path), per_device_train_batch_size=8, num_generations=4,
                            steps_per_generation=1, max_completion_length=16, report_to=[], use_cpu=True,
                            cov_selection="global", clip_cov_lb=-1e9, clip_cov_ub=1e9, seed=3, **kwargs)
    return cls(model=ckpt, reward_funcs=reward, args=args, train_dataset=toy_dataset())


def _terms(generator, micro_batches=2, rows=4, width=16):
    """Micro-batches of rows with random lengths (at least one valid token in all), on-policy: every valid token is
    a Clip-Cov candidate under an unbounded window."""
    terms = []
    for m in range(micro_batches):
        lengths = torch.randint(0, width + 1, (rows,), generator=generator)
        valid = torch.arange(width)[None] < lengths[:, None]
        lp = -torch.rand(rows, width, generator=generator)
        terms.append({"lp": lp, "a": torch.randn(rows, 1, generator=generator).expand(rows, width), "valid": valid,
                      "inputs": {"exploration_row": torch.arange(m * rows, (m + 1) * rows)}})
    if not any(t["valid"].any() for t in terms):
        terms[0]["valid"][0, 0] = True
    return terms


def test_global_clip_cov_cuts_exactly_the_drawn_number_of_tokens(ckpt, tmp_path):
    """Issue 38 item 8: float64 keys rounded to float32 on the wire lost the n-th key in about half of the draws, and
    every draw of n = 1. The keys are distinct integers now: every trial cuts exactly min(max(1, int(N r)), N_cand)."""
    trainer = _global_clip_cov_trainer(ckpt, tmp_path, clip_cov_ratio=0.1)
    generator = torch.Generator().manual_seed(0)
    wrong = []
    for trial in range(2000):
        trainer.state.global_step = trial  # new keys on every trial
        trainer.args.clip_cov_ratio = (0.0, 0.01, 0.1, 0.37, 1.0)[trial % 5]  # n_sel from 1 to every candidate
        terms = _terms(generator)
        covs = [core_loss_cov(t) for t in terms]
        n = sum(t["valid"].sum() for t in terms).double()
        selected = trainer._strategy("loss")._cov_select_global(terms, covs, n)
        expected = min(max(1, int(int(n) * trainer.args.clip_cov_ratio)), int(n))
        got = int(sum(s.sum() for s in selected))
        if got != expected or any((s & ~t["valid"]).any() for s, t in zip(selected, terms, strict=True)):
            wrong.append((trial, got, expected))
    assert wrong == []


def core_loss_cov(term):
    return token_covariance(term["lp"], term["a"], term["valid"])


def test_global_clip_cov_keys_follow_the_token_not_the_split(ckpt, tmp_path):
    """A token's key depends on (seed, step, row, position) only: the rows of one micro-batch, split in two, keep
    their keys; another step or seed draws new ones; the keys are distinct and never negative."""
    trainer = _global_clip_cov_trainer(ckpt, tmp_path)
    clip_cov_keys = trainer._strategy("loss")._clip_cov_keys
    trainer.state.global_step = 5
    whole = clip_cov_keys(torch.arange(8), 16)
    halves = torch.cat([clip_cov_keys(torch.arange(0, 4), 16), clip_cov_keys(torch.arange(4, 8), 16)])
    assert torch.equal(whole, halves)
    assert whole.dtype == torch.int64 and bool((whole >= 0).all()) and whole.unique().numel() == whole.numel()
    assert torch.equal(clip_cov_keys(torch.arange(8), 12), whole[:, :12])  # a shorter batch: same prefix
    trainer.state.global_step = 6
    assert (clip_cov_keys(torch.arange(8), 16) != whole).float().mean() > 0.99
    # Ranks are uniform: over many rows each position is cut equally often (no bias to early or late tokens).
    trainer.state.global_step = 0
    keys = clip_cov_keys(torch.arange(4000), 16)
    first = (keys == keys.min(dim=1, keepdim=True).values).float().mean(dim=0)
    assert float((first - 1 / 16).abs().max()) < 0.02


def test_global_key_width_error_names_the_fix(ckpt, tmp_path):
    trainer = _global_clip_cov_trainer(ckpt, tmp_path)
    trainer.args.generation_batch_size = 2**20
    trainer.args.max_completion_length = 4096
    with pytest.raises(ValueError, match=r"cov_selection: global numbers tokens up to 2\^31; generation_batch_size "
                                         r"\(1048576\) x max_completion_length \(4096\) is larger"):
        trainer._strategy("loss")._clip_cov_keys(torch.arange(2), 8)
