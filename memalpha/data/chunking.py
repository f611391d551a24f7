"""Cutting one long text into chunks of about ``chunk_tokens`` tokens of a given tokenizer.

The cuts are made in the *original* text at token boundaries found through the fast
tokenizer's offset mapping, so nothing is re-decoded: ``"".join(chunks) == text``
always holds, and no token (not even a multi-byte character that the byte-level BPE
spreads over several tokens) is split between two chunks.
"""

from __future__ import annotations

import itertools
from typing import Any

#: Official chunk sizes of MemoryAgentBench in Mem-α (tokens of the policy's tokenizer).
DEFAULT_CHUNK_TOKENS = 2048
TEST_TIME_LEARNING_CHUNK_TOKENS = 1024


def token_offsets(text: str, tokenizer: Any) -> list[tuple[int, int]]:
    """Character span ``(start, end)`` of every token of ``text`` (no special tokens)."""
    if not getattr(tokenizer, "is_fast", False):  # slow (Python) tokenizers cannot map offsets
        raise TypeError(
            f"token chunking needs a fast tokenizer with offset mapping; {type(tokenizer).__name__} has none"
        )
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [(int(a), int(b)) for a, b in offsets]


def count_tokens(text: str, tokenizer: Any | None) -> int:
    """Number of tokens of ``text`` (no special tokens); white-space words when ``tokenizer`` is None."""
    if tokenizer is None:
        return len(text.split())
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def chunk_by_tokens(text: str, tokenizer: Any, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> list[str]:
    """Split ``text`` into consecutive pieces of at most about ``chunk_tokens`` tokens each.

    Each cut falls at the start of a token whose span does not overlap the previous
    token's, so the pieces concatenate back to ``text`` exactly. Re-tokenising a piece
    on its own may differ from its share of the full tokenisation by a token at the
    edges (BPE merges across the cut), nothing more. An empty text gives no chunk.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if not text:
        return []
    offsets = token_offsets(text, tokenizer)
    if len(offsets) <= chunk_tokens:
        return [text]
    cuts = [0]

    def clean(k: int) -> bool:  # token k starts where the previous one ended (or later), after the last cut
        return offsets[k][0] >= offsets[k - 1][1] and offsets[k][0] > cuts[-1]

    last_token = 0
    target = chunk_tokens
    while target < len(offsets):
        k = target
        while k > last_token + 1 and not clean(k):  # step back to a clean boundary inside the window
            k -= 1
        if not clean(k):  # none in the window (one long multi-token character): take the next clean one
            k = target + 1
            while k < len(offsets) and not clean(k):
                k += 1
            if k >= len(offsets):
                break
        cuts.append(offsets[k][0])
        last_token = k
        target = k + chunk_tokens
    cuts.append(len(text))
    return [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]
