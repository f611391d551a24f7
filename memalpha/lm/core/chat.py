"""Chat messages to the token ids a policy generates from: its chat template with the generation prompt.

Rollouts, the single-turn trainer and supervised fine-tuning template their prompts here, so a
demonstration's prompt is token for token the prompt a rollout builds.
"""

from __future__ import annotations

from typing import Any


def chat_prompt_ids(
    tokenizer, messages: list[dict[str, str]], chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """``messages`` through ``tokenizer``'s chat template with the generation prompt, as token ids."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
    )
    if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
