"""Export a trained adapter as a standard PEFT folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from memalpha.lm.core.reference import has_reference_adapter


def export_adapter(policy, tokenizer, target: str | os.PathLike) -> Path:
    """Save the adapter (and tokenizer) so ``PeftModel.from_pretrained`` loads it without memalpha.

    Written into a staging folder beside ``target`` and renamed into place, so a crash
    never leaves a half-written adapter where a complete one was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        if has_reference_adapter(policy):  # the frozen KL reference is not part of the result
            policy.save_pretrained(staging, selected_adapters=[policy.active_adapter])
        else:
            policy.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            os.replace(target, backup)
            os.replace(staging, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
