"""memalpha's memory task as a TRL environment: a class ``trl.GRPOTrainer(environment_factory=...)`` takes
as it is (docs/trl.md; the ``trl`` extra installs TRL).

A dataset row carries one memalpha instance under ``instance`` (:func:`instance_rows`,
:func:`memorising_rows`); :meth:`MemoryEnvironment.reset` starts an empty memory on it, the agent's
tools are memalpha's three memory tools (run by memalpha's executor) and
:meth:`MemoryEnvironment.read_next_chunk`, and :meth:`MemoryEnvironment.get_reward` is the mean over
the rollout's turns of memalpha's ``R_t``, every chunk a turn. docs/trl.md tables how the task maps
onto TRL's tool loop and what differs from memalpha's own rollout (one growing conversation, the
agent deciding when to read on, one reward per rollout).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from memalpha.agent.memorise_prompts import memorise_messages, render_memorise
from memalpha.agent.reward_math import TurnCalls, rollout_rewards
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Rollout, answer_questions
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import DataValidationError, Instance, parse_record
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader
from memalpha.reader.settings import ReaderSettings
from memalpha.seeding import stable_seed
from memalpha.tools.executor import execute_call
from memalpha.tools.formats import ToolCall, get_call_format
from memalpha.tools.schemas import DELETE, INSERT, UPDATE
from memalpha.train.step_faults import ReaderFailureError, ReaderFailures, over_the_limit

NO_MORE_CHUNKS = "Every chunk has been read; the memory is final."
ROW = "the TRL dataset row"
"""What a bad record's one-line error names as its file."""


def instance_rows(instances: Iterable[Instance], prompt: str) -> list[dict[str, Any]]:
    """One TRL dataset row per instance: the conversational ``prompt`` (a user message of ``prompt``)
    and the instance's record as JSON under ``instance``."""
    return [
        {"prompt": [{"role": "user", "content": prompt}], "instance": json.dumps(instance.to_dict())}
        for instance in instances
    ]


def memorising_rows(instances: Iterable[Instance], settings: RolloutSettings) -> list[dict[str, Any]]:
    """One TRL dataset row per instance whose ``prompt`` is memalpha's own memorising prompt of its
    chunk 0 (system and user message, an empty memory, ``settings``' call format, prompt detail and texts):
    the prompt a memalpha-trained policy knows. Use with ``MemoryEnvironment(first_chunk_in_prompt=True)``."""
    call_format = get_call_format(settings.call_format)
    limit = settings.stated_limit
    view = render_memorise(Memory(), settings.memory_view_k, settings.templates)
    return [
        {"prompt": memorise_messages(view, instance.chunks[0], call_format, response_token_limit=limit,
                                     detail=settings.prompt_profile, templates=settings.templates),
         "instance": json.dumps(instance.to_dict())}
        for instance in instances
    ]


def use_memorising_template(tokenizer) -> None:
    """Give ``tokenizer`` the chat template a memalpha-trained policy reads in TRL: TRL's Qwen2.5 template
    (ChatML, tool calls in ``<tool_call>`` blocks, TRL's parser of them) without the tool schemas it
    adds to the system message, which :func:`memorising_rows`' prompt states in memalpha's own words.
    (A small policy trained on memalpha's prompt answers TRL's extra schema block with broken calls.)"""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    tokenizer.chat_template = qwen2_5_chat_template
    add_response_schema(tokenizer)  # TRL's parser for the template it knows, kept through the edit below
    tokenizer.chat_template = qwen2_5_chat_template.replace("{%- if tools %}", "{%- if false %}", 1)


