"""Which prompt tokens belong to the user's message, for a prompt rendered with a chat template.

A chat prompt's tokens also hold the template's role markers and any system message. ProGRPO's prompt confidence
can be restricted to the user's own words (`progrpo_prompt_tokens: user`): the prompt is rendered as TRL renders it,
tokenized with character offsets, and a token counts as the user's when its characters lie inside the last user
message's content. If that rendering does not reproduce TRL's token ids exactly (an unusual template or tokenizer),
the row falls back to every prompt token and the caller is told, so nothing changes silently.
"""

from __future__ import annotations

import torch


def _text_content(content) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: keep the text parts, in order
        return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
    return None


def user_token_mask(
    prompts: list, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tokenizer, **template_kwargs
) -> tuple[torch.Tensor, int]:
    """`(mask, fallbacks)`: bool `(B, P)`, True on the tokens of each row's last user message (left-padded like
    `prompt_ids`), and the number of rows that fell back to all their prompt tokens."""
    mask = prompt_mask.bool().clone()
    fallbacks = 0
    for row, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue  # no chat template: every prompt token is the user's text
        users = [m for m in prompt if m.get("role") == "user"]
        content = _text_content(users[-1]["content"]) if users else None
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **template_kwargs)
        start = text.rfind(content) if content else -1
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = prompt_ids[row][prompt_mask[row].bool()].tolist()
        if start < 0 or encoded["input_ids"] != ids:
            fallbacks += 1
            continue
        end = start + len(content)
        inside = torch.tensor([s >= start and e <= end and e > s for s, e in encoded["offset_mapping"]],
                              dtype=torch.bool, device=mask.device)
        mask[row, mask.size(1) - len(ids):] = inside
    return mask, fallbacks
