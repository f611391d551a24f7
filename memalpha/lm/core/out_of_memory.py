"""Out-of-memory errors told apart from other failures, and the memory a process held when one came.

An allocation that fails on a GPU raises :class:`torch.OutOfMemoryError`; on the CPU PyTorch's
allocator raises a plain ``RuntimeError`` whose message says it could not allocate. Code that
keeps going after a failed item (a reader that fails one batch and answers the next) must let
these through: retrying the next batch at the same size fails the same way, and a question
answered by nobody would score 0 and become a reward (docs/metrics_and_rewards.md, "Faults").
"""

from __future__ import annotations

import resource
import sys

import torch

GIB = 1024**3

_CPU_ALLOCATION_FAILURES = ("can't allocate memory", "out of memory")
"""Phrases of the CPU allocator's failure messages (``DefaultCPUAllocator: can't allocate memory``)."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed for want of memory (GPU or CPU)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    if type(error) is RuntimeError:  # not a subclass: those are other failures that may quote the phrase
        message = str(error)
        return any(phrase in message for phrase in _CPU_ALLOCATION_FAILURES)
    return False


def memory_held(device: torch.device | str | None = None) -> str:
    """What the process holds now, in a few words: on a GPU PyTorch's allocated and reserved bytes
    and the device's total (from the driver); elsewhere the process's peak resident memory."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        allocated = torch.cuda.memory_allocated(device) / GIB
        reserved = torch.cuda.memory_reserved(device) / GIB
        free, total = torch.cuda.mem_get_info(device)
        name = torch.cuda.get_device_name(device)
        return (
            f"{allocated:.1f} GiB allocated, {reserved:.1f} GiB reserved by PyTorch, "
            f"{(total - free) / GIB:.1f} of {total / GIB:.1f} GiB in use on {name}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024
    return f"{peak_bytes / GIB:.1f} GiB peak resident memory"
