"""The one place an agent is assembled from its settings: the reader, the content judge and the memory
agent (or, under ``rollout.trains: answer``, the answer agent) around a loaded policy.

:class:`~memalpha.train.module.GRPOModule` (training, validation and ``memalpha predict``) and the Python
API (:class:`~memalpha.inference.memory_agent.MemoryAgent`) both call :func:`build_agent`; validation
rolls the agent out (``Agent.rollouts``), prediction and the API read through
:func:`~memalpha.agent.reading.read_instances` with the same agent.
"""

from __future__ import annotations

from typing import Any

from memalpha.agent.answering import AnswerAgent
from memalpha.agent.rollout import Agent, GenerateFn
from memalpha.train.settings_loader import AgentSettings


def build_agent(
    settings: AgentSettings,
    policy: Any,
    tokenizer: Any,
    *,
    sampler: GenerateFn | None = None,
    engine_endpoint: tuple[str, str, str] | None = None,
) -> Agent | AnswerAgent:
    """The agent of ``settings`` around ``policy`` (None where ``sampler`` generates, or for a baseline
    whose reader needs no weights) and its ``tokenizer``: the reader ``settings.reader`` names (the
    ``engine`` reader at ``engine_endpoint``), the content judge ``settings.reward`` names, and the
    rollout settings; ``sampler`` generates the turns instead of the policy (a vLLM server)."""
    rollout = settings.rollout
    reader = settings.reader.build(
        policy, tokenizer, rollout.templates, engine_endpoint, backend=rollout.backend
    )
    if rollout.trains == "answer":
        cap = settings.reader.max_new_tokens
        return AnswerAgent(policy, tokenizer, reader, rollout, settings.reward, cap, sampler=sampler)
    return Agent(
        policy, tokenizer, reader, rollout, settings.reward, settings.reward.build_content_judge(reader),
        share_prefix=settings.lm.share_prefix, sampler=sampler,
    )  # fmt: skip
