"""The agent's memory: core paragraph, semantic and episodic entry lists (docs/method.md: the memory)."""
