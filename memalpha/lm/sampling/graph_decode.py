"""Sampling with a decoding step of fixed shapes over a static cache, replayed as a CUDA graph.

On a GPU a decoding step of a 4-bit LoRA policy is not bound by reading its weights (~1 ms for
Qwen3-4B in NF4) but by launching some two thousand small kernels from Python and by
dequantising every NF4 weight again at every token: ~150 ms a step. This backend removes both:

* **dense weights, made once per call.** Inside ``folded_adapters(model, quantised=True)``
  (:mod:`memalpha.lm.core.modes`) every LoRA layer runs one ``F.linear`` over ``W + s B A`` and
  every other 4-bit layer over its dequantised weight, in the layer's compute dtype (bf16 on a
  GPU). :func:`sample` opens that block around the whole call, so the copies are made once and
  freed before the policy's update.
* **a step whose tensors never move or change shape.** :class:`FixedCache` holds each layer's
  keys and values for the prompt plus ``max_new_tokens`` columns and writes a step's column
  where a device tensor says; the step reads only fixed buffers (the tokens ``[B, 1]``, their
  positions, that column) and builds its additive mask ``[B, 1, 1, S]`` from them inside the
  step. Rows that end keep running (their tokens are ignored), so the batch never shrinks.
  Such a step can be captured once with ``torch.cuda.CUDAGraph`` and replayed per token: one
  launch instead of thousands (:class:`ReplayedStep`). On the CPU the same step runs eagerly,
  which is how the tests check the whole loop without a GPU.

The draw happens inside the graph (``sampling``, :class:`InGraphSampler`): after the ``[B, V]``
logits (float32, as the other loops give them to ``pick``; float64 for a float64 model) the
step filters and draws with :func:`memalpha.lm.sampling.filters.next_tokens` itself, writes the
tokens to a ``[chunk, B]`` buffer and feeds them to the next step, so no token goes to the host
between steps. The host reads the buffer once every :data:`EOS_CHECK_STEPS` steps, cuts each
row after its first end token and stops when every row has ended; rows that ended keep running
until then, harmlessly. The uniform variates come from the global RNG outside the graph, a
chunk's worth at a time, into a fixed buffer the step reads (:class:`Variates`): the graph holds
no random-number state, and the live rows take the variates in the order the reference loop
draws them (one per live row per step), so on the CPU a seeded call samples the tokens of
:func:`memalpha.lm.sampling.fused_decode.decode_fused` up to float rounding, rows ending or not. With
``pick=`` instead the host draws after every step (one host read a token), the tests' reference.

A step attends over a **bucket** of the static cache, not the whole of it: its first ``width``
columns, ``width`` the filled length rounded up to a multiple of ``bucket_columns``
(:data:`BUCKET_COLUMNS` by default; :func:`bucket_width`), masked beyond the tokens written. The
shapes of a step stay fixed while the filled length stays inside one bucket, so each width used
gets its own step, captured when first needed (:class:`BucketedSteps`): a call of 2,048 new
tokens captures 8 graphs at 256 columns a bucket, and reads at most 255 unfilled columns a step.
``bucket_columns=None`` attends over the whole static length.

The prompt is prefilled once per distinct prompt when the caller says which rows share one
(``prompt_of_row``) and what prefix they share (a :class:`~memalpha.lm.core.prompt_sharing.SharedPrefix`,
computed once at batch size 1): the prefix's keys are copied into every row, each distinct rest
of a prompt but its last column runs once, alone at batch size 1 without its padding, and its
cache columns are copied into the rows that hold it (:meth:`FixedStep.prefill`). No prefill
builds a ``[B, 1, P, P]`` mask, identical prompts or distinct: a prompt without a prefix runs
causal with no mask at all, one on a prefix with the ``[1, 1, Q, L + Q]`` mask of its own. The last prompt
column runs as a step of its own, so the first new token comes out of the same code as every later one.

Decoders qualify when :func:`supports` says so: every layer plain full attention, an
attention implementation that takes a 4-D additive mask (``sdpa``, ``eager``), linear layers
that are ``torch.nn.Linear``, bitsandbytes ``Linear4bit`` or plain LoRA over those.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from transformers.cache_utils import Cache, DynamicLayer

from memalpha.lm.core.attention import MASK_IMPLEMENTATIONS
from memalpha.lm.core.logits import finalise_logits, score_dtype
from memalpha.lm.core.modes import eval_mode, folded_adapters, is_four_bit, lora_linear_types, plain_adapters
from memalpha.lm.core.prompt_sharing import (
    PaddedBatch,
    PromptSharing,
    SharedPrefix,
    full_attention_layers,
    new_cache,
    split_decoder_and_head,
)
from memalpha.lm.sampling.filters import next_tokens
from memalpha.lm.sampling.responses import Responses

BUCKET_COLUMNS = 256
"""Columns by which a step's attention span grows (:func:`bucket_width`): few enough graphs per
call (one per bucket) and at most 255 unfilled columns read a step."""

EOS_CHECK_STEPS = 16
"""Decoding steps between two host reads when the step samples inside the graph
(:class:`InGraphSampler`): the host reads the chunk's ``[steps, B]`` tokens once, checks for
end-of-sequence tokens and cuts what rows drew after theirs. A row that ended keeps running
(at most ``EOS_CHECK_STEPS - 1`` wasted steps once every row has ended, 1/16 of a host read a
token)."""


def bucket_width(filled: int, bucket_columns: int | None, capacity: int) -> int:
    """The columns a step attends over when the cache holds ``filled`` columns: ``filled`` rounded
    up to a multiple of ``bucket_columns``, at most ``capacity``; ``capacity`` when
    ``bucket_columns`` is None (the whole static cache)."""
    if not 0 < filled <= capacity:
        raise ValueError(f"a step needs 1 to {capacity} filled columns, got {filled}")
    if bucket_columns is None:
        return capacity
    if bucket_columns < 1:
        raise ValueError(f"bucket_columns must be >= 1 or None, got {bucket_columns}")
    return min(-(-filled // bucket_columns) * bucket_columns, capacity)


def first_rows(prompt_of_row: Sequence[int]) -> list[int]:
    """The first row of each distinct prompt, given every row's prompt index numbered in order of
    first appearance (as :func:`~memalpha.lm.core.prompt_sharing.unique_rows` numbers them)."""
    first: list[int] = []
    for row, prompt in enumerate(prompt_of_row):
        if prompt == len(first):
            first.append(row)
        elif not 0 <= prompt < len(first):
            raise ValueError(
                f"prompt_of_row must number prompts in order of first appearance, got {list(prompt_of_row)}"
            )
    return first


def supports(model) -> str | None:
    """Why this backend cannot sample from ``model``; None when it can."""
    try:
        decoder, _, config = split_decoder_and_head(model)
    except ValueError as error:
        return str(error)
    if full_attention_layers(config) is None:
        return "the decoder has sliding-window, chunked or other non-plain attention layers"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASK_IMPLEMENTATIONS:
        return (
            f"attention implementation {implementation!r} takes "
            f"no 4-D additive mask (use one of {MASK_IMPLEMENTATIONS})"
        )
    device = decoder.get_input_embeddings().weight.device
    if device.type not in ("cpu", "cuda"):
        return f"the decoder is on {device.type}; this backend runs on cuda (captured) or cpu (eager)"
    for name, module in model.named_modules():
        reason = _unfoldable(module)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def _unfoldable(module) -> str | None:
    """Why ``module`` cannot run from a dense weight inside the step; None when it can (or is no
    linear layer)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        BaseTunerLayer = ()  # no PEFT: no adapter layer to check (isinstance of () is False)
    if isinstance(module, BaseTunerLayer):
        if type(module) not in lora_linear_types():
            return f"a {type(module).__name__} adapter layer (only LoRA linear layers fold)"
        if module.merged:
            return "a LoRA layer merged into its base (unmerge it: the fold adds the update itself)"
        active = [name for name in module.active_adapters if name in module.lora_A]
        if active and not module.disable_adapters and plain_adapters(module, quantised=True) is None:
            return "a LoRA variant (DoRA), a LoRA bias or a base layer that does not fold"
        return None
    if (
        isinstance(module, torch.nn.Linear)
        and type(module) is not torch.nn.Linear
        and not is_four_bit(module)
    ):
        if getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False):
            return (
                "a 4-bit layer that bitsandbytes repacked for its "
                "CPU kernel (turn its support_avx512bf16_for_cpu off)"
            )
        return f"a {type(module).__name__} layer, which has no dense copy here"
    if type(module) is torch.nn.Linear and not module.weight.is_floating_point():
        return "a linear layer with a non-float weight"
    return None


