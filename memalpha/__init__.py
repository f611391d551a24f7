"""memalpha: train LLM agents to build their own long-term memory with GRPO."""

__version__ = "0.1.0"
