"""A decoding step for Llama-family decoders run from their weights, with the prompt keys shared
by the rows that sample the same prompt.

At one token per row per step, a decoding step of a small model is bound by reading weights
and keys, and by the number of operations more than by arithmetic. :func:`decode_fused` therefore
runs the layers itself instead of through the model's modules:

* **LoRA folded, ``q/k/v`` stacked, products packed.** A LoRA update is folded into its weight
  (``W + s B A``, :func:`memalpha.lm.core.modes.folded_weight`) and ``q/k/v`` are one matrix:
  five products per layer instead of seven, or twenty-one with PEFT's LoRA layers (``gate/up``
  stay two products: stacked, they ran slower).
  In float32 on an MKL build each product's weight is also laid out once for the batch's rows
  (:mod:`memalpha.lm.sampling.packed_linear`), which a thin product reads faster than the plain weight.
  The weights are copies made when :meth:`FusedDecoder.build` runs (once per generation call);
  the model's own weights are never written.
* **the prompt's keys are read once per distinct prompt.** A GRPO group samples one prompt
  ``n`` times. The prompt's keys and values are kept once per distinct prompt
  (``[U, kv_heads, P, head_dim]``) and the queries of its rows attend to them together, as
  ``n x group`` query heads per key head (one kernel call, the way grouped-query attention
  already shares keys among heads); each row's own new tokens are attended separately, and the
  two parts are combined through their log-sum-exp (the split softmax of flash-decoding and of
  vLLM's cascade attention). Both parts run PyTorch's CPU flash-attention kernel, which returns
  that log-sum-exp. A plain cache repeats the prompt's keys to every row and reads them ``n``
  times per step.

The rotary embedding, activation and head are the model's own modules, the RMSNorms its own
weights (one fused ``rms_norm`` for float32), and the tokens equal the model's (the tests compare
greedy tokens with ``model.generate`` in float64, and in float32 with packed products, and
seeded samples with the unfolded path). :meth:`FusedDecoder.build` takes float32/float64 Llama,
Mistral (without sliding windows), Qwen2 and Qwen3 decoders on the CPU whose projections are
``torch.nn.Linear`` layers or plain PEFT LoRA layers over them, and returns None for anything
else (half precision, a GPU, 4-bit layers, DoRA, other architectures), which then decode
through ``model.generate`` (``hf-generate``).

Measured by ``experiments/bench/bench_decode.py`` (``docs/results.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memalpha.lm.core.logits import finalise_logits, score_dtype
from memalpha.lm.core.modes import effective_weight, foldable
from memalpha.lm.core.prompt_sharing import PaddedBatch, additive_mask, full_attention_layers
from memalpha.lm.sampling.packed_linear import LinearProduct
from memalpha.lm.sampling.responses import Responses

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, heads, D]`` as the Llama family applies it
    (``x cos + rotate_half(x) sin``): ``rotate_half(x)`` is ``x`` rolled by half its width with the
    first half negated, so ``signed_sin`` ``[B, D]`` is ``sin`` with its first half negated."""
    return torch.addcmul(x * cos[:, None], torch.roll(x, x.shape[-1] // 2, dims=-1), signed_sin[:, None])


def rms_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for the family's RMSNorm (``weight * x / rms(x)``, computed in float32): one
    fused operation for float32 inputs, the module itself otherwise (its own casts)."""
    if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
    return module(x)


def _plain_rms_norm(module) -> bool:
    """Whether ``module`` is the family's RMSNorm (a ``weight`` and a ``variance_epsilon``)."""
    return (
        module is not None
        and type(module).__name__.endswith("RMSNorm")
        and hasattr(module, "variance_epsilon")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
    )


def _stacked(modules: Sequence[torch.nn.Module], rows: int | None) -> LinearProduct | None:
    """The product with the effective weights of ``modules`` stacked along the output dimension,
    and their biases (zeros where one has none; None when none has any), packed for ``rows`` rows
    (:class:`~memalpha.lm.sampling.packed_linear.LinearProduct`); None if any module is not foldable. A
    single plain ``torch.nn.Linear``'s weight is not copied (its packed layout is)."""
    layers = [module.get_base_layer() if hasattr(module, "get_base_layer") else module for module in modules]
    biases = [getattr(layer, "bias", None) for layer in layers]
    if len(modules) == 1:
        weight = effective_weight(modules[0])
        return None if weight is None else LinearProduct.build(weight, biases[0], rows)
    bases = [_weight_2d(layer) for layer in layers]
    if any(weight is None for weight in bases) or len({weight.shape[1] for weight in bases}) != 1:
        return None
    stacked = bases[0].new_empty(sum(weight.shape[0] for weight in bases), bases[0].shape[1])
    start = 0
    for module, base in zip(modules, bases):  # each folded straight into its rows of the stack
        if effective_weight(module, out=stacked[start : start + base.shape[0]]) is None:
            return None
        start += base.shape[0]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [b.detach() if b is not None else stacked.new_zeros(w.shape[0]) for b, w in zip(biases, bases)]
        )
    return LinearProduct.build(stacked, bias, rows)


def _weight_2d(layer) -> torch.Tensor | None:
    """The 2-D weight of a linear layer; None when it has none."""
    weight = getattr(layer, "weight", None)
    return weight.detach() if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


@dataclass
class FusedLayer:
    """One decoder layer: its norms and activation, and its products."""

    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module
    qkv: LinearProduct
    q_norm: torch.nn.Module | None
    k_norm: torch.nn.Module | None
    output: LinearProduct
    gate: LinearProduct
    up: LinearProduct
    down: LinearProduct
    activation: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class FusedDecoder:
    """The decoder's layers as stacked weights plus its own norms, rotary embedding and head."""

    decoder: torch.nn.Module
    head: torch.nn.Module
    config: object
    layers: list[FusedLayer]
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    packed_head: LinearProduct | None = None

    @staticmethod
    def unsupported(decoder, config) -> str | None:
        """Why this step cannot reproduce ``decoder`` exactly (None when it can)."""
        kind = getattr(config, "model_type", None)
        if kind not in SUPPORTED_MODEL_TYPES:
            return f"model type {kind!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
        if full_attention_layers(config) is None or not hasattr(decoder, "rotary_emb"):
            return "the decoder has sliding-window or other non-plain attention layers"
        weight = decoder.embed_tokens.weight
        if weight.device.type != "cpu":
            return f"the decoder is on {weight.device.type}; the fused step runs PyTorch's CPU flash kernel"
        if cpu_flash_attention is None:
            return "this PyTorch build has no CPU flash-attention kernel"
        # half-precision attention would round more here
        if weight.dtype not in (torch.float32, torch.float64):
            return f"the weights are {weight.dtype}; the fused step takes float32 or float64"
        if not _plain_rms_norm(getattr(decoder, "norm", None)):
            return "the final norm is not the family's RMSNorm"
        for index, layer in enumerate(decoder.layers):
            attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            names = ("q_proj", "k_proj", "v_proj", "o_proj")
            if attention is None or mlp is None or not all(hasattr(attention, n) for n in names):
                return f"layer {index} has no q/k/v/o projections"
            if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
                return f"layer {index} has no gated MLP"
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            norms += [getattr(attention, n) for n in ("q_norm", "k_norm") if hasattr(attention, n)]
            if not all(_plain_rms_norm(norm) for norm in norms):
                return f"layer {index} has a norm that is not the family's RMSNorm"
            for name in (*names, "gate_proj", "up_proj", "down_proj"):
                module = getattr(attention, name, None) or getattr(mlp, name)
                if not foldable(module):
                    return f"layer {index}'s {name} cannot be folded (a 4-bit base, DoRA or a LoRA bias)"
        return None

    @classmethod
    def build(cls, decoder, head, config, rows: int | None = None) -> FusedDecoder | None:
        """Stacked weights of every layer of ``decoder`` (LoRA folded in), packed for ``rows``
        sampled rows where MKL's packed product serves them (:mod:`memalpha.lm.sampling.packed_linear`;
        None: not packed); None when the decoder is not one this step reproduces exactly."""
        if cls.unsupported(decoder, config) is not None:
            return None
        layers = []
        with torch.no_grad():
            for layer in decoder.layers:
                attention, mlp = layer.self_attn, layer.mlp
                qkv = _stacked([attention.q_proj, attention.k_proj, attention.v_proj], rows)
                output = _stacked([attention.o_proj], rows)
                gate, up = _stacked([mlp.gate_proj], rows), _stacked([mlp.up_proj], rows)
                down = _stacked([mlp.down_proj], rows)
                if qkv is None or output is None or gate is None or up is None or down is None:
                    return None
                layers.append(
                    FusedLayer(
                        input_norm=layer.input_layernorm,
                        post_attention_norm=layer.post_attention_layernorm,
                        qkv=qkv,
                        q_norm=getattr(attention, "q_norm", None),
                        k_norm=getattr(attention, "k_norm", None),
                        output=output,
                        gate=gate,
                        up=up,
                        down=down,
                        activation=mlp.act_fn,
                    )
                )
            # the head runs as the model runs it unless its product can be packed
            head_product = _stacked([head], rows) if rows is not None else None
        packed_head = head_product if head_product is not None and head_product.packed is not None else None
        first = decoder.layers[0].self_attn
        head_dim = int(first.head_dim)
        heads = config.num_attention_heads
        kv_heads = config.num_key_value_heads
        return cls(
            decoder, head, config, layers, heads, kv_heads, head_dim, float(first.scaling), packed_head
        )


class PromptGroups:
    """Which distinct prompt each live row reads, as the index that gathers the rows' queries into
    ``[U, W, ...]`` (``W`` slots per prompt, the most rows any prompt has) and the index that
    takes each row's result back out of that layout."""

    def __init__(self, prompt_of_row: Sequence[int], device: torch.device | str = "cpu"):
        self.device = device
        self.update(list(prompt_of_row))

    def update(self, prompt_of_row: list[int]) -> None:
        """Renew the indices for ``prompt_of_row`` (distinct prompts numbered ``0..U-1``)."""
        self.prompt_of_row = prompt_of_row
        self.prompts = sorted(set(prompt_of_row))
        members = [[row for row, p in enumerate(prompt_of_row) if p == prompt] for prompt in self.prompts]
        self.width = max(len(rows) for rows in members)
        # padding slots gather row 0; no row's result is taken from them
        gather = [rows + [0] * (self.width - len(rows)) for rows in members]
        slot_of_row = [0] * len(prompt_of_row)
        for group, rows in enumerate(members):
            for slot, row in enumerate(rows):
                slot_of_row[row] = group * self.width + slot
        self.gather = torch.tensor(gather, dtype=torch.long, device=self.device)
        self.slot_of_row = torch.tensor(slot_of_row, dtype=torch.long, device=self.device)


cpu_flash_attention = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""PyTorch's CPU flash-attention kernel (what ``F.scaled_dot_product_attention`` runs on the CPU;
None in a build without it, where :meth:`FusedDecoder.build` declines):
``(out, lse)`` for queries ``[N, heads, L, D]``, keys and values ``[N, heads, S, D]`` and an
additive mask broadcast to ``[N, heads, L, S]``; ``lse`` ``[N, heads, L]`` is the natural
log-sum-exp of each query's scaled, masked scores, which is what combining two parts needs."""


