"""The ``rollout`` settings group: how the memory agent generates (``model.rollout``).

One small typed dataclass, checked in ``__post_init__`` with messages naming the full key, as every
settings group (docs/configuration.md is generated from its ``Args:``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from memalpha.agent.baselines import BaselineSettings
from memalpha.agent.memorise_prompts import PROMPT_DETAILS, PromptDetail, stated_response_limit
from memalpha.lm.sampling.backend import Backend, check_backend, check_machine
from memalpha.lm.sampling.vllm_settings import VllmSettings
from memalpha.templates.loader import PromptTemplates, load_templates
from memalpha.tools.formats import CallFormat, CallFormatName, get_call_format
from memalpha.tools.jsonfix import CALL_REPAIRS, CallRepair, CallRepairName

TrainedAgent = Literal["memory", "answer"]


@dataclass
class RolloutSettings:
    """How the memory agent generates.

    Args:
        group_size: Rollouts per instance (GRPO's group size ``n``; official 8).
        max_new_tokens: Response cap per chunk turn (official 2048).
        stated_limit_share: Share of ``max_new_tokens`` the memorising user message states as
            the reply budget, truncated to a whole number (1.0 = the cap itself; the official
            code states 0.8 of it, 1,638 of 2,048; docs/official_compatibility.md, difference 4).
            The real cap stays ``max_new_tokens``; training, validation and the demonstrations
            state the same number.
        max_prompt_tokens: Prompt budget per turn; the visible memory shrinks (k halves) to fit (official
            ~6k).
        temperature: Sampling temperature (official 1.0); also used for the training log-probs.
        top_p: Nucleus sampling threshold (1.0 = off).
        top_k: Top-k sampling (0 = off).
        call_format: Tool-call format the agent writes: ``qwen`` (✿FUNCTION✿/✿ARGS✿, the official
            Mem-alpha-4B format) or ``hermes`` (``<tool_call>{...}</tool_call>``, Qwen2.5/3 native).
        memory_view_k: Most recent entries per list shown while memorising (official 5).
        core_token_limit: Core memory cap in tokens; longer text is cut with a marker (official 512).
        generation_batch_size: Max prompts per ``generate`` call (None = all live rollouts at once).
        chat_template_kwargs: Extra arguments for the chat template, e.g. ``{"enable_thinking": false}`` for
            Qwen3.
        prompt_profile: ``full`` (every memory part explained, the tools' JSON schemas; ~1.1k
            tokens with the hermes format) or ``compact`` (a few sentences and one signature line
            per tool; ~650 tokens less: for small models on a CPU budget). The key keeps its name;
            in the code this is the prompt's detail (``PromptDetail`` in memalpha/agent/memorise_prompts.py),
            unrelated to a run's ``--profile`` (memalpha/train/profiles.py).
        call_repair: How call arguments are read (docs/official_compatibility.md, difference 6):
            ``strict`` (memalpha) refuses a call cut off inside its arguments and one with an
            argument its tool does not take (both failed calls), and reports a call with no
            arguments; ``json_repair`` (official) repairs arguments with the ``json-repair``
            package, so a cut-off call stores the prefix it keeps and succeeds, drops a call with
            no arguments silently and ignores extra arguments.
        prompt_templates: The prompt-template file (YAML) every prompt text comes from: the
            memorising prompts and tool block, the memory views, the reader's prompt and the
            judges' (the reader built for this run gets the same file). null = memalpha's own
            texts (``memalpha/templates/memalpha.yaml``); ``memalpha prompts import`` writes the
            official code's texts as such a file (docs/official_compatibility.md, difference 4).
        backend: How every token of the run is sampled, the agent's and the local reader's
            (``memalpha/lm/sampling/backend.py``): ``auto`` (the best in-process loop that runs for
            the model and device, logged once at setup), ``cpu-fused`` (memalpha's CPU decoding
            step over weights with the LoRA folded in; float32/float64 Llama-family decoders),
            ``cuda-graph`` (a static cache and a decoding step captured as a CUDA graph over a
            dense copy of the weights, LoRA folded in, 4-bit bases dequantised; CUDA only, and a
            failed capture stops the run),
            ``hf-generate`` (``transformers``' ``model.generate`` on the model as loaded, from the
            prompts' shared prefix pre-filled once: no copy of the weights, for FSDP or when that
            copy does not fit) or ``vllm`` (a vLLM
            server with the current adapter synced to it before every round; docs/vllm_engine.md;
            the local reader then samples in-process as ``auto`` chooses). A backend that cannot
            run for the model stops the run at setup, naming the reason. Validation rollouts
            sample the same way.
        vllm: The ``vllm`` backend's server and its checks (ignored unless ``backend: vllm``).
        trains: Which agent the rollouts sample and ``memalpha fit`` trains: ``memory`` (the policy
            reads chunks and writes memory) or ``answer`` (the answer agent: the policy answers each
            question of memories written beforehand, the ``memories`` layout of ``memalpha
            predict`` outputs, ``group_size`` answers per question of at most
            ``reader.max_new_tokens`` tokens, rewarded by ``reward.answer_reward``; docs/answer_agent.md).
        baseline: A memory that learns nothing in the agent's place (``kind``: ``raw_chunks``, every
            chunk stored and the reader's BM25 top ``top_k``; ``full_text``, the input cut to the
            reader's budget): the policy takes no turn and no adapter loads; for ``memalpha
            validate``, ``predict`` and the Python API (docs/baselines.md).
    """

    group_size: int = 8
    max_new_tokens: int = 2048
    stated_limit_share: float = 1.0
    max_prompt_tokens: int = 6144
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    call_format: CallFormatName = "qwen"
    memory_view_k: int = 5
    core_token_limit: int = 512
    generation_batch_size: int | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_profile: PromptDetail = "full"
    call_repair: CallRepairName = "strict"
    prompt_templates: str | None = None
    backend: Backend = "auto"
    vllm: VllmSettings = field(default_factory=VllmSettings)
    trains: TrainedAgent = "memory"
    baseline: BaselineSettings = field(default_factory=BaselineSettings)

    def __post_init__(self) -> None:
        check_backend(self.backend)
        check_machine(self.backend)
        if isinstance(self.vllm, dict):
            self.vllm = VllmSettings(**self.vllm)
        if isinstance(self.baseline, dict):
            self.baseline = BaselineSettings(**self.baseline)
        if self.trains not in get_args(TrainedAgent):
            raise ValueError(
                f"rollout.trains must be one of {list(get_args(TrainedAgent))}, got {self.trains!r}"
            )
        if self.trains == "answer" and self.baseline.kind is not None:
            raise ValueError(
                f"rollout.trains: answer trains the answer agent on memories already written: "
                f"rollout.baseline.kind {self.baseline.kind} writes none"
            )
        for name in ("group_size", "max_new_tokens", "max_prompt_tokens", "core_token_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.stated_limit_share <= 1.0:
            raise ValueError(f"rollout.stated_limit_share must be in (0, 1], got {self.stated_limit_share}")
        self._stated_limit = stated_response_limit(self.max_new_tokens, self.stated_limit_share)
        if self.memory_view_k < 0:
            raise ValueError(f"rollout.memory_view_k must be >= 0, got {self.memory_view_k}")
        if self.temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0 (rollouts sample), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"rollout.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.generation_batch_size is not None and self.generation_batch_size < 1:
            raise ValueError(
                f"rollout.generation_batch_size must be >= 1 or null, got {self.generation_batch_size}"
            )
        self._format = get_call_format(self.call_format)  # raises with the known names
        if self.prompt_profile not in PROMPT_DETAILS:
            raise ValueError(
                f"rollout.prompt_profile must be one of {list(PROMPT_DETAILS)}, got {self.prompt_profile!r}"
            )
        if self.call_repair not in CALL_REPAIRS:
            raise ValueError(
                f"rollout.call_repair must be one of {list(CALL_REPAIRS)}, got {self.call_repair!r}"
            )
        try:
            self._templates = load_templates(self.prompt_templates)
        except ValueError as exc:
            raise ValueError(f"rollout.prompt_templates: {exc}") from None

    @property
    def templates(self) -> PromptTemplates:
        """The prompt texts of :attr:`prompt_templates`, loaded once."""
        return self._templates

    @property
    def stated_limit(self) -> int:
        """The reply budget every memorising user message states (:attr:`stated_limit_share` of
        :attr:`max_new_tokens`: :func:`~memalpha.agent.memorise_prompts.stated_response_limit`)."""
        return self._stated_limit

    @property
    def format(self) -> CallFormat:
        """The call format :attr:`call_format` names, looked up once."""
        return self._format

    @property
    def repair(self) -> CallRepair:
        """The call-repair policy :attr:`call_repair` names (read once a round by
        :func:`~memalpha.agent.rollout.memorise_chunks`, which hands the object down)."""
        return CALL_REPAIRS[self.call_repair]
