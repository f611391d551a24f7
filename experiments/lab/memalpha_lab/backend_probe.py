"""Which decoding backend sampled for the policy and for the reader, and whether it was captured.

What a run can know without changing the library:

- the choice: :func:`memalpha.lm.sampling.backend.announce` logs every
  :class:`~memalpha.lm.sampling.backend.BackendChoice` (``"<who> backend: <name> -- <reason>"``,
  once per model, caller and backend); :class:`BackendProbe` listens on that logger;
- the capture: the ``cuda-graph`` backend's :func:`memalpha.lm.sampling.graph_decode.decode_in_graph`
  reports ``captured`` in its ``stats``; the probe wraps it for as long as it is installed and
  counts captured and eager calls per phase (``phase`` is a function naming the running one).

A caller that picks a backend itself (a benchmark calling ``generate``) can :meth:`note` the
choice directly. In the summary, each caller (``sampling``, ``reader``) has the backend it
announced (or, for the reader when the library announced none for it, the one its phase's
decode calls show; the policy's sampling owns the phases no other caller is named after) and
``captured``: True/False for ``cuda-graph`` (all/any calls captured),
False for the loops that never capture, None when unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Self

LOGGER = "memalpha.lm.sampling.backend"
NEVER_CAPTURED = ("cpu-fused", "hf-generate")


class _Listener(logging.Handler):
    def __init__(self, probe: BackendProbe) -> None:
        super().__init__(level=logging.INFO)
        self.probe = probe

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 3 and str(record.msg).startswith("%s backend:"):
            who, name, reason = (str(a) for a in args)
            self.probe.note(who, name, reason)


class BackendProbe:
    """Listens for backend choices and graph captures while installed (``with BackendProbe(): ...``)."""

    def __init__(self, phase: Callable[[], str | None] = lambda: None) -> None:
        self.phase = phase
        self.choices: list[dict[str, Any]] = []
        self.decodes: dict[str, dict[str, int]] = {}
        self._handler = _Listener(self)
        self._level: int | None = None
        self._original = None

    def note(self, who: str, name: str, reason: str) -> None:
        """Record a backend choice (the library's announcement, or the caller's own)."""
        self.choices.append({"who": who, "backend": name, "reason": reason, "phase": self.phase()})

    def _wrap(self, decode):
        def observed(*args, **kwargs):
            stats = kwargs.get("stats")
            if stats is None:
                stats = kwargs["stats"] = {}
            out = decode(*args, **kwargs)
            row = self.decodes.setdefault(self.phase() or "none", {"calls": 0, "captured": 0})
            row["calls"] += 1
            row["captured"] += bool(stats.get("captured"))
            return out

        observed.__wrapped__ = decode
        return observed

    def __enter__(self) -> Self:
        logger = logging.getLogger(LOGGER)
        self._level = logger.level
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
        logger.addHandler(self._handler)
        try:
            from memalpha.lm.sampling import graph_decode

            self._original = graph_decode.decode_in_graph
            graph_decode.decode_in_graph = self._wrap(self._original)
        except (ImportError, AttributeError):
            self._original = None
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(LOGGER)
        logger.removeHandler(self._handler)
        if self._level is not None:
            logger.setLevel(self._level)
        if self._original is not None:
            from memalpha.lm.sampling import graph_decode

            graph_decode.decode_in_graph = self._original
            self._original = None

    def _captured(self, backend: str | None, phases: list[str]) -> bool | None:
        if backend in NEVER_CAPTURED:
            return False
        if backend != "cuda-graph":
            return None
        rows = [self.decodes[p] for p in phases if p in self.decodes]
        calls = sum(r["calls"] for r in rows)
        if calls == 0:
            return None
        return sum(r["captured"] for r in rows) == calls

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per caller (``sampling`` and ``reader`` at least): ``backend``, ``reason``, ``captured``,
        ``decode_calls`` (graph decode calls seen in its phases) and ``source``."""
        out: dict[str, dict[str, Any]] = {}
        callers = list(dict.fromkeys(["sampling", "reader", *(c["who"] for c in self.choices)]))
        for who in callers:
            mine = [c for c in self.choices if c["who"] == who]
            # the policy's sampling: every phase but the other callers' (a bench calls it "generate")
            phases = [who] if who != "sampling" else [p for p in self.decodes if p not in callers[1:]]
            graph_calls = sum(self.decodes.get(p, {}).get("calls", 0) for p in phases)
            if mine:
                last = mine[-1]
                backend, reason, source = last["backend"], last["reason"], "announced"
            elif graph_calls:
                backend, reason, source = "cuda-graph", "graph decode calls seen in its phase", "observed"
            else:
                backend = reason = source = None
            out[who] = {
                "backend": backend,
                "reason": reason,
                "captured": self._captured(backend, phases),
                "decode_calls": graph_calls,
                "source": source,
                "choices": sorted({c["backend"] for c in mine}),
            }
        return out
