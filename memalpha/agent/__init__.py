"""The memory-agent environment: memorising prompts, the rollout (memorise, answer, reward),
the reward terms r1..r4 and per-source answer scoring.
"""
