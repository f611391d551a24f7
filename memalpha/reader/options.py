"""The reader's nested settings groups: ``reader.retrieval.*`` (what goes into the answer prompt)
and ``reader.openai.*`` (how the ``openai`` and ``engine`` readers reach their endpoint).

Both are typed values checked in ``__post_init__`` (the messages name the ``reader.<group>.<key>``
option); :class:`~memalpha.reader.base.Reader` and its backends take them whole instead of one
keyword per setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args
from urllib.parse import urlparse

from memalpha.reader.retrieval import (
    BM25_VARIANTS,
    DEFAULT_SYSTEM_PROMPT_LIMIT,
    DEFAULT_TOP_K,
    K_RULES,
    RETRIEVAL_UNITS,
    BM25Variant,
    KReduction,
    RetrievalUnit,
)

BM25Query = Literal["question", "with_instruction"]
BM25_QUERIES: tuple[str, ...] = get_args(BM25Query)
"""What BM25 is queried with: the bare question, or the source's instruction, an empty line and the
question."""


@dataclass
class RetrievalSettings:
    """Which memory entries reach the answer prompt, and how many.

    Args:
        top_k_entries: BM25 entries retrieved per memory list for each question (official 20).
        prompt_tokens: Prompt budget (the whole chat-formatted prompt) under ``k_reduction:
            budget``: the largest number of retrieved entries per list that fits is kept.
        bm25: How retrieval scores entries: ``lucene`` (bm25s's Lucene BM25) or ``okapi``
            (rank_bm25's BM25Okapi with its idf floor, as the official code). See
            docs/method.md, "Answering".
        k_reduction: How the number of retrieved entries is cut: ``budget`` (the largest that
            fits ``prompt_tokens``, found by bisection) or ``official`` (lowered by one, both
            lists together, while the system prompt alone is over ``system_prompt_limit``).
        system_prompt_limit: System-prompt token limit of ``k_reduction: official`` (official
            30000).
        bm25_query: What retrieval ranks entries for: ``question`` (the bare question) or
            ``with_instruction`` (the source's question instruction, an empty line and the
            question, as the official code queries).
        unit: What is ranked and shown: ``entry`` (whole memory entries, as the official code) or
            ``sentence`` (each entry's sentences on their own, an opening date kept with each, so an
            entry that tells facts about several people shows only the sentence asked about;
            ``top_k_entries`` then counts sentences). See docs/method.md, "Answering".
    """

    top_k_entries: int = DEFAULT_TOP_K
    prompt_tokens: int = 4096
    bm25: BM25Variant = "lucene"
    k_reduction: KReduction = "budget"
    system_prompt_limit: int = DEFAULT_SYSTEM_PROMPT_LIMIT
    bm25_query: BM25Query = "question"
    unit: RetrievalUnit = "entry"

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "system_prompt_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"reader.retrieval.{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k_entries < 0:
            raise ValueError(f"reader.retrieval.top_k_entries must be >= 0, got {self.top_k_entries}")
        for name, allowed in (
            ("bm25", BM25_VARIANTS),
            ("k_reduction", tuple(K_RULES)),
            ("bm25_query", BM25_QUERIES),
            ("unit", RETRIEVAL_UNITS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"reader.retrieval.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}"
                )


@dataclass
class OpenAISettings:
    """The OpenAI-compatible endpoint of the ``openai`` reader (the ``engine`` reader takes only
    the request options: its address and model name come from the rollout engine).

    Args:
        base_url: Endpoint of the ``openai`` reader, e.g. ``http://127.0.0.1:8000/v1``.
        model: Model name sent to the endpoint.
        api_key_env: Environment variable holding the endpoint's API key (the key itself is
            never part of the config).
        max_concurrency: Parallel requests to the endpoint.
        timeout_s: Per-request timeout in seconds.
        max_retries: Retries (with exponential backoff) before a question scores 0.
        backoff_s: Ceiling of the first retry's wait in seconds; it doubles with every retry.
        backoff_max_s: The wait's ceiling stops doubling here.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "Qwen/Qwen3-32B"
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"reader.openai.max_concurrency must be >= 1, got {self.max_concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"reader.openai.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"reader.openai.max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.backoff_s <= self.backoff_max_s:
            raise ValueError(
                f"reader.openai.backoff_s and reader.openai.backoff_max_s must satisfy 0 <= backoff_s <= "
                f"backoff_max_s, got {self.backoff_s} and {self.backoff_max_s}"
            )
        url = urlparse(self.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"reader.openai.base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                f"got {self.base_url!r}"
            )