class FixedLayer(DynamicLayer):
    """One layer's keys and values in buffers of ``capacity`` columns, allocated at the first
    write and never moved. A write goes to the columns the owning :class:`FixedCache` names (a
    device tensor, so a captured step writes where the tensor says at replay); attention sees
    the first ``width`` columns. Unwritten columns hold zeros, never garbage: they are masked,
    and a masked NaN would still poison the sum (0 x NaN)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.columns: torch.Tensor | None = None
        self.width = capacity
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads = key_states.shape[:2]
        self.key_buffer = key_states.new_zeros((rows, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_zeros((rows, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.key_buffer.index_copy_(2, self.columns, key_states)
        self.value_buffer.index_copy_(2, self.columns, value_states)
        self.keys = self.key_buffer[:, :, : self.width]
        self.values = self.value_buffer[:, :, : self.width]
        return self.keys, self.values


class FixedCache(Cache):
    """:class:`FixedLayer` per decoder layer, all written at the same columns."""

    @classmethod
    def for_config(cls, config, capacity: int, rows: int) -> FixedCache:
        count = full_attention_layers(config)
        if count is None:
            raise ValueError("graph decoding takes decoders whose every layer is plain full attention")
        return cls(count, capacity, rows)

    def __init__(self, layers: int, capacity: int, rows: int):
        super().__init__(layers=[FixedLayer(capacity) for _ in range(layers)])
        self.capacity = capacity
        self.rows = rows

    def write_at(self, columns: torch.Tensor, width: int) -> None:
        """Make the next forward write its tokens at ``columns`` and attend over ``width`` columns."""
        for layer in self.layers:
            layer.columns, layer.width = columns, width

    def write_rows(
        self, rows: torch.Tensor, columns: torch.Tensor, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Write ``layers`` (one ``(keys, values)`` ``[1, KV, n, D]`` pair per layer, the same for
        every row) at the ``n`` ``columns`` of the batch's ``rows``, allocating the buffers (for
        :attr:`rows` rows) if this is the first write."""
        at = (rows[:, None], columns[None, :])  # [rows, n] of the buffers' [B, S] dimensions
        for layer, (keys, values) in zip(self.layers, layers):
            if not layer.is_initialized:
                layer.lazy_initialization(
                    keys.expand(self.rows, -1, -1, -1), values.expand(self.rows, -1, -1, -1)
                )
            layer.key_buffer.transpose(1, 2)[at] = keys.transpose(1, 2)
            layer.value_buffer.transpose(1, 2)[at] = values.transpose(1, 2)


