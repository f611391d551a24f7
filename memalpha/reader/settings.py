"""The reader's settings group, and the one place that builds a :class:`~memalpha.reader.base.Reader` from
it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from memalpha.lm.core.adapters import check_adapter_folder, load_frozen_adapter
from memalpha.lm.core.modes import ANSWER_ADAPTER, holds_adapter
from memalpha.reader.base import Reader
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.local import LocalReader
from memalpha.reader.openai_compat import OpenAIReader
from memalpha.reader.options import OpenAISettings, RetrievalSettings
from memalpha.reader.question_instructions import BUILTIN, load_question_instructions
from memalpha.templates.loader import PromptTemplates

ReaderKind = Literal["local", "openai", "engine", "extractive"]
READER_KINDS: tuple[str, ...] = get_args(ReaderKind)
FailedRoundAction = Literal["stop", "skip"]
FAILED_ROUND_ACTIONS: tuple[str, ...] = get_args(FailedRoundAction)


@dataclass
class ReaderSettings:
    """Who answers the questions from memory, and how.

    Args:
        kind: ``local`` (the policy's base weights, adapters off), ``openai`` (an
            OpenAI-compatible endpoint), or ``engine`` (the rollout engine's vLLM server with no
            adapter, i.e. the base model: one server samples the agent and answers; needs
            ``rollout.backend: vllm``; the ``reader.openai`` request options apply, its address
            and model name come from the engine), or ``extractive`` (no model: the answer is the
            memory text retrieved for the question, so a ``substring`` question scores 1 when its
            gold is stored in a retrieved entry; r1 then measures the memory alone; answers no
            judge prompts, so not with ``reward.content_judge: llm``; see
            :mod:`memalpha.reader.extractive`).
        max_new_tokens: Answer length cap.
        temperature: Sampling temperature (0 = greedy; the paper's vLLM reader used 0.7).
        batch_size: Questions per ``generate`` call of the ``local`` reader.
        question_instructions: The per-source instruction put before each question (e.g. put the
            label in ``\\boxed{}`` for the classification sources): ``builtin`` (memalpha's table,
            shipped with the package), a path to a YAML file mapping data_source names or glob
            patterns to instructions, or null (or an empty file) for bare questions. Used in
            training and validation alike; see docs/method.md, "Answering".
        retrieval: Which memory entries reach the answer prompt and how many (``reader.retrieval.*``).
        openai: The endpoint of the ``openai`` reader and the request options of the ``openai``
            and ``engine`` readers (``reader.openai.*``).
        max_failed_share: The largest share of a training round's questions whose answer (or its
            judgement) may fail, after the reader's own retries, for the round still to be trained
            on: a failed answer scores 0, so beyond a stray failure it would teach the policy that
            its memory was useless (0 refuses any failure, 1 trains on whatever comes back). A
            validation over it (``memalpha validate``, ``fit``'s validation) stops with one line
            and marks its report invalid. Only a remote reader's transport failures fail an
            answer; any other error of a reader stops the run.
        on_failed_round: What a round over ``max_failed_share`` does: ``stop`` the run with one line
            naming the share and the first error (the last checkpoint stays as it was), or ``skip``
            the round untrained, logged as ``train/skipped_reader_rounds``; three skipped in a row
            stop the run all the same (docs/metrics_and_rewards.md, "Faults").
        adapter_path: The answer agent: a LoRA adapter folder trained on the policy's base to answer
            from memory (``memalpha data answers``, then ``memalpha sft``; docs/answer_agent.md). The
            ``local`` reader answers with it alone, loaded frozen beside the policy's adapter, which
            is off while it answers; null: the base model answers. Only with ``kind: local``.
    """

    kind: ReaderKind = "local"
    max_new_tokens: int = 64
    temperature: float = 0.0
    batch_size: int = 8
    question_instructions: str | None = BUILTIN
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    openai: OpenAISettings = field(default_factory=OpenAISettings)
    max_failed_share: float = 0.1
    on_failed_round: FailedRoundAction = "stop"
    adapter_path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retrieval, dict):
            self.retrieval = RetrievalSettings(**self.retrieval)
        if isinstance(self.openai, dict):
            self.openai = OpenAISettings(**self.openai)
        if self.kind not in READER_KINDS:
            raise ValueError(f"reader.kind must be one of {list(READER_KINDS)}, got {self.kind!r}")
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"reader.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"reader.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 <= self.max_failed_share <= 1.0:
            raise ValueError(f"reader.max_failed_share must be in [0, 1], got {self.max_failed_share}")
        if self.on_failed_round not in FAILED_ROUND_ACTIONS:
            raise ValueError(
                f"reader.on_failed_round must be one of {list(FAILED_ROUND_ACTIONS)},"
                f" got {self.on_failed_round!r}"
            )
        load_question_instructions(self.question_instructions)  # a missing or malformed file fails here
        if self.adapter_path is not None:
            if self.kind != "local":
                raise ValueError(
                    f"reader.adapter_path: the answer agent is an adapter on the policy's base, which only "
                    f"reader.kind: local answers with (got {self.kind})"
                )
            check_adapter_folder(self.adapter_path, "reader.adapter_path")

    def build(
        self,
        policy: Any,
        tokenizer: Any,
        templates: PromptTemplates | None = None,
        engine_endpoint: tuple[str, str, str] | None = None,
        backend: str = "auto",
    ) -> Reader:
        """The reader: ``policy`` with its adapters off (``local``), a client of the endpoint
        (``openai``; ``engine``: of ``engine_endpoint``, the rollout engine's
        ``(base_url, base model name, tokenizer folder)``), or retrieval alone (``extractive``).

        ``templates`` are the prompt texts (the run's ``rollout.prompt_templates``; ``None``:
        memalpha's). The ``openai`` reader builds its prompts here too, so one file serves both.
        ``backend`` is the run's ``rollout.backend``: the ``local`` reader samples through the same loop.
        With ``adapter_path`` the answer agent's adapter is loaded into ``policy`` (a PEFT model;
        a bare model is wrapped, for the reader alone) unless it holds it already.
        """
        instructions = load_question_instructions(self.question_instructions)
        if self.kind == "extractive":
            return ExtractiveReader(
                retrieval=self.retrieval, question_instructions=instructions, templates=templates
            )
        if self.kind == "local":
            adapter = None
            if self.adapter_path is not None:
                policy, adapter = with_answer_adapter(policy, self.adapter_path), ANSWER_ADAPTER
            return LocalReader(
                policy,
                tokenizer,
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                retrieval=self.retrieval,
                batch_size=self.batch_size,
                question_instructions=instructions,
                templates=templates,
                backend=backend,
                adapter=adapter,
            )
        endpoint, tokenizer_path = self.openai, None
        if self.kind == "engine":
            if engine_endpoint is None:
                raise ValueError(
                    "reader.kind: engine answers from the rollout engine's server: set rollout.backend: vllm"
                )
            base_url, model, tokenizer_path = engine_endpoint
            endpoint = replace(self.openai, base_url=base_url, model=model)
        return OpenAIReader(
            endpoint,
            self.retrieval,
            tokenizer=tokenizer_path,
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            question_instructions=instructions,
            templates=templates,
        )


def with_answer_adapter(model: Any, path: str) -> Any:
    """``model`` holding the answer agent at ``path`` as its frozen
    :data:`~memalpha.lm.core.modes.ANSWER_ADAPTER`: loaded into a PEFT model (in place of an answer
    adapter it held before), or a bare model wrapped around it (a new PEFT model; the bare one is
    left as it was)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        if holds_adapter(model, ANSWER_ADAPTER):
            model.delete_adapter(ANSWER_ADAPTER)
        load_frozen_adapter(model, path, ANSWER_ADAPTER)
        return model
    return PeftModel.from_pretrained(model, path, adapter_name=ANSWER_ADAPTER, is_trainable=False)
