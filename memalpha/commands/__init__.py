"""The ``memalpha data`` commands: ``data.py`` (``synth``, ``inspect``, ``convert`` and the router),
``demos.py`` and ``distill.py``; docs/architecture.md says why they are a layer above ``train``.
"""
