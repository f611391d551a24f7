"""The GRPO algorithm: pure tensor math (advantages, the clipped loss with KL), the typed batch,
the micro-batched update step and its settings. Imports only :mod:`memalpha.seeding`.
"""
