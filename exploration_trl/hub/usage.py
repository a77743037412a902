"""The model card's "How to use" section: loading the model (transformers, or peft for an adapter), sampling from it
and measuring its pass@k again."""

from __future__ import annotations

from .. import PROJECT_URL

__all__ = ["usage_section"]


def usage_section(load_id: str, adapter: str | None, countdown: bool, countdown_tiny: bool = False) -> str:
    """The "How to use" section: loading (transformers, or peft for an adapter), sampling, evaluating. A
    countdown-tiny model (the demo's) was trained on plain-text prompts, not a chat template."""
    if countdown:
        question = ("Using the numbers [3, 5, 7], write an arithmetic equation whose value is 22. Give the "
                    "final equation between <answer> and </answer>.")
    else:
        question = "What is 12 * 13 + 7? Please reason step by step, and put your final answer within \\\\boxed{}."
    if adapter is not None:
        load = (
            "from peft import AutoPeftModelForCausalLM\n"
            "from transformers import AutoTokenizer\n\n"
            f'model_id = "{load_id}"\n'
            'model = AutoPeftModelForCausalLM.from_pretrained(model_id, dtype="auto", device_map="auto")\n'
            "model = model.merge_and_unload()  # optional: fold the adapter into the base weights\n"
            "tokenizer = AutoTokenizer.from_pretrained(model_id)\n"
        )
        intro = (f"This folder holds a {adapter} adapter; `peft` loads the base model named in "
                 "`adapter_config.json` and applies it:")
    else:
        load = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model_id = "{load_id}"\n'
            'model = AutoModelForCausalLM.from_pretrained(model_id, dtype="auto", device_map="auto")\n'
            "tokenizer = AutoTokenizer.from_pretrained(model_id)\n"
        )
        intro = "With `transformers`:"
    if countdown_tiny:
        gen = (
            'inputs = tokenizer("nums: 3 5 7\\ntarget: 22\\n", return_tensors="pt").to(model.device)\n'
            "out = model.generate(**inputs, max_new_tokens=20, do_sample=True, temperature=1.0)\n"
            'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))  # e.g. 3*5+7\n'
        )
        evaluate = ("To measure its pass@k again, run `exploration-trl demo` (it evaluates the warm start and every "
                    "trained model on the same held-out problems).")
        return f"{intro}\n\n```python\n{load}\n{gen}```\n\n{evaluate}"
    gen = (
        f'messages = [{{"role": "user", "content": "{question}"}}]\n'
        "inputs = tokenizer.apply_chat_template(\n"
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True\n'
        ").to(model.device)\n"
        "out = model.generate(**inputs, max_new_tokens=512, do_sample=True, temperature=0.6, top_p=0.95)\n"
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
    )
    evaluate = (
        "To measure pass@k yourself (n samples per problem, unbiased estimator):\n\n"
        "```bash\n"
        f'pip install "exploration-trl @ git+{PROJECT_URL}"\n'
        f"exploration-trl eval --model {load_id} --benchmark {'countdown3' if countdown else 'gsm8k'} --n 16 "
        "--temperature 0.6\n"
        "```"
    )
    return f"{intro}\n\n```python\n{load}\n{gen}```\n\n{evaluate}"
