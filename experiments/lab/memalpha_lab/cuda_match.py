"""One line: does the machine's CUDA (``torch.version.cuda``) have a library in the packed bitsandbytes?

bitsandbytes ships one native library per CUDA version (``libbitsandbytes_cuda130.so`` for
13.0) and loads the one named after torch's CUDA (or ``BNB_CUDA_VERSION``). ``experiments/
gpu_pack.sh`` keeps only the CUDA 13 ones, so a machine whose torch is built for another CUDA
would fail at the first 4-bit layer, minutes into a run; ``experiments/gpu/gpu_check.sh`` prints this
line first. The package is found without importing it (importing it on a mismatch prints pages).

    python -m memalpha_lab.cuda_match   # exit 0 on a match, 1 on a mismatch, 2 without CUDA/bitsandbytes
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path


def library_tags(folder: Path) -> list[str]:
    """The CUDA tags (``"130"``) of the ``libbitsandbytes_cuda*.so`` files in ``folder``."""
    tags = (
        re.fullmatch(r"libbitsandbytes_cuda(\d+)\.so", p.name)
        for p in folder.glob("libbitsandbytes_cuda*.so")
    )
    return sorted(m.group(1) for m in tags if m)


def bitsandbytes_folder() -> Path | None:
    """Where ``import bitsandbytes`` would load from (None when it is not installed)."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def verdict(torch_cuda: str | None, folder: Path | None, override: str | None = None) -> tuple[int, str]:
    """``(exit code, one line)`` for torch's CUDA version against the libraries in ``folder``."""
    if torch_cuda is None:
        return 2, "cuda check: torch has no CUDA build here (torch.version.cuda is None): nothing to match"
    if folder is None:
        return (
            2,
            (
                f"cuda check: torch CUDA {torch_cuda}, but bitsandbytes is not installed "
                "(bash experiments/gpu/gpu_pack.sh)"
            ),
        )
    wanted = override or torch_cuda.replace(".", "")
    tags = library_tags(folder)
    source = f"BNB_CUDA_VERSION={override}" if override else f"torch CUDA {torch_cuda}"
    if wanted in tags:
        return 0, f"cuda check: match: {source} -> libbitsandbytes_cuda{wanted}.so in {folder}"
    return 1, (
        f"cuda check: MISMATCH: {source} needs libbitsandbytes_cuda{wanted}.so; {folder} has only "
        f"{', '.join('cuda' + t for t in tags) or 'no CUDA libraries'} (repack for this CUDA in gpu_pack.sh)"
    )


def main() -> int:
    import torch

    code, line = verdict(
        torch.version.cuda, bitsandbytes_folder(), os.environ.get("BNB_CUDA_VERSION") or None
    )
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