class ReplayedStep:
    """Runs ``step`` -- a function of fixed buffers that returns a tensor -- eagerly, or, with
    ``capture``, records it once as a CUDA graph (after warm-up runs on a side stream, which
    also settle lazy allocations and kernel choices) and replays it on every later call.

    A replay rewrites the tensor the capture returned, so read it before the next call. The
    warm-up runs really execute ``step``: it must be idempotent for buffers that do not change
    between calls (a step writing its cache column is: it writes the same values again), and
    the buffers it advances itself (``state``: the in-graph sampler's tokens, positions and
    counters) are copied before the warm-up and put back after every warm-up run, so each run
    starts where the real step will (a second run from the advanced state would write one
    history slot or cache column past the step's own: out of bounds when the step is a chunk's
    last or the cache's last) and the replay that follows the capture is the step's first real run.
    A capture that fails raises: a backend named for its captured graph never decodes eagerly
    without saying so."""

    def __init__(
        self, step: Callable[[], torch.Tensor], capture: bool, warmup: int = 2,
        state: Sequence[torch.Tensor] = (),
    ):
        self.step = step
        self.state = tuple(state)
        self.capture = capture
        self.warmup = warmup
        self.graph = None
        self.output: torch.Tensor | None = None
        self.captured = False
        self.capture_s = 0.0

    def __call__(self) -> torch.Tensor:
        if self.capture and self.graph is None:
            self._record()
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.output

    def warm_up(self) -> None:
        """Run ``step`` ``warmup`` times, each from the ``state`` it found (put back after every
        run, also when one raises): the runs write only the slots and columns the real step will."""
        saved = [tensor.clone() for tensor in self.state]
        for _ in range(self.warmup):
            try:
                self.step()
            finally:
                for tensor, copy in zip(self.state, saved):
                    tensor.copy_(copy)

    def _record(self) -> None:
        start = time.perf_counter()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(side):
                    self.warm_up()
            finally:
                torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                output = self.step()
        finally:
            self.capture_s = time.perf_counter() - start
        self.graph, self.output, self.captured = graph, output, True

    def close(self) -> None:
        """Drop the graph and its memory pool."""
        self.graph = self.output = None


def compiled_step(
    step: Callable[[int], torch.Tensor], backend: str | None
) -> Callable[[int], torch.Tensor]:
    """``step`` compiled by ``torch.compile`` with ``backend`` (None: ``step`` itself), whole
    (``fullgraph``: a graph break is an error, not a silent return to eager) and with fixed shapes:
    each attention width compiles once, at its first call, before it is captured."""
    if backend is None:
        return step
    return torch.compile(step, backend=backend, fullgraph=True, dynamic=False)


