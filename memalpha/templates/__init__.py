"""Prompt templates: every text memalpha sends to a model, held in one YAML file (``loader.py``,
``memalpha.yaml``, ``official.py``; docs/architecture.md). A leaf package: it imports nothing from memalpha.
"""
