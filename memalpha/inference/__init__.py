"""The trained agent in use from Python: load it, give it text and a memory, ask it questions."""