class MemoryEnvironment:
    """One rollout of memalpha's memory task inside TRL's tool loop (module docstring).

    Args:
        reader: Who answers the questions from the final memory (``ReaderSettings(...).build(...)``; the
            extractive reader needs no model).
        reward: memalpha's reward settings (default: memalpha's defaults).
        rollout: The rollout settings whose ``core_token_limit`` and ``call_repair`` apply.
        count_tokens: Counts a text's tokens for the memory and r3 (default: words).
        max_failed_share: The largest share of a rollout's questions whose answer may fail before the run
            stops (as ``model.reader.max_failed_share``).
        first_chunk_in_prompt: The rows' prompts already show chunk 0 (:func:`memorising_rows`), so
            :meth:`reset` adds nothing.
    """

    def __init__(
        self,
        reader: Reader,
        *,
        reward: RewardSettings | None = None,
        rollout: RolloutSettings | None = None,
        count_tokens: Callable[[str], int] | None = None,
        max_failed_share: float = ReaderSettings.max_failed_share,
        first_chunk_in_prompt: bool = False,
    ) -> None:
        self._reader = reader
        self._reward = reward or RewardSettings()
        self._settings = rollout or RolloutSettings()
        self._count_tokens = count_tokens or (lambda text: len(text.split()))
        self._max_failed_share = max_failed_share
        self._first_chunk_in_prompt = first_chunk_in_prompt
        self._judge = self._reward.build_content_judge(reader)
        self.instance: Instance | None = None
        self.memory = Memory()
        self.turns: list[TurnCalls] = []

    def reset(self, instance: str | Mapping[str, Any] | None = None, **row: Any) -> str | None:
        """Start a rollout of the row's ``instance``: an empty memory, and chunk 0 for the agent (None
        when the row's prompt shows it already)."""
        if instance is None:
            raise ValueError(
                "a memory-task row needs an 'instance' column (see instance_rows in"
                " memalpha.integrations.trl_environment)"
            )
        try:
            record = json.loads(instance) if isinstance(instance, str) else dict(instance)
        except json.JSONDecodeError as error:
            raise DataValidationError(ROW, f"column 'instance' is not a JSON record: {error}") from None
        self.instance = parse_record(record, file=ROW)
        self.memory = Memory(
            token_counter=self._count_tokens,
            core_token_limit=self._settings.core_token_limit,
            seed=stable_seed(0, self.instance.instance_id),
        )
        self.turns = [TurnCalls(chunk=self.instance.chunks[0])]
        return None if self._first_chunk_in_prompt else self._chunk_text(0)

    def new_memory_insert(
        self, memory_type: Literal["semantic_memory", "episodic_memory"], content: str
    ) -> str:
        """Add one new item to the semantic or episodic memory; it gets a new id.

        Args:
            memory_type: semantic_memory for facts and knowledge, episodic_memory for events with a time.
            content: Text of the new memory item.

        Returns:
            What the memory did: ok with the new item's id, skipped, or the error.
        """
        return self._call(INSERT, memory_type=memory_type, content=content)

    def memory_update(
        self,
        memory_type: Literal["core_memory", "semantic_memory", "episodic_memory"],
        new_content: str,
        memory_id: str | None = None,
    ) -> str:
        """Rewrite memory: the whole core paragraph, or the semantic or episodic item with memory_id.

        Args:
            memory_type: Which memory to rewrite.
            new_content: The complete new text.
            memory_id: Id of the item to rewrite; needed for semantic/episodic, ignored for core_memory.

        Returns:
            What the memory did: ok, skipped, or the error.
        """
        return self._call(UPDATE, memory_type=memory_type, new_content=new_content, memory_id=memory_id)

    def memory_delete(
        self,
        memory_type: Literal["core_memory", "semantic_memory", "episodic_memory"],
        memory_id: str | None = None,
    ) -> str:
        """Remove memory: empty the core paragraph, or remove the semantic or episodic item with memory_id.

        Args:
            memory_type: Which memory to delete from.
            memory_id: Id of the item to remove; needed for semantic/episodic, ignored for core_memory.

        Returns:
            What the memory did: ok, skipped, or the error.
        """
        return self._call(DELETE, memory_type=memory_type, memory_id=memory_id)

    def read_next_chunk(self) -> str:
        """Finish storing the current chunk and read the next one.

        Returns:
            The next chunk, or a line saying that every chunk has been read.
        """
        instance = self._started()
        if len(self.turns) >= len(instance.chunks):
            return NO_MORE_CHUNKS
        index = len(self.turns)
        self.turns.append(TurnCalls(chunk=instance.chunks[index]))
        return self._chunk_text(index)

    def get_reward(self) -> float:
        """memalpha's reward of the finished rollout: the mean of ``R_t`` over its turns (see the module)."""
        instance = self._started()
        rollout = Rollout(rollout_id=0, group_id=0, index=0, instance=instance, memory=self.memory)
        answered = answer_questions(
            [rollout], self._reader, metric_overrides=self._reward.metric_overrides,
            style=self._reward.answer_style,
        )[0]
        failures = ReaderFailures.of_questions(answered.questions)
        if failures.share > self._max_failed_share:
            raise ReaderFailureError(
                f"{over_the_limit(failures, self._max_failed_share, f'instance {instance.instance_id!r}')};"
                f" first error: {failures.first_error}"
            )
        turns = self.turns + [TurnCalls(chunk=c) for c in instance.chunks[len(self.turns):]]
        chunk_tokens = sum(self._count_tokens(c) for c in instance.chunks)
        reward = rollout_rewards(
            answered.scores, turns, self.memory.total_tokens(), chunk_tokens, self._reward, self._judge
        )
        return sum(reward.total) / len(reward.total)

    def _started(self) -> Instance:
        if self.instance is None:
            raise RuntimeError("MemoryEnvironment: reset() was not called")
        return self.instance

    def _chunk_text(self, index: int) -> str:
        total = len(self._started().chunks)
        return f"\n\nChunk {index + 1} of {total}:\n{self._started().chunks[index]}"

    def _call(self, name: str, **arguments: Any) -> str:
        """Execute one call on the memory, as memalpha's executor does, and keep it for the reward."""
        self._started()
        kept = {key: value for key, value in arguments.items() if value is not None}
        call = ToolCall(name=name, arguments=kept, raw=json.dumps({"name": name, "arguments": kept}))
        result = execute_call(self.memory, call, self._settings.repair)
        self.turns[-1].results.append(result)
        return f"{result.status}: {result.reason}"
