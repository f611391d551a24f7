"""The CUDA allocator's expandable segments: set where the ``memalpha`` command starts when the user
set no allocator configuration, left alone when they did (issue 37, item 3); importing memalpha sets
nothing (issue 45, item 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memalpha.allocator import EXPANDABLE, SETTINGS, prefer_expandable_segments


def test_set_when_absent():
    environ = {"PATH": "/bin"}
    assert prefer_expandable_segments(environ) is True
    assert environ == {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE}


@pytest.mark.parametrize("name", SETTINGS)
def test_left_alone_when_the_user_set_any_allocator_configuration(name):
    environ = {name: "max_split_size_mb:128"}
    assert prefer_expandable_segments(environ) is False
    assert environ == {name: "max_split_size_mb:128"}


def allocator_setting_after(script: str, **preset: str) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` in a fresh interpreter after ``script``, its environment cleared
    of allocator settings but ``preset``; and whether CUDA was initialised by then (it must not be:
    the allocator reads the setting when CUDA initialises)."""
    env = {key: value for key, value in os.environ.items() if key not in SETTINGS} | preset
    report = ("import os, sys; torch = sys.modules.get('torch');"
              "print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'), bool(torch and torch.cuda.is_initialized()))")
    done = subprocess.run([sys.executable, "-c", f"{script}\n{report}"], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def test_importing_memalpha_changes_no_environment_variable():
    script = ("import os; before = dict(os.environ); import memalpha, memalpha.cli;"
              "assert dict(os.environ) == before")
    assert allocator_setting_after(script) == "None False"


ENTRY = "import memalpha.cli as cli; cli.run = lambda argv: None; cli.main([])"
"""The console entry point with the command itself replaced: what it does before any command runs."""


def test_the_command_sets_it_before_cuda_initialises_and_keeps_the_users():
    assert allocator_setting_after(ENTRY) == f"{EXPANDABLE} False"
    assert allocator_setting_after(ENTRY, PYTORCH_CUDA_ALLOC_CONF="backend:native") == "backend:native False"
    assert allocator_setting_after(ENTRY, PYTORCH_ALLOC_CONF="backend:native") == "None False"



FREED_PROBE = """
import ctypes
from memalpha.lm.core.freed_memory import release_freed_memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: the blocks come from the heap, as once glibc has raised it
libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: free trims nothing, as when the top of the heap is in use

def rss():
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * 4096

blocks = [libc.malloc(1 << 20) for _ in range(256)]  # 256 MiB of heap, touched so it is resident
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
keeper = libc.malloc(64)  # a small live block above them
for block in blocks:
    libc.free(block)
held = rss()
print(release_freed_memory(), held - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_freed_host_memory_goes_back_to_the_system():
    """A large buffer freed below a small live one stays in glibc's heap until it is trimmed: the RSS of
    a process that samples chunk after chunk grew so (docs/results.md, bench_length). In a process of its
    own, whose allocator settings the probe changes."""
    done = subprocess.run([sys.executable, "-c", FREED_PROBE], capture_output=True, text=True, check=True)
    trimmed, returned = done.stdout.split()
    assert trimmed == "True" and int(returned) > 200 * 2**20  # most of the 256 MiB went back
