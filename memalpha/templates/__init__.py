"""Prompt templates: every text memalpha sends to a model, held in one YAML file.

``loader.py`` (:class:`~memalpha.templates.loader.PromptTemplates`, ``load_templates``: the
checked file), ``memalpha.yaml`` (memalpha's own texts, the default) and ``official.py``
(``memalpha prompts import``: a template file from a local clone of the official Mem-α code).
A leaf package: it imports nothing from memalpha, so every layer can use it.
"""
