"""The offline toy backbone saves to a folder that loads like a Hub checkpoint, tokenizer included."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from exploration_trl.toy import build_toy, build_toy_tokenizer, save_toy

TEXT = "nums: 8 4 1\ntarget: 13\n<answer>(8+4)*1</answer>"


@pytest.mark.parametrize("level,alphabet,text", [
    ("char", "", TEXT),
    ("word", ["<q>", "A", "B", "C", "D", "foo"], "<q> A B foo D"),
])
def test_saved_toy_reloads_identically_with_auto_classes(tmp_path, level, alphabet, text):
    model, tok = build_toy(alphabet, level=level)
    save_toy(model, tok, tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)  # transformers picks Qwen2Tokenizer for a qwen2 config
    ids = tok(text)["input_ids"]
    assert tok2(text)["input_ids"] == ids
    assert tok2.decode(ids) == text  # spaces and newlines survive
    x = torch.tensor([ids])
    torch.testing.assert_close(model2(x).logits, model(x).logits)


def test_char_tokenizer_ids_and_chat_template():
    tok = build_toy_tokenizer()
    # Specials take ids 0-5; the default alphabet starts at 6 with 'a'.
    assert tok.convert_tokens_to_ids(["<pad>", "<|endoftext|>", "a"]) == [0, 1, 6]
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert len(tok("hello 12+3")["input_ids"]) == 10  # one token per character
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_vocab_size_padding_and_error():
    assert len(build_toy_tokenizer(vocab_size=512)) == 512
    with pytest.raises(ValueError, match="vocab_size=10 is smaller than the 102 tokens"):
        build_toy_tokenizer(vocab_size=10)
