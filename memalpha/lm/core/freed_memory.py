"""Give the host memory a generation call freed back to the system.

Each sampling call builds large short-lived buffers: the fused step's folded weight copies, the
prompt caches, the logits. glibc's allocator keeps what they free in its heap when later, smaller
allocations sit above it, so a process that samples chunk after chunk grows by the buffers of every
call although nothing is kept (measured: about 200 MB a chunk at 4 rows, without bound; docs/results.md,
"bench_length"). :func:`release_freed_memory` asks glibc to return the free pages (``malloc_trim``),
which costs milliseconds; :func:`memalpha.lm.sampling.generation.generate` calls it when a call ends.
Where the C library is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
    except OSError:  # no loadable C library by that name: nothing to trim with
        return None
    trim = getattr(library, "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system; whether the C library could (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
