"""run_eval end to end on the offline toy model: files, schema, resume, refusal; plus the generation backends."""

import json
import math
import sys
import types

import pytest

import exploration_trl
from exploration_trl.eval import EvalError
from exploration_trl.eval import generation as gen_mod
from exploration_trl.eval.benchmarks import load_benchmark
from exploration_trl.eval.generation import Samples, TransformersGenerator, VLLMGenerator
from exploration_trl.eval.results import package_versions
from exploration_trl.eval.harness import RESULTS_SCHEMA, extract_answer, load_results, run_eval, summarize
from exploration_trl.rewards import get_reward  # noqa: F401  (run_eval grades with it: a broken import fails here)


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    from exploration_trl.toy import make_toy_checkpoint

    return str(make_toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt"))


FAST = dict(n=4, max_tokens=6, batch_size=4, limit=3, semantic=False, progress=False)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------- end to end
def test_run_eval_end_to_end(toy_dir, tmp_path):
    out = tmp_path / "run"
    res = run_eval(toy_dir, "countdown3", output_dir=out, **FAST)
    for name in ("results.json", "samples.jsonl", "pass_at_k.png"):
        assert (out / name).is_file(), name
    assert (out / "pass_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]

    disk = json.loads((out / "results.json").read_text())
    assert disk == {k: v for k, v in res.items() if k != "path"}
    assert disk["schema"] == RESULTS_SCHEMA
    st = disk["settings"]
    assert (st["n"], st["temperature"], st["top_p"], st["max_tokens"], st["seed"]) == (4, 0.6, 0.95, 6, 0)
    assert st["benchmark"] == "countdown3" and st["reward"] == "countdown" and st["limit"] == 3
    assert st["resolved_backend"] == "transformers" and st["ks"] == [1, 2, 4]
    for pkg in ("torch", "transformers", "trl", "exploration_trl"):
        assert disk["versions"][pkg]
    assert disk["versions"] == package_versions() and disk["versions"]["exploration_trl"] == exploration_trl.__version__
    assert disk["benchmark"]["name"] == "countdown3" and disk["benchmark"]["num_problems"] == 3

    s = disk["summary"]
    assert s["num_problems"] == 3 and s["n"] == 4
    curve = [s["pass_at_k"][k] for k in ("1", "2", "4")]
    assert all(0.0 <= v <= 1.0 for v in curve) and curve == sorted(curve)
    assert 0.0 <= s["avg_at_n"] <= 1.0 and math.isclose(s["avg_at_n"], curve[0])
    assert 0.0 <= s["maj_at_n"] <= 1.0
    # a random 2-layer toy model: high but bounded entropy (nats), short truncated completions
    vocab = 200
    assert 0.5 < s["token_entropy"] < math.log(vocab)
    assert 1 <= s["mean_completion_tokens"] <= 6 and 0.0 <= s["truncated_fraction"] <= 1.0
    assert set(s["diversity_correct"]) >= {"distinct_1", "distinct_2", "self_bleu", "num_problems"}

    assert [p["id"] for p in disk["problems"]] == ["0", "1", "2"]
    for p in disk["problems"]:
        assert p["n"] == 4 and 0 <= p["c"] <= 4 and len(p["answers"]) == 4
    assert disk["problems"][0]["gold"] == 23

    rows = _lines(out / "samples.jsonl")
    assert [r["index"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert len(r["completions"]) == len(r["scores"]) == len(r["entropies"]) == len(r["num_tokens"]) == 4
        assert all(1 <= t <= 6 for t in r["num_tokens"])
        assert all(f in ("stop", "length") for f in r["finish_reasons"])
        assert r["settings"]["n"] == 4

    # rerun: nothing left to generate, identical summary
    again = run_eval(toy_dir, "countdown3", output_dir=out, **FAST)
    assert again["summary"] == res["summary"] and again["timing"]["generation_seconds_this_run"] == 0
    assert load_results(out)["summary"] == res["summary"]


def test_resume_after_interruption(toy_dir, tmp_path, monkeypatch):
    bench = load_benchmark("countdown3", limit=3)
    original = TransformersGenerator.generate
    calls = []

    def flaky(self, prompts, n, **kw):
        calls.append(prompts)
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return original(self, prompts, n, **kw)

    monkeypatch.setattr(TransformersGenerator, "generate", flaky)
    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_eval(toy_dir, "countdown3", output_dir=out, **FAST)
    assert [r["index"] for r in _lines(out / "samples.jsonl")] == [0]
    assert not (out / "results.json").exists()

    calls.clear()
    monkeypatch.setattr(TransformersGenerator, "generate", lambda self, p, n, **kw: calls.append(p) or original(self, p, n, **kw))
    resumed = run_eval(toy_dir, "countdown3", output_dir=out, **FAST)
    assert calls == [[bench.records[1]["prompt"]], [bench.records[2]["prompt"]]]

    calls.clear()
    fresh = run_eval(toy_dir, "countdown3", output_dir=tmp_path / "fresh", **FAST)
    assert len(calls) == 3
    assert resumed["summary"] == fresh["summary"] and resumed["problems"] == fresh["problems"]
    a, b = _lines(out / "samples.jsonl"), _lines(tmp_path / "fresh" / "samples.jsonl")
    assert [r["completions"] for r in a] == [r["completions"] for r in b]

    # raising the limit extends the run: only the new problem is generated
    calls.clear()
    more = run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 4})
    assert calls == [[load_benchmark("countdown3", limit=4).records[3]["prompt"]]]
    assert more["summary"]["num_problems"] == 4


def test_partial_last_line_is_dropped(toy_dir, tmp_path):
    out = tmp_path / "partial"
    run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 2})
    text = (out / "samples.jsonl").read_text()
    (out / "samples.jsonl").write_text(text + text.splitlines()[0][:40])  # crash in the middle of a write
    res = run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 2})
    assert res["summary"]["num_problems"] == 2 and len(_lines(out / "samples.jsonl")) == 2


