"""`cov_selection: global` for KL-Cov and Clip-Cov: the tokens are chosen over the whole optimizer step.

Single process: with two micro-batches per optimizer step (gradient accumulation 2) the global selection of the first
step picks exactly the tokens a single micro-batch holding the same completions picks, while the local one (the
official per-micro-batch choice) does not. The 2-process = 1-process check is in tests/test_multiprocess.py
(`kl_cov-global`, `clip_cov-global`, selection ratio 0.2).
"""

from __future__ import annotations

import pytest
import torch

import exploration_trl as et
from exploration_trl.core.losses import token_covariance
from helpers import toy_checkpoint, train


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


def _first_step_selection(method, selection, ga, ckpt, path, monkeypatch, **extra):
    """The (prompt, completion, position) triples the first optimizer step selects, whatever micro-batch held them."""
    from exploration_trl.trainers import cov as cov_module

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

        def _global_cov_for(self, inputs):
            out = super()._global_cov_for(inputs)
            if out is not None:
                note(out[0])
            return out

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
