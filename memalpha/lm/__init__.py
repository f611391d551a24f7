"""Causal-LM mechanics: the padded batch layout, the prefix cache, generation, chunked log-probs,
policy loading (fp32/bf16/NF4 with LoRA), the embedded default model and adapter export.

The lowest compute layer: it imports nothing of memalpha but :mod:`memalpha.seeding`.
"""