def test_settings_mismatch_is_refused(toy_dir, tmp_path):
    out = tmp_path / "run"
    run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 1})
    with pytest.raises(EvalError) as err:
        run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 1, "temperature": 1.0})
    msg = str(err.value)
    assert "\n" not in msg and "temperature" in msg and "--overwrite" in msg and "new --output-dir" in msg
    with pytest.raises(EvalError, match="n: 4 -> 2"):
        run_eval(toy_dir, "countdown3", output_dir=out, **{**FAST, "limit": 1, "n": 2})
    with pytest.raises(EvalError, match="benchmark"):
        run_eval(toy_dir, "gsm8k", output_dir=out, **{**FAST, "limit": 1})
    res = run_eval(toy_dir, "countdown3", output_dir=out, overwrite=True, **{**FAST, "limit": 1, "n": 2})
    assert res["summary"]["n"] == 2 and _lines(out / "samples.jsonl")[0]["settings"]["n"] == 2


def test_bad_arguments(toy_dir, tmp_path):
    with pytest.raises(EvalError, match="k=8 .*n=4"):
        run_eval(toy_dir, "countdown3", output_dir=tmp_path / "a", ks=[1, 8], **FAST)
    with pytest.raises(EvalError, match="n must be"):
        run_eval(toy_dir, "countdown3", output_dir=tmp_path / "a", **{**FAST, "n": 0})
    with pytest.raises(EvalError, match="model directory not found"):
        run_eval(str(tmp_path / "missing_model"), "countdown3", output_dir=tmp_path / "b", **FAST)
    if not gen_mod.vllm_available():
        with pytest.raises(EvalError, match="vllm is not installed"):
            run_eval(toy_dir, "countdown3", output_dir=tmp_path / "c", backend="vllm", **FAST)


# ------------------------------------------------------------------------------------------- grading with scripted samples
class _FakeGenerator:
    """Stands in for a generation backend: `samples(prompt, n)` gives each prompt's `Samples`."""

    backend = "transformers"

    def __init__(self, samples):
        self.samples = samples

    def close(self):
        pass

    def generate(self, prompts, n, **kw):
        return [self.samples(p, n) for p in prompts]


def _fixed_texts(fn):
    """A fake backend whose completions of a prompt are `fn(prompt)`, each 5 tokens of entropy 0.5."""
    return _FakeGenerator(lambda p, n: Samples(fn(p), [0.5] * n, [5] * n, ["stop"] * n))


