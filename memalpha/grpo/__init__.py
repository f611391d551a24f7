"""The GRPO algorithm: pure tensor math (advantages, the clipped loss with KL), the typed batch,
the micro-batched update step, its settings, and the single-turn trainer.

Imports only :mod:`memalpha.lm` (and :mod:`memalpha.seeding`).
"""
