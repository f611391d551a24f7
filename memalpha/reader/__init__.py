"""Question answering from memory: one :class:`Reader` interface, two backends.

* :class:`LocalReader` — a causal LM in this process (in training: the policy's base
  weights with LoRA adapters disabled).
* :class:`OpenAIReader` — any OpenAI-compatible chat-completions endpoint (e.g. vLLM
  serving Qwen3-32B, as the paper does).
"""

from memalpha.reader.base import Conversation, Reader, ReaderAnswer
from memalpha.reader.local import LocalGeneration, LocalReader, base_weights, chat_prompt_text
from memalpha.reader.openai_compat import OpenAIReader

__all__ = [
    "Conversation",
    "LocalGeneration",
    "LocalReader",
    "OpenAIReader",
    "Reader",
    "ReaderAnswer",
    "base_weights",
    "chat_prompt_text",
]
