"""The ``memalpha data`` commands, all in one folder: ``data.py`` (the ``memalpha data`` parser:
``synth``, ``inspect``, ``convert``, and the router to the two below), ``demos.py`` (``data demos``:
oracle demonstrations for a training config) and ``distill.py`` (``data distill``: demonstrations
replayed from recorded trajectories).

Its own layer above ``train``: ``demos`` and ``distill`` need the agent (the oracle, the replay) and
the training config's data module, which ``data/`` (importing only ``lm``) may not import; the
``synth``/``inspect``/``convert`` path still starts without importing Lightning, as ``data.py``
imports the other two only when they run.
"""