def test_metrics_from_scripted_completions(tmp_path, monkeypatch):
    script = {
        "[30, 100, 93]": ["<answer>30 + 93 - 100</answer>", "<answer>93 - 100 + 30</answer>",
                          "<answer>30+93-100</answer>", "<answer>1 + 2</answer>"],  # target 23: 3 correct
        "[83, 18, 75]": ["<answer>75 + 18 - 83</answer>", "<answer>1+2</answer>", "<answer>1+2</answer>",
                         "no answer"],  # target 10: 1 correct, majority answer wrong
        "[76, 41, 59]": ["<answer>76+41+59</answer>"] * 4,  # target 24: none correct
    }

    def scripted(prompt, n):
        texts = next(v for k, v in script.items() if k in prompt[0]["content"])
        assert len(texts) == n
        return Samples(list(texts), [1.0, 2.0, 3.0, 4.0], [10, 10, 20, 20], ["stop", "stop", "stop", "length"])

    monkeypatch.setattr(gen_mod, "load_generator", lambda *a, **k: _FakeGenerator(scripted))
    res = run_eval("scripted-model", "countdown3", output_dir=tmp_path / "s", n=4, limit=3, semantic=True,
                   progress=False, backend="transformers")
    assert [p["c"] for p in res["problems"]] == [3, 1, 0]
    s = res["summary"]
    assert math.isclose(s["pass_at_k"]["1"], (0.75 + 0.25 + 0) / 3)
    assert math.isclose(s["pass_at_k"]["2"], (1.0 + 0.5 + 0) / 3)
    assert math.isclose(s["pass_at_k"]["4"], 2 / 3)
    assert math.isclose(s["avg_at_n"], 4 / 12)
    assert math.isclose(s["maj_at_n"], 1 / 3)
    assert s["solution_multiplicity"] == {"mean": 1.0, "mean_solved": 1.5}
    assert math.isclose(s["token_entropy"], (10 + 20 + 60 + 80) / 60)
    assert math.isclose(s["truncated_fraction"], 0.25)
    div = s["diversity_correct"]
    assert div["num_problems"] == 1 and 0 < div["distinct_1"] <= 1 and div["self_bleu"] is not None
    assert div["semantic_cosine"] is not None and 0.5 < div["semantic_cosine"] <= 1.0 + 1e-6
    assert res["problems"][0]["answers"][0] == "30+93-100" and res["problems"][1]["answers"][3] is None


def test_extract_answer():
    # The text math_accuracy hands math-verify, as written: one value's forms are matched when counting (below).
    assert extract_answer("so \\boxed{\\dfrac{1}{2}}.", "math") == "\\dfrac{1}{2}"
    assert extract_answer("\\boxed{1,234} and later \\boxed{7}", "math") == "7"
    assert extract_answer("\\boxed{27.0}", "math") == "27.0"
    assert extract_answer("The answer is 1,234.", "math") == "1234"
    assert extract_answer("no box", "math") is None
    assert extract_answer("<answer> (1 + 2) * 3 </answer>", "countdown") == "(1+2)*3"
    assert extract_answer("def f(): pass", "code") is None


def test_math_answers_are_the_ones_the_reward_graded():
    """One extraction: a completion has an answer to count exactly when the reward read one, and "\\boxed 5" (no
    braces), which the reward does not read, is neither graded right nor counted."""
    from exploration_trl.rewards.math import extract_final_answer, math_accuracy

    texts = ["\\boxed 5", "\\fbox{5}", "the answer is: 5", "\\boxed{}", "\\boxed{5} then \\boxed{6", "5"]
    assert [extract_answer(x, "math") for x in texts] == [None, "5", "5", None, "5", None]
    assert [extract_answer(x, "math") is None for x in texts] == [extract_final_answer(x) is None for x in texts]
    assert math_accuracy(texts, answer=["5"] * len(texts)) == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_majority_counts_values_as_the_reward_grades_them():
    # The reward grades \frac{1}{2}, 0.5 and 1/2 as one value: three votes for it against two for 3. As strings, "3"
    # would win (2 votes against 1 each) and maj@n would be 0.
    from exploration_trl.metrics import maj_at_n
    from exploration_trl.rewards.math import math_accuracy

    texts = ["so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "The answer is 1/2.", "\\boxed{3}", "\\boxed{3}"]
    scores = math_accuracy(texts, answer=["0.5"] * 5)
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0]
    answers = [extract_answer(x, "math") for x in texts]
    assert answers == ["\\frac{1}{2}", "0.5", "1/2", "3", "3"]
    row = {"correct": [s > 0 for s in scores], "answers": answers}
    summary = summarize([row], answer_type="math", diversity=False)
    assert summary["maj_at_n"] == 1.0 and summary["solution_multiplicity"]["mean"] == 1.0
    assert maj_at_n([answers], [row["correct"]]) == 0.0
    # Countdown equations stay strings: "1+2" and "2+1" are two answers.
    row = {"correct": [False, False, True], "answers": ["1+2", "1+2", "2+1"]}
    assert summarize([row], answer_type="countdown", diversity=False)["maj_at_n"] == 0.0


