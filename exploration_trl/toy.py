"""Offline toy backbone: a tiny Qwen2 causal LM and a locally built tokenizer.

Tests, demos and notebooks need a real `transformers` model that trains in seconds on a CPU and never
touches the network. Everything here is built from a config; `save_toy` writes a directory that
`AutoModelForCausalLM.from_pretrained(dir)` / `AutoTokenizer.from_pretrained(dir)` load like any
Hub checkpoint, so the rest of the package treats toy and real models the same way.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

import torch

PAD, EOS, BOS, UNK = "<pad>", "<|endoftext|>", "<|bos|>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, BOS, UNK, IM_START, IM_END]

#: Characters every char-level toy tokenizer knows, so chat roles and plain English prompts encode.
DEFAULT_ALPHABET = string.ascii_letters + string.digits + " \n.,:;!?+-*/=()[]{}<>#$\\^_'\"%&|@~`"

#: Qwen2's pre-tokenizer split (as `Qwen2Tokenizer` applies it); the toy uses the same so a reload is identical.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ChatML, as Qwen2 uses, so conversational datasets render the same way they would with Qwen.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_symbols(text: str) -> list[str]:
    """The byte-level (GPT-2 / Qwen2) symbols of `text`'s UTF-8 bytes, e.g. ' ' -> 'Ġ', '\\n' -> 'Ċ'."""
    from tokenizers.pre_tokenizers import ByteLevel

    table = ByteLevel.alphabet()  # the 256 printable stand-ins, in no particular order
    byte_to_symbol = _byte_table(frozenset(table))
    return [byte_to_symbol[b] for b in text.encode("utf-8")]


def _byte_table(_alphabet) -> dict[int, str]:
    # The standard GPT-2 bytes-to-unicode map: printable bytes stand for themselves, the rest are shifted past 255.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def build_toy_tokenizer(
    alphabet: str | Sequence[str] = "",
    level: str = "char",
    vocab_size: int | None = None,
    chat_template: str = CHAT_TEMPLATE,
):
    """Build a `PreTrainedTokenizerFast` for `alphabet` with the `tokenizers` library.

    `level="char"`: every character of `DEFAULT_ALPHABET + alphabet` is a token (one per UTF-8 byte).
    `level="word"`: `alphabet` is a list (or whitespace-separated string) of words, split on whitespace.
    `vocab_size` pads the vocabulary with unused tokens, e.g. 32k to mimic a real LM head's cost.

    Both are byte-level BPE tokenizers like Qwen2's (words are built by merges), because `AutoTokenizer` loads a
    saved checkpoint with a `qwen2` config as `Qwen2Tokenizer`, which re-applies Qwen2's byte-level
    pre-tokenizer to `tokenizer.json`; anything else would lose spaces and newlines on reload.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    merges: list[tuple[str, str]] = []
    if level == "char":
        for ch in dict.fromkeys(DEFAULT_ALPHABET + "".join(alphabet)):
            for sym in _byte_symbols(ch):
                vocab.setdefault(sym, len(vocab))
    elif level == "word":
        words = alphabet.split() if isinstance(alphabet, str) else list(alphabet)
        vocab.setdefault(_byte_symbols(" ")[0], len(vocab))
        import regex  # \p{L} classes; a transformers dependency

        split = regex.compile(QWEN2_SPLIT_PATTERN)
        for word in dict.fromkeys(words):
            # Each piece Qwen2's split makes of the word becomes one token, built by left-to-right merges.
            for piece in split.findall(word):
                symbols = _byte_symbols(piece)
                for sym in symbols:
                    vocab.setdefault(sym, len(vocab))
                for i in range(1, len(symbols)):
                    left = "".join(symbols[:i])
                    merges.append((left, symbols[i]))
                    vocab.setdefault(left + symbols[i], len(vocab))
    else:
        raise ValueError(f"level must be 'char' or 'word', got {level!r}")
    if vocab_size is not None:
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(vocab)} tokens the alphabet needs")
        for i in range(len(vocab), vocab_size):
            vocab[f"<extra_{i}>"] = i

    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(dict.fromkeys(merges)), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_toy_model(
    tokenizer,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """A randomly initialised `Qwen2ForCausalLM` sized to `tokenizer`; deterministic for a given `seed`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    return model.to(dtype)


def build_toy(alphabet: str | Sequence[str] = "", level: str = "char", vocab_size: int | None = None, **model_kwargs):
    """Return `(model, tokenizer)` for `alphabet`; `model_kwargs` go to `build_toy_model`."""
    tokenizer = build_toy_tokenizer(alphabet, level=level, vocab_size=vocab_size)
    return build_toy_model(tokenizer, **model_kwargs), tokenizer


def save_toy(model, tokenizer, path: str | Path) -> Path:
    """Save both so `from_pretrained(path)` loads them offline, exactly like a Hub checkpoint."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_toy_checkpoint(path: str | Path, alphabet: str | Sequence[str] = "", **kwargs) -> Path:
    """Build and save a toy model + tokenizer to `path` (returns the path)."""
    model, tokenizer = build_toy(alphabet, **kwargs)
    return save_toy(model, tokenizer, path)
