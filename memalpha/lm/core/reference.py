"""The reference policy of the KL term: the base model, or the adapter a run started from.

By default the reference is the base model, reached by switching the adapter off. After a cold
start the policy begins at an SFT adapter, and a KL term to the base would pull it back
towards the model that wrote no valid call; TRL and verl instead take the policy at the start of
RL as the reference. :func:`load_reference_adapter` loads the starting adapter a second time,
frozen, under :data:`REFERENCE_ADAPTER`, and :func:`reference_weights` runs a block with it
active (or, when there is none, with the adapter switched off). The base weights are shared:
the second adapter costs only its own LoRA matrices.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

REFERENCE_ADAPTER = "reference"


def has_reference_adapter(policy) -> bool:
    return REFERENCE_ADAPTER in getattr(policy, "peft_config", {})


@contextlib.contextmanager
def _same_adapter_and_trainables(policy) -> Iterator[None]:
    """Afterwards the active adapter and every parameter's ``requires_grad`` are as before
    (PEFT's ``load_adapter`` and ``set_adapter`` change which parameters train)."""
    trains = {name: p.requires_grad for name, p in policy.named_parameters()}
    active = policy.active_adapter
    try:
        yield
    finally:
        policy.set_adapter(active)
        for name, p in policy.named_parameters():
            p.requires_grad_(trains.get(name, False))


def load_reference_adapter(policy, adapter_path: str | os.PathLike) -> None:
    """Load ``adapter_path`` into ``policy`` as the frozen :data:`REFERENCE_ADAPTER`; the active
    adapter and which parameters train are left as they were."""
    if has_reference_adapter(policy):
        raise ValueError(f"the policy already holds a '{REFERENCE_ADAPTER}' adapter")
    with _same_adapter_and_trainables(policy):
        policy.load_adapter(str(adapter_path), adapter_name=REFERENCE_ADAPTER, is_trainable=False)


@contextlib.contextmanager
def reference_weights(policy) -> Iterator[None]:
    """Inside the block the policy computes the reference: the :data:`REFERENCE_ADAPTER` if one
    is loaded, else the base model (``disable_adapter``). Afterwards the previously active
    adapter is back and every parameter's ``requires_grad`` is what it was."""
    if not has_reference_adapter(policy):
        with policy.disable_adapter():
            yield
        return
    with _same_adapter_and_trainables(policy):
        policy.set_adapter(REFERENCE_ADAPTER, inference_mode=True)
        yield