# ------------------------------------------------------------------------------------------- generation
def test_transformers_entropy_matches_a_forward_pass(toy_dir):
    import torch

    g = TransformersGenerator(toy_dir)
    prompt = [{"role": "user", "content": "1+1="}]
    temperature = 0.7
    out = g.generate([prompt, "def f(x):"], n=3, temperature=temperature, top_p=0.9, max_new_tokens=5,
                     batch_size=2, seeds=[1, 2], progress=False)
    assert [len(s) for s in out] == [3, 3]
    tok = g.tokenizer
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    eos = set(g._eos_ids())
    s = out[0]
    for j in range(3):
        comp = s.token_ids[j]
        assert len(comp) == s.num_tokens[j] and (comp[-1] in eos) == (s.finish_reasons[j] == "stop")
        assert s.completions[j] == tok.decode(comp, skip_special_tokens=True)
        ids = torch.tensor([prompt_ids + comp])
        with torch.no_grad():
            logits = g.model(ids).logits[0, len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(comp)]
        logp = torch.log_softmax(logits.double() / temperature, -1)
        expected = float(-(logp.exp() * logp).sum(-1).mean())
        assert math.isclose(s.entropies[j], expected, rel_tol=1e-4), (s.entropies[j], expected)
    # same seeds -> same samples; greedy -> n identical copies
    again = g.generate([prompt, "def f(x):"], n=3, temperature=temperature, top_p=0.9, max_new_tokens=5,
                       batch_size=2, seeds=[1, 2], progress=False)
    assert [x.completions for x in again] == [x.completions for x in out]
    greedy = g.generate([prompt], n=2, temperature=0.0, max_new_tokens=4, progress=False)
    assert len(set(greedy[0].completions)) == 1 and len(greedy[0]) == 2