def _prompt_part(q, keys, values, mask, groups: PromptGroups, kv_heads: int, scale: float):
    """Attention of every row's query ``[B, H, D]`` to its prompt's keys ``[U, KV, P, D]``: output
    and log-sum-exp per row and head (``[B, H, D]``, ``[B, H]``). ``mask`` is None or additive,
    ``[U, 1, 1, P]``."""
    heads, dim = q.shape[1:]
    per_kv = heads // kv_heads
    width = groups.width
    grouped = q[groups.gather].view(-1, width, kv_heads, per_kv, dim).transpose(1, 2)
    grouped = grouped.reshape(-1, kv_heads, width * per_kv, dim)  # [U, KV, W*G, D]
    out, lse = cpu_flash_attention(grouped, keys, values, 0.0, False, attn_mask=mask, scale=scale)

    def to_rows(t: torch.Tensor, trailing: tuple[int, ...]) -> torch.Tensor:
        t = t.reshape(-1, kv_heads, width, per_kv, *trailing).transpose(1, 2)  # [U, W, KV, G, ...]
        return t.reshape(-1, heads, *trailing)[groups.slot_of_row]  # [B, H, ...]

    return to_rows(out, (dim,)), to_rows(lse, ())


def _own_part(q, keys, values, kv_heads: int, scale: float):
    """Attention of every row's query ``[B, H, D]`` to its own new tokens ``keys``/``values``
    ``[B, KV, T, D]``: output and log-sum-exp per row and head."""
    rows, heads, dim = q.shape
    out, lse = cpu_flash_attention(
        q.view(rows, kv_heads, heads // kv_heads, dim), keys, values, 0.0, False, scale=scale
    )
    return out.reshape(rows, heads, dim), lse.reshape(rows, heads)


def combine(first, second) -> torch.Tensor:
    """Softmax attention over the union of two parts' keys from each part's normalised output and
    log-sum-exp (``[B, H, D]``, ``[B, H]``): the split softmax of flash-decoding. The first part's
    share of the whole is ``exp(lse_a) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_a - lse_b)``, so
    the result is ``lerp(out_b, out_a, sigmoid(lse_a - lse_b))``."""
    out_a, lse_a = first
    out_b, lse_b = second
    return torch.lerp(out_b, out_a, torch.sigmoid(lse_a - lse_b)[..., None])


def decode_fused(
    fused: FusedDecoder,
    batch: PaddedBatch,
    prompt_cache,
    prompt_of_row: Sequence[int],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[list[list[int]], list[bool]]:
    """New tokens for every row of ``batch``: each row's tokens up to and including its first
    end-of-sequence token, and whether it ran out of ``max_new_tokens`` without one.

    ``prompt_cache`` holds, for each distinct prompt, the keys and values of every prompt column
    but the last (``[U, kv_heads, P - 1, head_dim]`` per layer, laid out as ``batch``'s columns;
    None when ``P`` is 1); ``prompt_of_row[b]`` is the distinct prompt of row ``b`` (``0..U-1``,
    numbered in order of first appearance). Call under ``torch.no_grad()``.
    """
    rows = batch.input_ids.shape[0]
    device = batch.input_ids.device
    stop = batch.prompt_width - 1
    first_row: dict[int, int] = {}
    for row, prompt in enumerate(prompt_of_row):
        first_row.setdefault(prompt, row)
    prompt_layers = (
        [] if prompt_cache is None or stop == 0 else [(l.keys, l.values) for l in prompt_cache.layers]
    )
    masked = ~batch.attention_mask[[first_row[p] for p in range(len(first_row))], :stop].bool()[
        :, None, None, :
    ]
    sample = fused.layers[0].qkv.weight
    mask = additive_mask(masked, sample.dtype)
    groups = PromptGroups(prompt_of_row, device)
    own_keys = [
        sample.new_empty((rows, fused.kv_heads, max_new_tokens, fused.head_dim)) for _ in fused.layers
    ]
    own_values = [torch.empty_like(k) for k in own_keys]
    responses = Responses(rows, eos_ids)
    tokens = batch.input_ids[:, -1]
    positions = batch.position_ids[:, -1]
    heads, kv_heads = fused.heads, fused.kv_heads
    half = fused.head_dim // 2
    for step in range(max_new_tokens):
        x = fused.decoder.embed_tokens(tokens)  # [B, hidden]
        cos, sin = fused.decoder.rotary_emb(x[:, None], positions[:, None])
        cos, signed_sin = cos[:, 0], torch.cat((-sin[:, 0, :half], sin[:, 0, half:]), dim=-1)
        for index, layer in enumerate(fused.layers):
            qkv = layer.qkv(rms_norm(layer.input_norm, x)).view(x.shape[0], heads + 2 * kv_heads, -1)
            if layer.q_norm is not None:  # Qwen3: q and k normed apart before the rotation
                q = rotate(rms_norm(layer.q_norm, qkv[:, :heads]), cos, signed_sin)
                k = rotate(rms_norm(layer.k_norm, qkv[:, heads : heads + kv_heads]), cos, signed_sin)
            else:  # q and k side by side: one rotation
                qk = rotate(qkv[:, : heads + kv_heads], cos, signed_sin)
                q, k = qk[:, :heads], qk[:, heads:]
            own_keys[index][:, :, step] = k
            own_values[index][:, :, step] = qkv[:, heads + kv_heads :]
            own_keys_now, own_values_now = (
                own_keys[index][:, :, : step + 1],
                own_values[index][:, :, : step + 1],
            )
            own = _own_part(q, own_keys_now, own_values_now, kv_heads, fused.scaling)
            if prompt_layers:
                keys, values = prompt_layers[index]
                attended = combine(own, _prompt_part(q, keys, values, mask, groups, kv_heads, fused.scaling))
            else:
                attended = own[0]
            x = x + layer.output(attended.reshape(x.shape[0], -1))
            h = rms_norm(layer.post_attention_norm, x)
            x = x + layer.down(layer.activation(layer.gate(h)) * layer.up(h))
        final = rms_norm(fused.decoder.norm, x)
        if fused.packed_head is not None:
            logits = fused.packed_head(final)
        else:
            logits = fused.head(final[:, None])[:, -1]  # [B, 1, H] in, as model.forward
        picked = pick(finalise_logits(logits.to(score_dtype(logits.dtype)), fused.config))
        keep = responses.add(picked)
        if not keep or step == max_new_tokens - 1:
            break
        tokens, positions = picked, positions + 1
        if len(keep) < len(responses.live):
            kept = torch.tensor(keep, device=device)
            tokens, positions = tokens[kept], positions[kept]
            own_keys = [k[kept] for k in own_keys]
            own_values = [v[kept] for v in own_values]
            prompt_of_kept = [groups.prompt_of_row[slot] for slot in keep]
            still_read = sorted(set(prompt_of_kept))
            if len(still_read) < len(groups.prompts):  # drop the prompts no row reads any more
                chosen = torch.tensor(still_read, device=device)
                prompt_layers = [(k[chosen], v[chosen]) for k, v in prompt_layers]
                masked = masked[chosen]
                mask = additive_mask(masked, sample.dtype)
                renumber = {p: i for i, p in enumerate(still_read)}
                prompt_of_kept = [renumber[p] for p in prompt_of_kept]
            groups.update(prompt_of_kept)
            responses.keep_only(keep)
    return responses.tokens, responses.truncated
