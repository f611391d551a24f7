"""The reader's settings group, and the one place that builds a :class:`~memalpha.reader.base.Reader` from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args
from urllib.parse import urlparse

from memalpha.reader.base import BM25_QUERIES, BM25Query, Reader
from memalpha.reader.local import LocalReader
from memalpha.reader.openai_compat import OpenAIReader
from memalpha.reader.question_instructions import BUILTIN, load_question_instructions
from memalpha.reader.retrieval import BM25_VARIANTS, K_REDUCTIONS, BM25Variant, KReduction
from memalpha.templates.loader import PromptTemplates

ReaderKind = Literal["local", "openai", "engine"]
READER_KINDS: tuple[str, ...] = get_args(ReaderKind)


@dataclass
class ReaderSettings:
    """Who answers the questions from memory, and how.

    Args:
        kind: ``local`` (the policy's base weights, adapters off), ``openai`` (an
            OpenAI-compatible endpoint), or ``engine`` (the rollout engine's vLLM server with no
            adapter, i.e. the base model: one server samples the agent and answers; needs
            ``rollout.engine: vllm``; the ``openai_*`` request options apply, its address and
            model name come from the engine).
        max_new_tokens: Answer length cap.
        temperature: Sampling temperature (0 = greedy; the paper's vLLM reader used 0.7).
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
        batch_size: Questions per ``generate`` call of the ``local`` reader.
        openai_base_url: Endpoint of the ``openai`` reader, e.g. ``http://127.0.0.1:8000/v1``.
        openai_model: Model name sent to the endpoint.
        openai_api_key_env: Environment variable holding the endpoint's API key (the key itself
            is never part of the config).
        openai_max_concurrency: Parallel requests to the endpoint.
        openai_timeout_s: Per-request timeout in seconds.
        openai_max_retries: Retries (with exponential backoff) before a question scores 0.
        question_instructions: The per-source instruction put before each question (e.g. put the
            label in ``\\boxed{}`` for the classification sources): ``builtin`` (memalpha's table,
            shipped with the package), a path to a YAML file mapping data_source names or glob
            patterns to instructions, or null (or an empty file) for bare questions. Used in
            training and validation alike; see docs/method.md, "Answering".
    """

    kind: ReaderKind = "local"
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k_entries: int = 20
    prompt_tokens: int = 4096
    batch_size: int = 8
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_model: str = "Qwen/Qwen3-32B"
    openai_api_key_env: str = "OPENAI_API_KEY"
    openai_max_concurrency: int = 8
    openai_timeout_s: float = 60.0
    openai_max_retries: int = 3
    question_instructions: str | None = BUILTIN
    bm25: BM25Variant = "lucene"
    k_reduction: KReduction = "budget"
    system_prompt_limit: int = 30000
    bm25_query: BM25Query = "question"

    def __post_init__(self) -> None:
        if self.kind not in READER_KINDS:
            raise ValueError(f"reader.kind must be one of {list(READER_KINDS)}, got {self.kind!r}")
        for name in ("max_new_tokens", "prompt_tokens", "batch_size", "openai_max_concurrency", "system_prompt_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"reader.{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k_entries < 0:
            raise ValueError(f"reader.top_k_entries must be >= 0, got {self.top_k_entries}")
        for name, allowed in (("bm25", BM25_VARIANTS), ("k_reduction", K_REDUCTIONS), ("bm25_query", BM25_QUERIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"reader.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.temperature < 0:
            raise ValueError(f"reader.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not self.openai_timeout_s > 0:
            raise ValueError(f"reader.openai_timeout_s must be > 0, got {self.openai_timeout_s}")
        if self.openai_max_retries < 0:
            raise ValueError(f"reader.openai_max_retries must be >= 0, got {self.openai_max_retries}")
        url = urlparse(self.openai_base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"reader.openai_base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                f"got {self.openai_base_url!r}"
            )
        load_question_instructions(self.question_instructions)  # a missing or malformed file fails here

    def build(
        self,
        policy: Any,
        tokenizer: Any,
        templates: PromptTemplates | None = None,
        engine_endpoint: tuple[str, str, str] | None = None,
    ) -> Reader:
        """The reader: ``policy`` with its adapters off (``local``), or a client of the endpoint
        (``openai``; ``engine``: of ``engine_endpoint``, the rollout engine's
        ``(base_url, base model name, tokenizer folder)``).

        ``templates`` are the prompt texts (the run's ``rollout.prompt_templates``; ``None``:
        memalpha's). The ``openai`` reader builds its prompts here too, so one file serves both.
        """
        instructions = load_question_instructions(self.question_instructions)
        if self.kind == "local":
            return LocalReader(
                policy,
                tokenizer,
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                top_k_entries=self.top_k_entries,
                prompt_budget_tokens=self.prompt_tokens,
                batch_size=self.batch_size,
                question_instructions=instructions,
                templates=templates,
                **self._retrieval_options(),
            )
        base_url, model, tokenizer_path = self.openai_base_url, self.openai_model, None
        if self.kind == "engine":
            if engine_endpoint is None:
                raise ValueError("reader.kind: engine answers from the rollout engine's server: set rollout.engine: vllm")
            base_url, model, tokenizer_path = engine_endpoint
        return OpenAIReader(
            base_url,
            model,
            tokenizer=tokenizer_path,
            api_key_env=self.openai_api_key_env,
            max_concurrency=self.openai_max_concurrency,
            timeout_s=self.openai_timeout_s,
            max_retries=self.openai_max_retries,
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            top_k_entries=self.top_k_entries,
            prompt_budget_tokens=self.prompt_tokens,
            question_instructions=instructions,
            templates=templates,
            **self._retrieval_options(),
        )

    def _retrieval_options(self) -> dict[str, Any]:
        return {"bm25": self.bm25, "k_reduction": self.k_reduction,
                "system_prompt_limit": self.system_prompt_limit, "bm25_query": self.bm25_query}
