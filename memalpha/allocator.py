"""PyTorch's CUDA allocator set to grow its segments instead of caching fixed blocks.

A GRPO step alternates phases whose tensors differ in size: the sampler's static cache and dense
weight copies, the policy's forward and backward, the reader. The caching allocator keeps the
freed blocks of one phase in fixed segments, and the next phase's larger tensors may find no
block that fits though the free bytes would (out of memory with gigabytes reserved but unused).
``expandable_segments:True`` lets a segment grow and shrink by mapping pages, so freed memory is
reusable whatever the sizes.

The allocator reads its settings from the environment when CUDA initialises, once per process,
so they must be set before the first CUDA call. :func:`prefer_expandable_segments` is called where
a process starts, before anything touches CUDA: the ``memalpha`` command's entry point
(``memalpha/cli.py``) and the GPU experiments' ``main``. Importing memalpha changes no environment
variable: a program that imports it as a library chooses its own allocator. A user who set an
allocator configuration (any of :data:`SETTINGS`) keeps it unchanged; one who wants the plain
caching allocator back sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False``.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SETTINGS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
"""The environment variables PyTorch reads its allocator configuration from (the CUDA one, the
device-generic one of recent releases, the ROCm one)."""

EXPANDABLE = "expandable_segments:True"
"""The configuration memalpha sets when the user has set none."""


def prefer_expandable_segments(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to :data:`EXPANDABLE` in ``environ`` (the process's
    environment when None) unless one of :data:`SETTINGS` is already set; True when it set it."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in SETTINGS):
        return False
    environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    return True
