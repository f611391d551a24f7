"""Time and peak memory of each phase of a GPU run, the peak sampled while the phase runs.

Two views of the device's memory, both reset at every phase's start:

- PyTorch's: ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` (exact peaks of
  its caching allocator, which misses what lives outside it, e.g. the paged optimiser's unified
  memory and the CUDA context);
- the driver's: ``torch.cuda.mem_get_info`` polled by a background thread (:class:`FreePoller`)
  every few milliseconds while the phase runs, keeping the least free memory seen, so the
  figure is the phase's peak use rather than what is left at its end.

On a CPU the same calls run and every CUDA figure is None, so tests exercise the bookkeeping
(a fake ``read`` function stands in for ``mem_get_info``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

GIB = 2**30

MemInfo = Callable[[], tuple[int, int]]
"""Returns ``(free, total)`` bytes, as ``torch.cuda.mem_get_info`` does."""


def _gib(n_bytes: int | None) -> float | None:
    return None if n_bytes is None else n_bytes / GIB


class FreePoller:
    """The least free device memory seen by ``read`` between :meth:`start` and :meth:`stop`,
    polled every ``interval_s`` on a daemon thread (and once at each end)."""

    def __init__(self, read: MemInfo, interval_s: float = 0.005) -> None:
        self.read = read
        self.interval_s = interval_s
        self.min_free: int | None = None
        self.total: int | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        free, total = self.read()
        self.total = total
        self.min_free = free if self.min_free is None else min(self.min_free, free)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self.min_free, self.total, self.samples = None, None, 0
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="mem-get-info-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()

    @property
    def peak_used(self) -> int | None:
        """``total - min_free``: the most device memory in use while polled (None before any sample)."""
        return None if self.min_free is None else self.total - self.min_free


class CudaView:
    """The CUDA calls a phase needs, or stand-ins that do nothing where there is no GPU."""

    def __init__(self, read: MemInfo | None = None) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.read = read if read is not None else (torch.cuda.mem_get_info if self.cuda else None)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peaks(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peaks(self) -> tuple[int | None, int | None]:
        if not self.cuda:
            return None, None
        return self.torch.cuda.max_memory_allocated(), self.torch.cuda.max_memory_reserved()


class PhaseClock:
    """Phases of a run, each with its seconds and its peaks.

    Either ``with clock.phase("reader"): ...``, or, where the code only says when a phase
    starts (a step's phase hook), :meth:`enter` (which ends the running phase) and :meth:`end`.
    Every phase run is one entry of :attr:`entries` (``step``: :meth:`set_step`'s when it started);
    :meth:`by_name` adds them up per name.
    """

    def __init__(self, view: CudaView | None = None, interval_s: float = 0.005) -> None:
        self.view = view if view is not None else CudaView()
        self.interval_s = interval_s
        self.entries: list[dict[str, Any]] = []
        self.step: int | None = None
        self.current: str | None = None
        self._start = 0.0
        self._step: int | None = None
        self._poller: FreePoller | None = None

    def set_step(self, step: int | None) -> None:
        self.step = step

    def enter(self, name: str) -> None:
        """End the running phase (if any) and start ``name``."""
        self.end()
        self.view.sync()
        self.view.reset_peaks()
        self._poller = FreePoller(self.view.read, self.interval_s) if self.view.read is not None else None
        if self._poller is not None:
            self._poller.start()
        self.current, self._start, self._step = name, time.perf_counter(), self.step

    def end(self, error: BaseException | None = None) -> dict[str, Any] | None:
        """End the running phase; returns its entry (None when none ran)."""
        if self.current is None:
            return None
        with suppress(Exception):  # a failed phase (out of memory, say) must still be recorded
            self.view.sync()
        seconds = time.perf_counter() - self._start
        allocated, reserved = self.view.peaks()
        if self._poller is not None:
            self._poller.stop()
        poller = self._poller
        entry = {
            "phase": self.current,
            "step": self._step,
            "seconds": seconds,
            "peak_allocated_gib": _gib(allocated),
            "peak_reserved_gib": _gib(reserved),
            "device_used_peak_gib": _gib(poller.peak_used) if poller else None,
            "device_total_gib": _gib(poller.total) if poller else None,
            "polls": poller.samples if poller else 0,
        }
        if error is not None:
            entry["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        self.entries.append(entry)
        self.current, self._poller = None, None
        return entry

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        except BaseException as error:
            self.end(error)
            raise
        self.end()

    def by_name(self, step: int | None | str = "all") -> dict[str, dict[str, Any]]:
        """Per phase name (in first-run order): runs, total seconds and the largest peaks, over
        the entries of ``step`` (all entries by default)."""
        out: dict[str, dict[str, Any]] = {}
        for entry in self.entries:
            if step != "all" and entry["step"] != step:
                continue
            row = out.setdefault(
                entry["phase"],
                {
                    "runs": 0,
                    "seconds": 0.0,
                    "peak_allocated_gib": None,
                    "peak_reserved_gib": None,
                    "device_used_peak_gib": None,
                },
            )
            row["runs"] += 1
            row["seconds"] += entry["seconds"]
            for key in ("peak_allocated_gib", "peak_reserved_gib", "device_used_peak_gib"):
                if entry[key] is not None:
                    row[key] = entry[key] if row[key] is None else max(row[key], entry[key])
        return out
