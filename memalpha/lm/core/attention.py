"""Attention that never builds a ``[batch, heads, queries, keys]`` score tensor.

``F.scaled_dot_product_attention`` picks one of several kernels. The fused ones (flash,
memory-efficient, cuDNN, the CPU flash kernel) stream the keys and never hold the scores; the
math kernel computes ``softmax(q k^T) v`` as written, in float32, for every head at once. On a
GPU the fused kernels each refuse some inputs, and when all of them do, SDPA falls back to the
math kernel without a word: the QLoRA policy's float32 queries (``prepare_model_for_kbit_training``
keeps the norms in float32) with grouped key/value heads are refused by flash and by the
memory-efficient kernel alike (docs/real_model.md).

:func:`bounded_attention` asks PyTorch which kernel SDPA would run (``torch._fused_sdp_choice``,
the function SDPA itself dispatches on) and, while the answer is the math kernel, changes the
inputs it can without changing the result: first the key/value heads are repeated to the query
heads (which the memory-efficient kernel takes, in float32 too), and if no fused kernel takes
even that, the queries run in blocks small enough that one block's scores fit
``attention_score_budget`` bytes (under autograd each block is checkpointed, so its
probabilities are not kept for the backward either). The values are SDPA's in every case.

The function is registered with transformers' attention and mask interfaces under
:data:`IMPLEMENTATION`, so :func:`use_bounded_attention` switches a loaded model to it and every
pass through the model's layers -- prefill, decoding, the policy and reference log-probs, the
reader -- goes through it, with the masks transformers builds for ``sdpa``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.utils.checkpoint import checkpoint

IMPLEMENTATION = "memalpha_sdpa"
"""The name memalpha's attention is registered under (``config._attn_implementation``)."""

MASK_IMPLEMENTATIONS = ("sdpa", "eager", IMPLEMENTATION)
"""Attention implementations that apply a prepared 4-D additive mask as it is."""

DEFAULT_SCORE_BUDGET = 256 * 2**20
"""Bytes one block of float32 scores may take when only the math kernel runs (256 MiB)."""

_BUDGET_ATTRIBUTE = "memalpha_attention_score_budget"
_SWITCHABLE = ("sdpa", IMPLEMENTATION)


