"""MemoryAgent: a trained memory agent and its memory, from Python (docs/inference.md).

::

    agent = MemoryAgent.load("runs/tiny_cpu/adapter", config="configs/tiny_cpu.yaml")
    turn = agent.remember("Ada moved to Lisbon in March.", agent.new_memory())
    reading = agent.memorise(open("notes.md").read(), turn.memory)
    save_memory(reading.memory, "ada.memory.json")
    answers = agent.answer(["Where does Ada live?"], agent.load_memory("ada.memory.json"))

    stored = MemoryAgent.baseline("raw_chunks", config="configs/tiny_cpu.yaml")  # BM25 top 2 of the chunks

Every call runs the rollout's own code (:func:`memalpha.agent.reading.read_instances`: the
memorising prompt, the call parser, the tools on the memory, the reader), decoding greedily as
validation does. A call never changes the memory it is given: it returns a new one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from memalpha.agent.baselines import BASELINE_KINDS, cut_full_text
from memalpha.agent.prompt_budget import check_prompt_budget, chunk_room
from memalpha.agent.reading import Reading, read_instances
from memalpha.agent.rollout import Agent, GenerateFn, Rollout, answer_questions, make_token_counter
from memalpha.data.plain_text import TEXT_SOURCE, text_chunks
from memalpha.data.schema import QA, DataValidationError, Instance
from memalpha.inference.loading import read_source
from memalpha.inference.memory_file import load_memory
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.lm.core.policy import load_policy
from memalpha.lm.sampling.generation import resolve_eos_ids
from memalpha.lm.sampling.vllm_engine import VllmEngine
from memalpha.lm.sampling.vllm_server import VllmServer
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader
from memalpha.reader.settings import ReaderSettings
from memalpha.train.agent_factory import build_agent
from memalpha.train.settings_loader import AgentLoadError, AgentSettings, agent_settings, load_config


@dataclass
class Turn:
    """One chunk read: the memory after it, the calls the agent made (each with ``tool``,
    ``arguments``, ``status`` and ``reason``, in order), its response and whether the response
    was cut at ``rollout.max_new_tokens``."""

    memory: Memory
    calls: list[dict[str, Any]]
    response: str
    truncated: bool


class MemoryAgent:
    """A trained memory agent and the settings it runs with: its policy (in this process, or served by
    vLLM), tokenizer and reader, assembled by :func:`~memalpha.train.agent_factory.build_agent` as
    training assembles them. Build one with :meth:`load`, :meth:`baseline` or :meth:`served`.

    Args:
        agent: The assembled agent (policy or sampler, tokenizer, reader, rollout and reward settings).
        settings: The agent's settings (:class:`~memalpha.train.settings_loader.AgentSettings`).
        seed: Seed of new memories' entry ids.
    """

    def __init__(self, agent: Agent, settings: AgentSettings, *, seed: int = 0) -> None:
        self.agent = agent
        self.settings = settings
        self.seed = seed
        self._count_tokens = make_token_counter(agent.tokenizer)

    @property
    def policy(self) -> Any:
        """The policy in this process (None when a server samples, or for a baseline without one)."""
        return self.agent.policy

    @property
    def tokenizer(self) -> Any:
        return self.agent.tokenizer

    @property
    def reader(self) -> Reader | None:
        """Who answers questions from a memory."""
        return self.agent.reader

    @property
    def sampler(self) -> GenerateFn | None:
        return self.agent.sampler

    @classmethod
    def assembled(
        cls, settings: AgentSettings, policy: Any, tokenizer: Any, *, sampler: GenerateFn | None = None,
        seed: int = 0,
    ) -> MemoryAgent:  # fmt: skip
        """The agent of ``settings`` around ``policy`` and ``tokenizer``, as training assembles it; an
        answer agent's settings (``rollout.trains: answer``) are refused in one line."""
        if settings.rollout.trains == "answer":
            raise AgentLoadError(
                "rollout.trains: answer: this is an answer agent; load it as the reader.adapter_path of a "
                "memory agent"
            )
        return cls(build_agent(settings, policy, tokenizer, sampler=sampler), settings, seed=seed)

    # ------------------------------------------------------------- building
    @classmethod
    def load(
        cls, source: str | Path, *, config: str | Path | None = None, device: str = "cpu", seed: int = 0,
        **overrides: Any,
    ) -> MemoryAgent:  # fmt: skip
        """The agent of an adapter folder or a ``memalpha fit``/``sft`` checkpoint (``last.ckpt``).

        Its settings: a checkpoint's own, then ``config``'s ``model:`` section (the YAML the
        agent was trained with), then ``overrides``: ``model`` (the base model) and the groups
        ``lm``, ``lora``, ``rollout``, ``reader``, ``reward``, each a settings object or a dict of
        some of its keys (``reader={"kind": "extractive"}``). Without a config, an adapter folder's
        base model comes from its ``adapter_config.json``. Raises
        :class:`~memalpha.train.settings_loader.AgentLoadError` (one line) before any weight loads.
        """
        found = read_source(source)
        layers = (found.settings, load_config(config).agent_layer(), overrides)
        settings = agent_settings(*layers, fallback_model=found.base_model)
        baseline = settings.rollout.baseline.kind
        if baseline is not None:
            raise AgentLoadError(
                f"rollout.baseline.kind {baseline} learns nothing and loads no adapter: use "
                f"MemoryAgent.baseline({baseline!r}, ...)"
            )
        if settings.rollout.backend == "vllm":
            raise AgentLoadError("rollout.backend: vllm samples on a server; use MemoryAgent.served")
        lm = settings.lm
        policy, tokenizer = load_policy(
            settings.model, precision=lm.precision, lora=settings.lora, compute_dtype=lm.compute_dtype,
            adapter_path=None if found.adapter_path is None else str(found.adapter_path), device=device,
            attention_score_mib=lm.attention_score_mib, upcast_unquantised=lm.upcast_unquantised,
        )  # fmt: skip
        if found.state is not None:
            loaded = policy.load_state_dict(found.state, strict=False)
            missing = [k for k in loaded.missing_keys if "lora_" in k]
            if loaded.unexpected_keys or missing:
                wrong = (loaded.unexpected_keys or missing)[0]
                raise AgentLoadError(
                    f"checkpoint: {source}: its adapter does not fit model {settings.model!r} with lora "
                    f"{lora_shape(settings)} (first mismatch: {wrong})"
                )
        policy.eval()
        return cls.assembled(settings, policy, tokenizer, seed=seed)

    @classmethod
    def baseline(
        cls, kind: str, *, config: str | Path | None = None, top_k: int | None = None, device: str = "cpu",
        seed: int = 0, **overrides: Any,
    ) -> MemoryAgent:  # fmt: skip
        """A memory that learns nothing in the agent's place (docs/baselines.md): ``raw_chunks``
        (every chunk an entry, the reader answering from the ``top_k`` entries BM25 ranks highest,
        default ``rollout.baseline.top_k``: 2) or ``full_text`` (the text itself, cut from its start to the
        reader's prompt budget when questions are answered). No adapter is loaded: the base model
        (``model``, default the config's or the embedded one) loads only for the ``local`` reader,
        and its tokenizer counts the memory's tokens. Settings as in :meth:`load`."""
        if kind not in BASELINE_KINDS:
            raise AgentLoadError(f"baseline kind must be one of {list(BASELINE_KINDS)}, got {kind!r}")
        chosen = {"kind": kind, **({} if top_k is None else {"top_k": top_k})}
        settings = agent_settings(
            load_config(config).agent_layer(), overrides, {"rollout": {"baseline": chosen}}
        )
        if settings.rollout.backend == "vllm":
            raise AgentLoadError("rollout.backend: vllm samples the agent's turns; a baseline takes none")
        policy = None
        if settings.reader.kind == "local":
            lm = settings.lm
            policy, tokenizer = load_policy(
                settings.model, precision=lm.precision, lora=None, compute_dtype=lm.compute_dtype,
                device=device, attention_score_mib=lm.attention_score_mib,
                upcast_unquantised=lm.upcast_unquantised,
            )  # fmt: skip
        else:
            tokenizer = load_tokenizer(settings.model)
        return cls.assembled(settings, policy, tokenizer, seed=seed)

    @classmethod
    def served(
        cls, url: str, adapter: str, *, tokenizer: str, config: str | Path | None = None, seed: int = 0,
        **overrides: Any,
    ) -> MemoryAgent:  # fmt: skip
        """The agent whose policy a vLLM server samples: ``vllm serve BASE --enable-lora
        --lora-modules ADAPTER_NAME=ADAPTER_FOLDER`` at ``url``, ``adapter`` the module's name.
        memalpha builds the prompts (token ids from ``tokenizer``, a folder or model name; an
        exported adapter folder holds one), runs the tools and keeps the memory. Settings as in
        :meth:`load`; the reader must be ``openai`` (the same server's base model, say) or
        ``extractive``: no weights are in this process."""
        settings = agent_settings(load_config(config).agent_layer(), overrides)
        if settings.reader.kind in ("local", "engine"):
            raise AgentLoadError(
                f"reader.kind: {settings.reader.kind} answers with weights in this process; a served agent"
                " has none: use openai (the server's base model, for one) or extractive"
            )
        if settings.rollout.baseline.kind is not None:
            raise AgentLoadError(
                f"rollout.baseline.kind {settings.rollout.baseline.kind} takes no turn: use "
                "MemoryAgent.baseline"
            )
        names = served_models(url)
        if adapter not in names:
            raise AgentLoadError(
                f"no LoRA module {adapter!r} on the vLLM server at {url} (it serves {names}); start it with"
                f" --enable-lora --lora-modules {adapter}=ADAPTER_FOLDER"
            )
        tokens = load_tokenizer(tokenizer)
        engine = VllmEngine(VllmServer(url.rstrip("/").removesuffix("/v1"), adapter))
        sampler = partial(engine.generate, eos_token_id=resolve_eos_ids(None, tokens, None))
        return cls.assembled(settings, None, tokens, sampler=sampler, seed=seed)

    def with_reader(self, reader: ReaderSettings | dict[str, Any]) -> MemoryAgent:
        """The same agent answering with another reader (``{"kind": "extractive"}``, an
        ``openai`` endpoint, ...); the policy is shared, not copied."""
        settings = agent_settings({"reader": self.settings.reader}, {"reader": reader})
        if self.policy is None and settings.reader.kind in ("local", "engine"):
            raise AgentLoadError(f"reader.kind: {settings.reader.kind} needs the policy's weights here")
        try:
            agent = replace(self.settings, reader=settings.reader)  # the rules between groups, again
        except ValueError as exc:
            raise AgentLoadError(str(exc)) from None
        return MemoryAgent.assembled(agent, self.policy, self.tokenizer, sampler=self.sampler, seed=self.seed)

    # ------------------------------------------------------------- memories
    def new_memory(self, seed: int | None = None) -> Memory:
        """An empty memory counting tokens with the agent's tokenizer, its core capped at
        ``rollout.core_token_limit``; ``seed`` (default the agent's) seeds its entry ids."""
        return Memory(
            token_counter=self._count_tokens, core_token_limit=self.settings.rollout.core_token_limit,
            seed=self.seed if seed is None else seed,
        )

    def load_memory(self, path: str | Path) -> Memory:
        """The memory file at ``path`` (:func:`memalpha.inference.memory_file.load_memory`), its tokens
        counted with the agent's tokenizer."""
        return load_memory(path, token_counter=self._count_tokens)

    # ---------------------------------------------------------------- reading
    def remember(self, chunk: str, memory: Memory | None = None) -> Turn:
        """One memorising turn: the agent reads ``chunk`` with ``memory`` (default a new one) and
        its calls change a copy of it. A chunk whose prompt cannot fit ``rollout.max_prompt_tokens``
        is refused with one line (:class:`~memalpha.agent.rollout.RolloutError`)."""
        if not chunk.strip():
            raise DataValidationError("chunk", "empty text: there is nothing to read")
        reading = self._read(Instance("chunk", TEXT_SOURCE, [chunk], []), memory)
        turn = reading.turns[0]
        return Turn(reading.memory, turn["results"], turn["response"], turn["truncated"])

    def memorise(self, text: str, memory: Memory | None = None, *, chunk_tokens: int | None = None,
             split: str = "tokens") -> Reading:
        """The agent reads a whole text, chunk by chunk, into a copy of ``memory`` (default a new
        one); the :class:`~memalpha.agent.reading.Reading` holds the memory and every turn.

        The text is cut as ``memalpha predict`` cuts a file (``split``: ``tokens`` or
        ``blank_lines``), in chunks of at most ``chunk_tokens`` tokens (default: the most that
        fit, :func:`~memalpha.agent.prompt_budget.chunk_room`). A ``chunk_tokens`` the user sets is
        kept; a chunk it makes whose turn could go over ``rollout.max_prompt_tokens`` once the core
        is full is refused (a :class:`~memalpha.agent.rollout.RolloutError` naming it) before the
        agent reads anything, as ``memalpha predict`` refuses it.
        """
        size = chunk_room(self.tokenizer, self.settings.rollout) if chunk_tokens is None else chunk_tokens
        instance = Instance("text", TEXT_SOURCE, text_chunks(text, self.tokenizer, size, split, "text"), [],
                            metadata={"chunk_tokens": size})
        check_prompt_budget([instance], self.tokenizer, self.settings.rollout, "text", full_core=True)
        return self._read(instance, memory)

    def _read(self, instance: Instance, memory: Memory | None) -> Reading:
        start = self.new_memory() if memory is None else memory
        return read_instances(self.agent, [instance], seed=self.seed, memories=[start])[0]

    # --------------------------------------------------------------- answering
    def answer(
        self, questions: Sequence[str], memory: Memory, *, golds: Sequence[str | list[str]] | None = None,
        data_source: str = TEXT_SOURCE,
    ) -> list[dict[str, Any]]:
        """The reader's answer to each question from ``memory``: ``question``, ``instruction`` (what
        the reader got before it, from ``data_source``'s entry of ``reader.question_instructions``),
        ``prediction`` and ``error`` (a failed remote answer: no prediction). With ``golds`` each
        answer is also scored with ``data_source``'s metric (``score``; None when it failed).

        A baseline answers as it is scored: ``raw_chunks`` from its ``top_k`` entries, ``full_text``
        from its text cut from the start to the reader's prompt budget for these questions."""
        if self.reader is None:
            raise AgentLoadError("this agent has no reader: build it with a reader setting")
        if golds is not None and len(golds) != len(questions):
            raise ValueError(f"{len(golds)} golds for {len(questions)} questions")
        baseline = self.settings.rollout.baseline
        if baseline.kind == "full_text" and len(memory.episodic) == 1:
            memory = cut_full_text(memory, questions, data_source, self.reader, self.tokenizer)
        if golds is not None:  # the rollout's own answering and scoring, on this memory
            instance = Instance("questions", data_source, [""], [QA(q, g) for q, g in zip(questions, golds)])
            rollout = Rollout(rollout_id=0, group_id=0, index=0, instance=instance, memory=memory)
            reward = self.settings.reward
            answered = answer_questions(
                [rollout], self.reader, metric_overrides=reward.metric_overrides, style=reward.answer_style,
                top_k=baseline.answer_top_k,
            )[0]
            return [{**q, "score": None if q["error"] else q["score"]} for q in answered.questions]
        answers = self.reader.answer(
            [(memory, q) for q in questions], [data_source] * len(questions), baseline.answer_top_k
        )
        return [
            {"question": q, "instruction": self.reader.instruction_for(data_source), "prediction": a.text,
             "error": a.error}
            for q, a in zip(questions, answers)
        ]  # fmt: skip


def served_models(url: str) -> list[str]:
    """The model names a vLLM server at ``url`` serves (its base model and LoRA modules)."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=30) as response:
            return [m["id"] for m in json.loads(response.read())["data"]]
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as exc:
        raise AgentLoadError(f"no vLLM server answers at {base}/v1/models ({exc})") from None


def lora_shape(settings: AgentSettings) -> str:
    """``r=8, alpha=16``: the LoRA shape, for messages."""
    return f"r={settings.lora.r}, alpha={settings.lora.alpha}"
