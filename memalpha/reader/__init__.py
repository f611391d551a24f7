"""Question answering from memory: one :class:`Reader` interface, three backends.

* :class:`LocalReader` — a causal LM in this process (in training: the policy's base
  weights with LoRA adapters disabled).
* :class:`OpenAIReader` — any OpenAI-compatible chat-completions endpoint (e.g. vLLM
  serving Qwen3-32B, as the paper does).
* :class:`ExtractiveReader` — no model: the memory text retrieved for the question is the
  answer, so the score measures the memory alone.
"""