def compile_limits(capacity: int, bucket_columns: int | None):
    """Dynamo's settings for one :func:`decode_in_graph` whose step is compiled: room for one compilation
    per attention width the call can use (the default limit of 8 would send the ninth width back
    to eager without a word), and an error instead of that silent fall-back."""
    widths = 1 if bucket_columns is None else -(-capacity // bucket_columns) + 1
    return torch._dynamo.config.patch(recompile_limit=max(8, widths + 1), fail_on_recompile_limit_hit=True)


class BucketedSteps:
    """A :class:`ReplayedStep` per attention width, each made (and, on CUDA, captured) when the
    width is first asked for. The widths of a call only grow, so the step of the width before is
    closed then, and one graph at a time holds memory. ``capture`` False runs every width eagerly
    (the CPU, and the benchmark's eager reference)."""

    def __init__(
        self, step: Callable[[int], torch.Tensor], capture: bool, state: Sequence[torch.Tensor] = ()
    ):
        self.step = step
        self.state = tuple(state)
        self.capture = capture
        self.width: int | None = None
        self.current: ReplayedStep | None = None
        self.widths: list[int] = []
        self.capture_s = 0.0
        self.captured = capture

    def __call__(self, width: int) -> torch.Tensor:
        if width != self.width:
            self.close()
            self.current = ReplayedStep(partial(self.step, width), self.capture, state=self.state)
            self.width = width
            self.widths.append(width)
        return self.current()

    def close(self) -> None:
        """Drop the current graph, if any (the capture time is kept)."""
        if self.current is not None:
            self.capture_s += self.current.capture_s
            self.current.close()
            self.current = None


class FixedStep:
    """The buffers of one batch's decoding and the step that reads them.

    ``tokens`` ``[B, 1]`` and ``positions`` ``[B, 1]`` are the step's inputs, ``column`` ``[1]`` the
    cache column they are written at, and ``filled`` (a host int the loop keeps, no device read)
    the columns the cache holds once the step has run; ``padding`` ``[B, 1, 1, S]`` is True on the
    prompt's padded columns. A query may attend to a column unless it is padding or lies after
    ``column``: the rule of a growing cache's mask, rebuilt inside the step from these buffers.
    ``bucket_columns`` sets the widths a step attends over (:func:`bucket_width`)."""

    def __init__(self, decoder, head, config, batch: PaddedBatch, max_new_tokens: int,
                 bucket_columns: int | None = BUCKET_COLUMNS):
        self.decoder, self.head, self.config = decoder, head, config
        rows, self.prompt_width = batch.input_ids.shape
        device = batch.input_ids.device
        self.capacity = self.prompt_width + max_new_tokens
        self.bucket_columns = bucket_columns
        self.cache = FixedCache.for_config(config, self.capacity, rows)
        self.dtype = decoder.get_input_embeddings().weight.dtype  # the activations', so the mask's
        self.batch = batch
        padding = torch.zeros((rows, self.capacity), dtype=torch.bool, device=device)
        padding[:, : self.prompt_width] = batch.attention_mask == 0
        self.padding = padding[:, None, None, :]
        self.span = torch.arange(self.capacity, device=device)
        self.tokens = batch.input_ids[:, -1:].clone()
        self.positions = batch.position_ids[:, -1:].clone()
        self.column = torch.full((1,), self.prompt_width - 1, dtype=torch.long, device=device)
        self.filled = self.prompt_width
        self.open = torch.zeros((rows, 1, 1, self.capacity), dtype=self.dtype, device=device)

    def width(self) -> int:
        """The columns the next step attends over."""
        return bucket_width(self.filled, self.bucket_columns, self.capacity)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden[:, -1:])[:, -1]  # [B, 1, H] in, as model.forward calls the head
        return finalise_logits(logits.to(score_dtype(logits.dtype)), self.config)

    def prefill(
        self, prefix: SharedPrefix | None = None, prompt_of_row: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Fill the cache with every prompt column (eagerly, once); the ``[B, V]`` logits of the
        first new token.

        ``prefix`` (columns ``[0, L)`` of every row, the batch laid out with ``shared_prefix=L``)
        is copied in; ``prompt_of_row`` (every row's distinct prompt, numbered in order of first
        appearance; None: every row its own) says which rows hold the same prompt, whose columns
        ``[L, P - 1)`` run once and are copied to the others. The last prompt column then runs as
        a step (:meth:`forward`) for every row."""
        self.prefill_columns(prefix, prompt_of_row)
        return self.forward(self.width())

    def prefill_columns(
        self, prefix: SharedPrefix | None = None, prompt_of_row: Sequence[int] | None = None
    ) -> None:
        """:meth:`prefill` but the last prompt column: the cache holds columns ``[0, P - 1)``
        after it, and the first decoding step runs the last prompt column."""
        rows = self.tokens.shape[0]
        owners = list(range(rows) if prompt_of_row is None else prompt_of_row)
        first = first_rows(owners)
        stop = self.prompt_width - 1  # the columns before the last
        length = prefix.length if prefix is not None else 0
        if length > stop:
            raise ValueError(f"a {length}-token prefix leaves no column of a {self.prompt_width}-wide prompt")
        if stop == 0:
            return
        device = self.span.device
        if length:
            self.cache.write_rows(torch.arange(rows, device=device), self.span[:length], prefix.layers)
        kept = self.batch.attention_mask[first, length:stop].tolist()  # one read, in the prefill only
        for prompt, (row, mask) in enumerate(zip(first, kept)):
            columns = torch.tensor(
                [length + c for c, on in enumerate(mask) if on], dtype=torch.long, device=device
            )
            if len(columns):
                holders = torch.tensor(
                    [r for r, owner in enumerate(owners) if owner == prompt], device=device
                )
                self.cache.write_rows(holders, columns, self._prompt_columns(prefix, row, columns))

    def _prompt_columns(
        self, prefix: SharedPrefix | None, row: int, columns: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's ``(keys, values)`` ``[1, KV, len(columns), D]`` of the batch's ``row`` at
        ``columns`` (its unpadded prompt columns after the prefix), run alone on top of
        ``prefix``: a causal prefill at batch size 1 with no padding, which builds no mask at all
        without a prefix, a ``[1, 1, Q, L + Q]`` one on it, and none per row of the batch."""
        cache = prefix.cache(self.decoder, 1) if prefix is not None else new_cache(self.decoder)
        length = prefix.length if prefix is not None else 0
        self.decoder(
            input_ids=self.batch.input_ids[row : row + 1, columns],
            attention_mask=torch.ones((1, length + len(columns)), dtype=torch.long, device=columns.device),
            position_ids=self.batch.position_ids[row : row + 1, columns],
            past_key_values=cache,
            use_cache=True,
        )
        return [(layer.keys[:, :, length:], layer.values[:, :, length:]) for layer in cache.layers]

    def forward(self, width: int) -> torch.Tensor:
        """One token per row from the buffers, attending over the cache's first ``width``
        columns; the ``[B, V]`` logits of the next. Fixed shapes for a given ``width``, no host
        synchronisation: capturable."""
        self.cache.write_at(self.column, width)
        blocked = self.padding[..., :width] | (self.span[:width] > self.column)
        mask = self.open[..., :width].masked_fill(blocked, torch.finfo(self.dtype).min)
        hidden = self.decoder(
            input_ids=self.tokens, attention_mask=mask, position_ids=self.positions,
            past_key_values=self.cache, use_cache=True,
        ).last_hidden_state
        return self._logits(hidden)

    def step(self, width: int | None = None) -> torch.Tensor:
        """A decoding step after the prefill (:meth:`forward`; ``width`` None: the whole cache)."""
        return self.forward(self.capacity if width is None else width)

    def advance(self, picked: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Feed ``picked`` (the tokens of ``rows``, all rows when None) to the next step, one
        column further; the other rows' tokens stay as they were (their outputs are ignored)."""
        if rows is None:
            self.tokens.copy_(picked[:, None])
        else:
            self.tokens[rows, 0] = picked
        self.positions.add_(1)
        self.column.add_(1)
        self.filled += 1

    def feed(self, picked: torch.Tensor) -> None:
        """Feed every row's token of ``picked`` ``[B]`` to the next step, one column further, on
        the device only (inside a captured step); the caller counts ``filled`` on the host."""
        self.tokens.copy_(picked[:, None])
        self.positions.add_(1)
        self.column.add_(1)


@dataclass(frozen=True)
class GraphSampling:
    """How the step picks its tokens inside the graph: greedy, or a draw after temperature,
    top-k and top-p, the rules and code of :func:`memalpha.lm.sampling.filters.next_tokens`
    (which :meth:`pick` calls), only with the uniform variates handed in."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def pick(self, logits: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
        """``[B]`` tokens of ``[B, V]`` logits, drawing with ``uniform`` ``[B, 1]`` when sampling."""
        return next_tokens(
            logits, do_sample=self.do_sample, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, uniform=uniform,
        )


class Variates:
    """The uniform variates a captured step draws with, taken from the global RNG outside it.

    ``buffer`` holds the next ``size`` variates of the global stream (one chunk's worth: every
    row at every step). At each step the live rows take the next ones in row order and
    ``used`` (a device counter) moves past them, so the rows consume the stream exactly as
    :func:`~memalpha.lm.sampling.filters.draw` does in the reference loop, which draws
    ``torch.rand(live, 1)`` per step for the live rows only. Between chunks :meth:`refill`
    shifts the unused variates to the front and draws as many new ones as were used: on the CPU
    a seeded call then samples the reference loop's tokens, rows ending or not."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device):
        self.buffer = torch.zeros(size, dtype=dtype, device=device)
        self.used = torch.zeros((), dtype=torch.long, device=device)
        self.spent = size  # host count of the front variates already used: all, before the first draw

    def refill(self) -> None:
        """Outside the graph, before a chunk: drop the variates the last chunk used (``spent``,
        which the host counts from the tokens it read) and draw as many new ones behind the rest."""
        kept = self.buffer.numel() - self.spent
        if kept:
            self.buffer[:kept] = self.buffer[self.spent :].clone()
        self.buffer[kept:].uniform_()
        self.used.zero_()
        self.spent = 0

    def take(self, alive: torch.Tensor) -> torch.Tensor:
        """Inside the graph: ``[B, 1]`` variates, the next one for each row where ``alive``; the
        rows that ended get an arbitrary one, which nothing keeps."""
        order = (alive.cumsum(0) - 1 + self.used).clamp_(0, self.buffer.numel() - 1)
        self.used.add_(alive.sum())
        return self.buffer.index_select(0, order)[:, None]


class InGraphSampler:
    """The part of a decoding step after the logits, inside the captured graph: pick every row's
    token (:class:`GraphSampling`), write it to ``history`` at ``slot`` (the step within the chunk),
    mark the rows that drew an end token no longer ``alive`` and feed the tokens to the next
    step. Nothing here reads the device from the host: :meth:`read` does, once a chunk of
    :data:`EOS_CHECK_STEPS` steps, and cuts every row after its first end token."""

    def __init__(self, fixed: FixedStep, sampling: GraphSampling, eos_ids: Sequence[int], chunk: int):
        rows, device = fixed.tokens.shape[0], fixed.tokens.device
        self.fixed, self.sampling, self.chunk = fixed, sampling, chunk
        self.eos = torch.tensor(sorted({int(t) for t in eos_ids}), dtype=torch.long, device=device)
        self.history = torch.zeros((chunk, rows), dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.alive = torch.ones(rows, dtype=torch.bool, device=device)
        dtype = score_dtype(fixed.dtype)
        self.variates = Variates(chunk * rows, dtype, device) if sampling.do_sample else None

    def state(self) -> list[torch.Tensor]:
        """The buffers a step advances (what a capture's warm-up must put back)."""
        fixed = self.fixed
        moving = [fixed.tokens, fixed.positions, fixed.column, self.history, self.slot, self.alive]
        return moving + ([self.variates.used] if self.variates is not None else [])

    def step(self, width: int) -> torch.Tensor:
        """One capturable step: the logits over ``width`` columns, the picked ``[B]`` tokens."""
        logits = self.fixed.forward(width)
        uniform = self.variates.take(self.alive) if self.variates is not None else None
        picked = self.sampling.pick(logits, uniform.to(logits.dtype) if uniform is not None else None)
        self.history.index_copy_(0, self.slot, picked[None])
        self.alive &= (picked[:, None] != self.eos).all(-1)
        self.slot.add_(1)
        self.fixed.feed(picked)
        return picked

    def begin(self) -> None:
        """Outside the graph, before a chunk: back to its first slot, new variates for the used."""
        self.slot.zero_()
        if self.variates is not None:
            self.variates.refill()

    def read(self, steps: int, responses: Responses) -> None:
        """The one host read of a chunk of ``steps`` steps: append each live row's tokens to
        ``responses`` up to its end token, and count the variates the live rows used (one per
        live row per step, as :meth:`Variates.take` counts them)."""
        used = 0
        for tokens in self.history[:steps].tolist():
            if not responses.live:
                break
            used += len(responses.live)
            responses.keep_only(responses.add([tokens[row] for row in responses.live]))
        if self.variates is not None:
            self.variates.spent = used


def decode_in_graph(
    decoder,
    head: torch.nn.Module,
    config,
    batch: PaddedBatch,
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pick: Callable[[torch.Tensor], torch.Tensor] | None = None,
    sampling: GraphSampling | None = None,
    capture: bool | None = None,
    stats: dict | None = None,
    bucket_columns: int | None = BUCKET_COLUMNS,
    prefix: SharedPrefix | None = None,
    prompt_of_row: Sequence[int] | None = None,
    eos_check_steps: int = EOS_CHECK_STEPS,
    compile_backend: str | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """New tokens for every row of ``batch`` (laid out by
    :func:`memalpha.lm.core.prompt_sharing.pad_prompt_response`, any shared prefix included): each
    row's tokens up to and including its first end-of-sequence token, and whether it ran out of
    ``max_new_tokens`` without one.

    Pass one of ``sampling`` or ``pick``. With ``sampling`` (:class:`GraphSampling`) the step picks
    the tokens itself, inside the graph, and the host reads them once every ``eos_check_steps``
    steps (:class:`InGraphSampler`); seeded, it draws the variates the reference loop draws.
    With ``pick`` the step ends at the logits and the host picks after every step: ``pick`` maps
    ``[live, V]`` logits (float32; float64 for a float64 model) to ``[live]`` token ids.

    ``capture`` None captures the step on CUDA and runs it eagerly elsewhere; True insists on
    capturing, False never captures. A capture that fails raises. ``stats``, when given, receives
    ``captured``, ``prefill_s``, ``decode_s`` (the token loop, capture included), ``capture_s``
    (all widths' captures), ``steps`` (forwards after the prefill), ``widths`` (the attention
    widths the steps used, one graph each) and ``host_reads`` (the times the loop read the tokens
    back to the host). ``bucket_columns`` sets those widths (:func:`bucket_width`; None: the whole
    static cache). ``prefix`` and ``prompt_of_row``
    (:class:`~memalpha.lm.core.prompt_sharing.PromptSharing`) prefill each distinct prompt once
    (:meth:`FixedStep.prefill`). ``compile_backend`` (e.g. ``inductor``; None: off)
    compiles the step whole with ``torch.compile`` before each width is captured
    (:func:`compiled_step`): fewer, fused kernels per token, one compilation per width (on CUDA
    the first warm-up call before a capture compiles, so its time falls in ``capture_s``). Call
    under ``torch.no_grad()``, in eval mode (dropout cannot be replayed), and inside
    ``folded_adapters(model, quantised=True)`` for the dense weights (:func:`sample` does all three).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if (pick is None) == (sampling is None):
        raise ValueError("pass exactly one of pick (picked on the host) and sampling (picked in the graph)")
    if eos_check_steps < 1:
        raise ValueError(f"eos_check_steps must be >= 1, got {eos_check_steps}")
    if any(module.training for module in decoder.modules()):
        raise ValueError("graph decoding runs in eval mode: dropout in training mode cannot be replayed")
    on_cuda = batch.input_ids.device.type == "cuda"
    if capture and not on_cuda:
        raise ValueError("capture=True needs the batch on a CUDA device")
    capture = on_cuda if capture is None else capture
    fixed = FixedStep(decoder, head, config, batch, max_new_tokens, bucket_columns)
    responses = Responses(batch.input_ids.shape[0], eos_ids)
    start = time.perf_counter()
    if sampling is None:
        logits = fixed.prefill(prefix, prompt_of_row)
        runner = BucketedSteps(compiled_step(fixed.step, compile_backend), capture)
    else:
        fixed.prefill_columns(prefix, prompt_of_row)
        sampler = InGraphSampler(fixed, sampling, eos_ids, min(eos_check_steps, max_new_tokens))
        step = compiled_step(sampler.step, compile_backend)
        runner = BucketedSteps(step, capture, state=sampler.state())
    if on_cuda:
        torch.cuda.synchronize(batch.input_ids.device)  # once, so that prefill_s is the prefill's
    loop_start = time.perf_counter()
    limits = compile_limits(fixed.capacity, bucket_columns) if compile_backend else contextlib.nullcontext()
    try:
        with limits:
            if sampling is None:
                steps, reads = _picked_on_the_host(fixed, runner, responses, logits, max_new_tokens, pick)
            else:
                steps, reads = _picked_in_the_graph(fixed, runner, responses, sampler, max_new_tokens)
    finally:
        runner.close()
    if stats is not None:  # the loop ends on a host read of the tokens: its time is the device's too
        stats.update(
            captured=runner.captured, prefill_s=loop_start - start, decode_s=time.perf_counter() - loop_start,
            capture_s=runner.capture_s, steps=steps, widths=runner.widths, host_reads=reads,
        )
    return responses.tokens, responses.truncated


def _picked_on_the_host(
    fixed: FixedStep, runner: BucketedSteps, responses: Responses, logits: torch.Tensor, max_new_tokens: int,
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[int, int]:
    """The loop that picks on the host after every step, for the live rows only, starting from
    the prefill's ``logits``; ``(steps, host reads)``: one read a token."""
    rows: torch.Tensor | None = None  # the live rows' indices; None while every row is live
    steps = reads = 0
    for step in range(max_new_tokens):
        picked = pick(logits if rows is None else logits[rows])
        keep = responses.add(picked)
        reads += 1
        if not keep or step == max_new_tokens - 1:
            break
        fixed.advance(picked, rows)
        if len(keep) < len(responses.live):
            responses.keep_only(keep)
            rows = torch.tensor(responses.live, device=fixed.tokens.device)
        logits = runner(fixed.width())
        steps += 1
    return steps, reads


def _picked_in_the_graph(
    fixed: FixedStep,
    runner: BucketedSteps,
    responses: Responses,
    sampler: InGraphSampler,
    max_new_tokens: int,
) -> tuple[int, int]:
    """The loop whose step picks inside the graph, from the last prompt column on: chunks of
    ``sampler.chunk`` steps, each followed by one host read; it stops after the chunk in which
    every row ended. ``(steps, host reads)``."""
    steps = reads = 0
    while steps < max_new_tokens and responses.live:
        count = min(sampler.chunk, max_new_tokens - steps)
        sampler.begin()
        for _ in range(count):
            runner(fixed.width())
            fixed.filled += 1
        sampler.read(count, responses)
        steps += count
        reads += 1
    return steps, reads


def sample(
    model,
    prompt_ids: list[list[int]],
    *,
    pad_id: int,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pick: Callable[[torch.Tensor], torch.Tensor] | None = None,
    sampling: GraphSampling | None = None,
    batch_size: int | None = None,
    capture: bool | None = None,
    stats: dict | None = None,
    bucket_columns: int | None = BUCKET_COLUMNS,
    share_prefix: bool = True,
    eos_check_steps: int = EOS_CHECK_STEPS,
    compile_backend: str | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """Responses and truncation flags for every prompt, ``batch_size`` prompts per :func:`decode_in_graph`
    (all in one when None), left-padded as :mod:`memalpha.lm.core.prompt_sharing` lays them out; with
    ``share_prefix`` each batch's shared prefix and each distinct prompt are prefilled once
    (:class:`~memalpha.lm.core.prompt_sharing.PromptSharing`), as ``generate`` shares them.

    The dense weights are made once for the whole call and freed when it returns; the model runs
    in eval mode under ``torch.no_grad()`` and its training mode is restored afterwards. Seeding
    is the caller's (``memalpha.lm.sampling.generation.generate`` forks and seeds the global RNG). Raises
    ValueError naming the reason when :func:`supports` refuses the model. ``stats`` receives the
    last batch's (:func:`decode_in_graph`). ``sampling`` picks inside the graph, ``pick`` on the host
    after every step (:func:`decode_in_graph`; one of the two; ``eos_check_steps`` with ``sampling``).

    A caller that lays out its own batches, as ``generate`` does, opens
    ``folded_adapters(model, quantised=True)`` once itself and calls :func:`decode_in_graph` per batch.
    """
    reason = supports(model)
    if reason is not None:
        raise ValueError(f"the cuda-graph backend cannot sample from this model: {reason}")
    decoder, head, config = split_decoder_and_head(model)
    device = decoder.get_input_embeddings().weight.device
    step = batch_size or max(len(prompt_ids), 1)
    responses: list[list[int]] = []
    truncated: list[bool] = []
    with eval_mode(model), torch.no_grad(), folded_adapters(model, quantised=True):
        for start in range(0, len(prompt_ids), step):
            chunk = prompt_ids[start : start + step]
            sharing = PromptSharing.of(decoder, chunk, share_prefix)
            padded = sharing.layout(chunk, [[] for _ in chunk], pad_id, device)
            kept, cut = decode_in_graph(
                decoder, head, config, padded, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pick=pick,
                sampling=sampling, capture=capture, stats=stats, bucket_columns=bucket_columns,
                prefix=sharing.prefix, prompt_of_row=sharing.prompt_of_row(chunk),
                eos_check_steps=eos_check_steps, compile_backend=compile_backend,
            )
            responses.extend(kept)
            truncated.extend(cut)
    return responses, truncated
