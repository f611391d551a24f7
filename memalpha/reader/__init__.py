"""Question answering from memory: one :class:`Reader` interface, two backends.

* :class:`LocalReader` — a causal LM in this process (in training: the policy's base
  weights with LoRA adapters disabled).
* :class:`OpenAIReader` — any OpenAI-compatible chat-completions endpoint (e.g. vLLM
  serving Qwen3-32B, as the paper does).
"""
