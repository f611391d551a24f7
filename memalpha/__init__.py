"""memalpha: train LLM agents to build their own long-term memory with GRPO."""

from memalpha.allocator import prefer_expandable_segments

__version__ = "0.1.0"

prefer_expandable_segments()  # before any CUDA call of this process: see memalpha.allocator
