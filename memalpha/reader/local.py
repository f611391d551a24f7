"""Reader backend running a causal LM in this process.

In training this is the policy's own base model: when ``model`` is a PEFT model, every
generation runs inside ``model.disable_adapter()``, so the frozen base weights answer and no
second copy of the model is loaded. With an answer agent (``reader.adapter_path``) the reader
answers with that adapter alone, loaded frozen beside the policy's
(:data:`~memalpha.lm.core.modes.ANSWER_ADAPTER`): the policy's adapter is off while it answers.

Prompts are chat-formatted with the tokenizer's template (thinking disabled where the
template supports the switch, unless a call of :meth:`LocalReader.generate` asks for it), sorted
by length, left-padded into batches of ``batch_size`` and decoded greedily
(``temperature == 0``) or by sampling.

The reader samples through the same decoding loop as the policy
(:func:`memalpha.lm.sampling.generation.sampler_for` with the run's ``rollout.backend``: on a GPU
the captured ``cuda-graph`` step over a dense copy of the base weights, 4-bit bases dequantised),
with the adapters off, and logs its choice as the ``reader`` backend. All the questions of one
call go to one ``generate`` call, so that dense copy
is made once per reader phase, not once per batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.lm.core.modes import adapter_weights, eval_mode
from memalpha.lm.sampling.backend import in_process
from memalpha.reader.base import Conversation, Reader, ReaderAnswer, ReaderSampling
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.question_instructions import QuestionInstructions
from memalpha.templates.loader import PromptTemplates


def chat_prompt_text(tokenizer: Any, conversation: Conversation, enable_thinking: bool = False) -> str:
    """The conversation rendered by the tokenizer's chat template, ready for the reply.

    ``enable_thinking`` reaches templates that know it (Qwen3); others ignore it.
    """
    return tokenizer.apply_chat_template(
        list(conversation), tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )


@dataclass
class LocalGeneration:
    """One local reply with its token counts (used by the HTTP server for ``usage``); ``error`` is
    set only by the server, for a generation that raised (answered as HTTP 500)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool
    error: str | None = None


@contextlib.contextmanager
def answering_weights(model: Any, adapter: str | None) -> Iterator[None]:
    """Run with the adapter ``adapter`` of the PEFT ``model`` alone (the answer agent), or with
    ``None`` the base weights (:func:`base_weights`), in eval mode, without gradients."""
    if adapter is None:
        with base_weights(model):
            yield
        return
    import torch

    with eval_mode(model), adapter_weights(model, adapter), torch.no_grad():
        yield


@contextlib.contextmanager
def base_weights(model: Any) -> Iterator[None]:
    """Run with LoRA adapters switched off (PEFT models), in eval mode, without gradients."""
    import torch
    from peft import PeftModel

    adapter_off = model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()
    with eval_mode(model), adapter_off, torch.no_grad():
        yield


class LocalReader(Reader):
    """Reader backed by an in-process HF causal LM.

    Args:
        model: a ``transformers`` causal LM, or a ``peft.PeftModel`` around one (answering with
            its base weights, or with its adapter ``adapter``).
        tokenizer: its tokenizer (a chat template is required).
        max_new_tokens: reply length limit (answers are short).
        temperature: 0 decodes greedily; > 0 samples (nucleus sampling is asked per call:
            :meth:`generate`'s ``top_p``, as the reader server's requests do).
        retrieval, question_instructions, templates: see :class:`~memalpha.reader.base.Reader`.
        batch_size: prompts per forward batch.
        backend: how it samples (``rollout.backend``'s values, the run's; ``vllm`` samples the
            agent's turns on a server and the reader as ``auto`` chooses).
        adapter: the name of ``model``'s adapter that answers (the answer agent); None: the base.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        retrieval: RetrievalSettings | None = None,
        batch_size: int = 8,
        question_instructions: QuestionInstructions | None = None,
        templates: PromptTemplates | None = None,
        backend: str = "auto",
        adapter: str | None = None,
    ) -> None:
        super().__init__(
            retrieval=retrieval, question_instructions=question_instructions, templates=templates
        )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("LocalReader needs a tokenizer with a chat template")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size
        self.backend = in_process(backend)
        self.adapter = adapter

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def conversation_tokens(self, conversation: Conversation) -> int:
        return self.count_tokens(chat_prompt_text(self.tokenizer, conversation))

    def generate(
        self,
        conversations: Sequence[Conversation],
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        enable_thinking: bool = False,
    ) -> list[LocalGeneration]:
        """Generate one reply per conversation (``seed``: of sampling; ``enable_thinking``: Qwen3's
        chat-template switch). A failing call raises (running out of memory included): a fault of
        the local reader is never a failed answer scored 0."""
        from memalpha.lm.sampling.generation import sampler_for

        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = self.temperature if temperature is None else temperature
        prompts = [
            self.tokenizer(chat_prompt_text(self.tokenizer, c, enable_thinking), add_special_tokens=False)[
                "input_ids"
            ]
            for c in conversations
        ]
        if not prompts:
            return []
        # longest first: batches hold similar lengths (little padding), and an OOM shows up at once
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        with answering_weights(self.model, self.adapter):
            out = sampler_for(self.model, self.tokenizer, self.backend, announce_as="reader")(
                [prompts[i] for i in order],
                max_new_tokens=max_new_tokens,
                temperature=temperature if temperature > 0 else 1.0,
                top_p=top_p,
                top_k=0,
                do_sample=temperature > 0,
                seed=seed,
                batch_size=self.batch_size,
            )
        results: list[LocalGeneration | None] = [None] * len(prompts)
        for j, i in enumerate(order):
            response = list(out.response_ids[j])
            text = self.tokenizer.decode(response, skip_special_tokens=True).strip()
            results[i] = LocalGeneration(text, len(prompts[i]), len(response), bool(out.truncated[j]))
        return [r for r in results if r is not None]

    def chat(
        self, conversations: Sequence[Conversation], sampling: ReaderSampling | None = None
    ) -> list[ReaderAnswer]:
        """Reply to each conversation; ``sampling`` replaces ``temperature`` and ``max_new_tokens``
        for this call where it sets them."""
        overrides = (
            {}
            if sampling is None
            else {"temperature": sampling.temperature, "max_new_tokens": sampling.max_tokens}
        )
        return [
            ReaderAnswer(g.text, True, None) for g in self.generate(conversations, **overrides)
        ]
