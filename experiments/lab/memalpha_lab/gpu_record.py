"""The record every GPU result carries, so that a committed figure can be trusted.

One :class:`GpuRecord` per run, started before anything is measured:

- ``tree``: the clean commit it ran (:mod:`tree_state`; the run refuses a tree with
  uncommitted changes with one line, unless ``--allow-dirty`` was given, which is recorded);
- ``environment``: the GPU's name and memory, torch and its CUDA, bitsandbytes, transformers;
- ``backends``: the decoding backend of the policy's sampling and of the reader, and whether each
  was captured as a CUDA graph (:mod:`backend_probe`);
- ``phases``: every phase's seconds and peak memory, PyTorch's and the driver's, sampled while
  it ran (:mod:`phase_clock`).

On a CPU everything runs and the CUDA fields are None. Use::

    parser = argparse.ArgumentParser(); add_arguments(parser); args = parser.parse_args()
    record = GpuRecord.start(allow_dirty=args.allow_dirty)   # DirtyTree: one line, exit
    with record:                                               # the backend probe listens
        with record.clock.phase("load"): ...
    write_json({**report, "record": record.as_dict()}, out)
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path
from typing import Any, Self

from memalpha_lab.backend_probe import BackendProbe
from memalpha_lab.phase_clock import CudaView, MemInfo, PhaseClock
from memalpha_lab.tree_state import REPO_ROOT, checked_state


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--allow-dirty``: run on a tree with uncommitted changes (recorded in the result)."""
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although the tree has uncommitted changes (recorded; the result is not tied to a commit)",
    )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """The GPU (None fields on a CPU) and the versions that its figures depend on."""
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpu": None,
        "gpu_memory_gib": None,
        "compute_capability": None,
        "cudnn": None,
        "bitsandbytes": _version("bitsandbytes"),
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "lightning": _version("lightning"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=props.total_memory / 2**30,
            compute_capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
        )
    return info


class GpuRecord:
    """Tree, environment, backends and phases of one run (see the module's docstring)."""

    def __init__(self, tree: dict[str, Any], read: MemInfo | None = None, interval_s: float = 0.005) -> None:
        self.tree = tree
        self.environment = environment()
        self.clock = PhaseClock(CudaView(read), interval_s)
        self.probe = BackendProbe(lambda: self.clock.current)

    @classmethod
    def start(cls, allow_dirty: bool = False, repo: Path = REPO_ROOT, **kwargs: Any) -> GpuRecord:
        """Check the tree of ``repo`` (raises :class:`tree_state.DirtyTree`, one line, when it must
        not run)."""
        return cls(checked_state(allow_dirty, repo), **kwargs)

    def __enter__(self) -> Self:
        self.probe.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clock.end()
        self.probe.__exit__(*exc)

    def note_backend(self, who: str, choice: Any) -> None:
        """Record a :class:`~memalpha.lm.sampling.backend.BackendChoice` the caller made itself."""
        self.probe.note(who, choice.name, choice.reason)

    def as_dict(self) -> dict[str, Any]:
        """The ``record`` block of a result file."""
        return {
            "gpu": self.environment["gpu"],
            "commit": self.tree.get("commit"),
            "dirty": self.tree.get("dirty"),
            "allow_dirty": self.tree.get("allow_dirty", False),
            "tree": self.tree,
            "environment": self.environment,
            "backends": self.probe.summary(),
            "phases": self.clock.entries,
            "phase_totals": self.clock.by_name(),
        }