def test_lora_adapter_is_loaded_and_merged(toy_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(toy_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(toy_dir).save_pretrained(adapter)
    model, tok = gen_mod.load_model_and_tokenizer(str(adapter), device="cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM" and not hasattr(model, "peft_config")
    ids = torch.tensor([[10, 11, 12, 13]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, peft_model(ids).logits, atol=1e-5)
        assert not torch.allclose(model(ids).logits, AutoModelForCausalLM.from_pretrained(toy_dir)(ids).logits, atol=1e-4)
    out = gen_mod.generate(str(adapter), ["abc"], n=2, max_new_tokens=3, progress=False, backend="transformers")
    assert len(out[0].completions) == 2


def test_backend_resolution():
    assert gen_mod.resolve_backend("transformers", "x") == "transformers"
    assert gen_mod.resolve_backend("auto", object()) == "transformers"
    with pytest.raises(EvalError, match="unknown backend"):
        gen_mod.resolve_backend("tgi", "x")
    if not gen_mod.vllm_available():
        assert gen_mod.resolve_backend("auto", "x") == "transformers"
        with pytest.raises(EvalError, match="vllm is not installed"):
            gen_mod.resolve_backend("vllm", "x")


def test_vllm_backend_with_a_fake_engine(toy_dir, monkeypatch):
    """The vLLM code path, against a stand-in `vllm` module (vLLM itself needs a GPU)."""
    from exploration_trl.boundary.vllm_offline import _topk_logprobs
    from exploration_trl.toy import build_toy_tokenizer

    seen = {}

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class Logprob:
        def __init__(self, logprob, rank):
            self.logprob, self.rank = logprob, rank

    class LLM:
        def __init__(self, **kw):
            seen["llm"] = kw

        def get_tokenizer(self):
            return build_toy_tokenizer()

        def generate(self, inputs, params, use_tqdm=True):
            seen["inputs"], seen["params"] = inputs, params
            # each position: uniform over 4 tokens -> entropy log 4 at temperature 1
            lp = {t: Logprob(math.log(0.25), r + 1) for r, t in enumerate(range(4))}
            outs = []
            for p in params:
                comps = [types.SimpleNamespace(text=f"c{i}", token_ids=[1, 2, 3], finish_reason="stop" if i else "length",
                                               logprobs=[lp, lp, lp]) for i in range(p.n)]
                outs.append(types.SimpleNamespace(outputs=comps))
            return outs

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    g = VLLMGenerator(toy_dir, seed=3)
    assert seen["llm"]["model"] == toy_dir and seen["llm"]["seed"] == 3 and seen["llm"]["max_logprobs"] >= 20
    res = g.generate([[{"role": "user", "content": "hi"}], "plain"], n=2, temperature=1.0, top_p=0.9,
                     max_new_tokens=7, seeds=[11, 12], progress=False)
    p0 = seen["params"][0]
    assert (p0.n, p0.temperature, p0.top_p, p0.max_tokens, p0.seed, p0.logprobs) == (2, 1.0, 0.9, 7, 11, 20)
    assert seen["params"][1].seed == 12
    tok = build_toy_tokenizer()
    chat_text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert seen["inputs"][0]["prompt_token_ids"] == tok(chat_text, add_special_tokens=False)["input_ids"]
    assert res[0].completions == ["c0", "c1"] and res[0].num_tokens == [3, 3]
    assert res[0].finish_reasons == ["length", "stop"]
    assert all(math.isclose(e, math.log(4)) for e in res[0].entropies)
    # tempering sharpens nothing for a uniform top-k; a skewed one gets lower entropy at lower temperature
    skew = {0: Logprob(math.log(0.7), 1), 1: Logprob(math.log(0.2), 2), 2: Logprob(math.log(0.1), 3)}
    top20, top2 = _topk_logprobs(skew, 20), _topk_logprobs(skew, 2)  # rank 3 is outside the top 2: left out
    assert gen_mod._topk_entropy(top20, 0.5) < gen_mod._topk_entropy(top20, 1.0)
    h = -sum(p * math.log(p) for p in (0.7, 0.2, 0.1))
    assert math.isclose(gen_mod._topk_entropy(top20, 1.0), h)
    assert math.isclose(gen_mod._topk_entropy(top2, 1.0), -sum(p * math.log(p) for p in (0.7 / 0.9, 0.2 / 0.9)))
    g.close()


def test_humaneval_completion_style_grading(tmp_path, monkeypatch):
    import gzip

    from exploration_trl.eval.benchmarks import DATA_DIR

    rows = [json.loads(line) for line in gzip.open(DATA_DIR / "HumanEval.jsonl.gz", "rt")][:1]
    solution = {r["prompt"]: r["canonical_solution"] for r in rows}
    seen = []

    def fn(prompt):
        seen.append(prompt)
        return [solution[prompt], "    return None\n", "```python\n" + prompt + solution[prompt] + "```"]

    monkeypatch.setattr(gen_mod, "load_generator", lambda *a, **k: _fixed_texts(fn))
    res = run_eval("scripted", "humaneval", n=3, limit=1, output_dir=tmp_path / "he", semantic=False, progress=False)
    assert seen == [rows[0]["prompt"]]  # plain-text header, no chat messages
    assert res["problems"][0]["c"] == 2 and res["summary"]["maj_at_n"] is None
    assert res["summary"]["solution_multiplicity"] is None and res["benchmark"]["answer_type"] == "code"


def test_gsm8k_grading_and_majority(tmp_path, monkeypatch):
    texts = ["so \\boxed{18}", "The answer is 18.", "\\boxed{18.0}", "\\boxed{17}", "\\boxed{17}"]
    monkeypatch.setattr(gen_mod, "load_generator", lambda *a, **k: _fixed_texts(lambda p: texts))
    res = run_eval("scripted", "gsm8k", n=5, limit=1, output_dir=tmp_path / "g", semantic=False, progress=False)
    prob = res["problems"][0]
    assert prob["gold"] == "18" and prob["answers"][0] == "18" and prob["answers"][2] == "18.0"
    # math-verify: "answer is" and 18.0 count; the majority answer is 18 (three votes: 18.0 is 18)
    assert prob["answers"] == ["18", "18", "18.0", "17", "17"]
    assert prob["c"] == 3 and res["summary"]["maj_at_n"] == 1.0
    assert res["summary"]["solution_multiplicity"]["mean"] == 1.0


def test_math_solution_multiplicity_counts_values_not_strings(tmp_path, monkeypatch):
    """Three correct spellings of 18 (\\boxed{18}, \\boxed{18.00}, \\boxed{\\frac{36}{2}}) are one solution."""
    texts = ["\\boxed{18}", "\\boxed{18.00}", "\\boxed{\\frac{36}{2}}", "\\boxed{17}"]
    monkeypatch.setattr(gen_mod, "load_generator", lambda *a, **k: _fixed_texts(lambda p: texts))
    res = run_eval("scripted", "gsm8k", n=4, limit=1, output_dir=tmp_path / "m", semantic=False, progress=False)
    prob = res["problems"][0]
    # three distinct strings among the correct answers, one value
    assert prob["c"] == 3 and prob["answers"] == ["18", "18.00", "\\frac{36}{2}", "17"]
    assert res["summary"]["solution_multiplicity"] == {"mean": 1.0, "mean_solved": 1.0}