def sdpa_kernel_choice(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> SDPBackend:
    """The kernel ``F.scaled_dot_product_attention`` would run on these inputs (under the
    backends enabled now, e.g. by ``torch.nn.attention.sdpa_kernel``)."""
    choice = torch._fused_sdp_choice(
        query, key, value, mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return SDPBackend(choice)


def repeat_heads(states: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, KV, S, D]`` key or value heads repeated to ``[B, KV * groups, S, D]`` (query head
    ``h`` reads key/value head ``h // groups``, as grouped-query attention does)."""
    if groups == 1:
        return states
    rows, heads, length, width = states.shape
    return (
        states[:, :, None]
        .expand(rows, heads, groups, length, width)
        .reshape(rows, heads * groups, length, width)
    )


def query_block_rows(rows: int, heads: int, keys: int, budget: int) -> int:
    """How many query positions one block may hold so that its float32 scores
    (``rows * heads * block * keys * 4`` bytes) fit ``budget`` bytes; at least 1."""
    per_query = rows * heads * keys * 4
    return max(1, budget // max(per_query, 1))


def causal_block_mask(start: int, stop: int, keys: int, device: torch.device) -> torch.Tensor:
    """``[stop - start, keys]`` boolean mask of SDPA's ``is_causal`` rule (top-left aligned:
    query ``i`` sees keys ``0..i``) for the query rows ``start..stop - 1``."""
    queries = torch.arange(start, stop, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= queries


def _block(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    block: int,
) -> torch.Tensor:
    """SDPA over ``block`` query positions at a time (key/value heads already repeated), each
    block checkpointed when autograd records, so no more than one block's scores exist."""
    outputs = []
    length, keys = query.shape[2], key.shape[2]
    record = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    for start in range(0, length, block):
        stop = min(start + block, length)
        part = mask[..., start:stop, :] if mask is not None and mask.shape[-2] > 1 else mask
        if is_causal:
            causal = causal_block_mask(start, stop, keys, query.device)
            if part is None:
                part = causal
            elif part.dtype == torch.bool:
                part = part & causal
            else:
                part = part.masked_fill(~causal, float("-inf"))
        rows = query[:, :, start:stop]
        if record:
            outputs.append(checkpoint(_block, rows, key, value, part, scale, use_reentrant=False))
        else:
            outputs.append(_block(rows, key, value, part, scale))
    return torch.cat(outputs, dim=2)


def bounded_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    score_budget: int = DEFAULT_SCORE_BUDGET,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(query, key, value, mask, is_causal, scale)`` for
    ``[B, H, T, D]`` queries over ``[B, KV, S, D]`` keys and values (``H`` a multiple of ``KV``),
    run so that no ``[B, H, T, S]`` score tensor is built: a fused kernel where one takes the
    inputs (after repeating the key/value heads if that is what it needs), else query blocks of
    at most ``score_budget`` bytes of scores."""
    groups = query.shape[1] // key.shape[1]
    grouped = groups > 1
    if grouped and query.shape[2] == 1 and (mask is None or mask.shape[1] == 1):
        return _one_query_per_group(query, key, value, mask, scale, score_budget)
    if torch.compiler.is_compiling():  # a compiled decoding step (graph_decode's compile_backend)
        return _traced_attention(query, key, value, mask, is_causal, scale, grouped, score_budget)
    if sdpa_kernel_choice(query, key, value, mask, is_causal, scale, grouped) != SDPBackend.MATH:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=grouped
        )
    key, value = repeat_heads(key, groups), repeat_heads(value, groups)
    rows, heads, length = query.shape[:3]
    block = query_block_rows(rows, heads, key.shape[2], score_budget)
    fused = grouped and (
        sdpa_kernel_choice(query, key, value, mask, is_causal, scale, False) != SDPBackend.MATH
    )
    if fused or block >= length:  # a fused kernel takes the repeated heads, or the scores fit the budget
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale
        )
    return blocked_attention(query, key, value, mask, is_causal, scale, block)


def _traced_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
    scale: float | None, grouped: bool, score_budget: int,
) -> torch.Tensor:
    """SDPA as ``torch.compile`` traces it: the kernel choice is a host query a trace cannot hold,
    so none is asked; that is safe while even the math kernel's scores would fit ``score_budget``,
    as a decoding step's few queries do, and an error otherwise (compile prefills are not)."""
    rows, heads, length = query.shape[:3]
    if rows * heads * length * key.shape[2] * 4 > score_budget:
        raise ValueError(
            f"a compiled attention of {length} queries over {key.shape[2]} keys could build scores over the"
            f" {score_budget}-byte budget; compile decoding steps only"
        )
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=grouped
    )


def _one_query_per_group(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
    score_budget: int,
) -> torch.Tensor:
    """A decoding step's attention (one query per head) with the query heads of each key/value
    head laid out as that head's queries: ``[B, H, 1, D]`` as ``[B, KV, H / KV, D]``, so no key or
    value is repeated (a copy of the whole cache per layer per token); a mask shared by the heads
    broadcasts over the new query axis."""
    rows, heads, _, width = query.shape
    packed = query.reshape(rows, key.shape[1], heads // key.shape[1], width)
    out = bounded_attention(packed, key, value, mask, scale=scale, score_budget=score_budget)
    return out.reshape(rows, heads, 1, value.shape[-1])


def _attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature around :func:`bounded_attention` (the rules
    of its ``sdpa`` function for ``is_causal``; no dropout, softcapping or position bias)."""
    if dropout:
        raise ValueError(f"{IMPLEMENTATION} attention takes no attention dropout, got {dropout}")
    for unsupported in ("softcap", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(
                f"{IMPLEMENTATION} attention does not take {unsupported}; load the model with sdpa"
            )
    length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = length > 1 and attention_mask is None and causal
    if causal and key.shape[2] > length:  # a prefill into a preallocated cache: the rest is empty
        key, value = key[:, :, :length], value[:, :, :length]
    budget = getattr(getattr(module, "config", None), _BUDGET_ATTRIBUTE, DEFAULT_SCORE_BUDGET)
    output = bounded_attention(
        query, key, value, attention_mask, is_causal=causal, scale=scaling,
        score_budget=budget,
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register :data:`IMPLEMENTATION` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def use_bounded_attention(model, score_budget: int = DEFAULT_SCORE_BUDGET) -> bool:
    """Switch ``model`` (a transformers model, or a PEFT model around one) from ``sdpa`` to
    :data:`IMPLEMENTATION`, with ``score_budget`` bytes for one block of math-kernel scores.
    Returns whether it runs memalpha's attention now; models on other implementations (eager,
    FlashAttention-2, flex) are left as they are."""
    if score_budget < 1:
        raise ValueError(f"score_budget must be >= 1 byte, got {score_budget}")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in _SWITCHABLE:
        return False
    register()
    if config._attn_implementation != IMPLEMENTATION:
        base.set_attn_implementation(IMPLEMENTATION)
    for module in base.modules():
        module_config = getattr(module, "config", None)
        if module_config is not None and hasattr(module_config, "_attn_implementation"):
            setattr(module_config, _BUDGET_ATTRIBUTE, score_budget)
    return base.config._attn_implementation == IMPLEMENTATION
