"""Adapters that let other frameworks use memalpha's task: ``trl_environment`` (TRL's agent trainer)."""
