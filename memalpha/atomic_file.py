"""One way every file of a run is written: atomically, so that a crash or a reader sees the old file
or the new one, never half of one.

The text goes to a temporary file in the target's folder, is flushed and synced, gets the usual
file mode (a temporary file starts as 0600) and is renamed over the target; whatever fails on the
way removes the temporary file and is raised. Checkpoints have their own writer
(``memalpha/train/checkpoint_io.py``), which also keeps the reason of a failed write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomically(path: str | os.PathLike, pieces: Iterable[str]) -> int:
    """Write the text ``pieces`` one after another to ``path``, atomically; returns how many pieces
    were written (a JSONL writer's line count)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            for piece in pieces:
                handle.write(piece)
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, path)
    except BaseException:  # removes the temporary file, then raises whatever it was
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return count


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
