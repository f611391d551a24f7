"""Memory tools (docs/method.md: memorising): schemas, the ``qwen`` and ``hermes`` call formats, the executor.

A rollout turn counts successful calls as results with status ``ok`` or ``skipped``;
each :class:`ParseError` counts as one failed call (see :mod:`memalpha.tools.executor`).
"""
