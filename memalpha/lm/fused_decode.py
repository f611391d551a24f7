"""A decoding step for Llama-family decoders run from their weights, with the prompt keys shared
by the rows that sample the same prompt.

At one token per row per step, a decoding step of a small model is bound by reading weights
and keys, and by the number of operations more than by arithmetic. :func:`decode` therefore
runs the layers itself instead of through the model's modules:

* **LoRA folded, ``q/k/v`` stacked.** A LoRA update is folded into its weight (``W + s B A``,
  :func:`memalpha.lm.folded_lora.folded_weight`) and ``q/k/v`` are one matrix: five products
  per layer instead of seven, or twenty-one with PEFT's LoRA layers. (``gate/up`` stay two:
  one ``3072 x 576`` product at 8 rows was slower than two ``1536 x 576`` ones here.) The
  weights are a copy made when :meth:`FusedDecoder.build` runs (once per generation call);
  the model's own weights are never written.
* **the prompt's keys are read once per distinct prompt.** A GRPO group samples one prompt
  ``n`` times. The prompt's keys and values are kept once per distinct prompt
  (``[U, kv_heads, P, head_dim]``) and the queries of its rows attend to them together, as
  ``n x group`` query heads per key head (one batched product, the way grouped-query
  attention already shares keys among heads); each row's own new tokens are attended
  separately, and the two parts are combined through their log-sum-exp (the split softmax
  of flash-decoding and of vLLM's cascade attention). A plain cache repeats the prompt's keys
  to every row and reads them ``n`` times per step.

The rotary embedding, activation and head are the model's own modules, the RMSNorms its own
weights (one fused ``rms_norm`` for float32), and the tokens equal the model's (the tests compare
greedy tokens with ``model.generate`` in float64 and seeded samples with the unfolded path).
:meth:`FusedDecoder.build` takes float32/float64 Llama, Mistral (without sliding windows), Qwen2
and Qwen3 decoders whose projections are ``torch.nn.Linear`` layers or plain PEFT LoRA layers
over them, and returns None for anything else (half precision, 4-bit layers, DoRA, other
architectures), which then decode through :mod:`memalpha.lm.decode`.

On the embedded model at 8 rows (2 prompts x 4) on 2 CPU cores a step takes ~70 ms against
~76 ms for the model's own layers with folded LoRA and ~89 ms with PEFT's layers; the products
with the weights are ~41 ms of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memalpha.lm.decode import Responses
from memalpha.lm.folded_lora import effective_weight
from memalpha.lm.layout import PaddedBatch
from memalpha.lm.logprobs import finalise_logits, score_dtype
from memalpha.lm.prefix_cache import full_attention_layers

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, heads, D]`` as the Llama family applies it
    (``x cos + rotate_half(x) sin``): ``rotate_half(x)`` is ``x`` rolled by half its width with the
    first half negated, so ``signed_sin`` ``[B, D]`` is ``sin`` with its first half negated."""
    return x * cos[:, None] + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin[:, None]


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


def _stacked(modules: Sequence[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The effective weights of ``modules`` stacked along the output dimension, with their biases
    (zeros where one has none; None when none has any); None if any module is not foldable. A
    single plain ``torch.nn.Linear`` is not copied."""
    weights = [effective_weight(module) for module in modules]
    if any(weight is None for weight in weights):
        return None
    biases = [getattr(module.get_base_layer() if hasattr(module, "get_base_layer") else module, "bias", None)
              for module in modules]
    if len(modules) == 1:
        return weights[0], None if biases[0] is None else biases[0].detach()
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])
    return torch.cat(weights, dim=0), bias


@dataclass
class FusedLayer:
    """One decoder layer: its norms and activation, and ``(weight, bias)`` per product."""

    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: torch.nn.Module | None
    k_norm: torch.nn.Module | None
    output: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
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

    @classmethod
    def build(cls, decoder, head, config) -> FusedDecoder | None:
        """Stacked weights of every layer of ``decoder`` (LoRA folded in); None when the decoder is
        not one this step reproduces exactly."""
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            return None
        if full_attention_layers(config) is None or not hasattr(decoder, "rotary_emb"):
            return None
        if decoder.embed_tokens.weight.dtype not in (torch.float32, torch.float64):
            return None  # half-precision attention here would round more than the model's own kernels
        if not _plain_rms_norm(getattr(decoder, "norm", None)):
            return None
        layers = []
        with torch.no_grad():
            for layer in decoder.layers:
                attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
                names = ("q_proj", "k_proj", "v_proj", "o_proj")
                if attention is None or mlp is None or not all(hasattr(attention, n) for n in names):
                    return None
                if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
                    return None
                norms = [layer.input_layernorm, layer.post_attention_layernorm]
                norms += [getattr(attention, n) for n in ("q_norm", "k_norm") if hasattr(attention, n)]
                if not all(_plain_rms_norm(norm) for norm in norms):
                    return None
                qkv = _stacked([attention.q_proj, attention.k_proj, attention.v_proj])
                output = _stacked([attention.o_proj])
                gate, up = _stacked([mlp.gate_proj]), _stacked([mlp.up_proj])
                down = _stacked([mlp.down_proj])
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
        first = decoder.layers[0].self_attn
        head_dim = int(first.head_dim)
        heads = config.num_attention_heads
        kv_heads = config.num_key_value_heads
        return cls(decoder, head, config, layers, heads, kv_heads, head_dim, float(first.scaling))


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


def _prompt_part(q, keys, values, masked, groups: PromptGroups, kv_heads: int):
    """Attention of every row's (scaled) query to its prompt's keys: unnormalised output, max and
    sum per row and head (``[B, H, D]``, ``[B, H]``, ``[B, H]``). ``masked`` ``[U, 1, 1, P]`` is
    True on padding columns."""
    heads, dim = q.shape[1:]
    per_kv = heads // kv_heads
    width = groups.width
    grouped = q[groups.gather].view(-1, width, kv_heads, per_kv, dim).transpose(1, 2)
    grouped = grouped.reshape(-1, kv_heads, width * per_kv, dim)  # [U, KV, W*G, D]
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).masked_fill_(masked, torch.finfo(q.dtype).min)
    peak = scores.amax(dim=-1, keepdim=True)
    weights = scores.sub_(peak).exp_()  # padding columns underflow to 0
    total = weights.sum(dim=-1)
    out = torch.matmul(weights, values)  # [U, KV, W*G, D]

    def to_rows(t: torch.Tensor, trailing: tuple[int, ...]) -> torch.Tensor:
        t = t.reshape(-1, kv_heads, width, per_kv, *trailing).transpose(1, 2)  # [U, W, KV, G, ...]
        return t.reshape(-1, heads, *trailing)[groups.slot_of_row]  # [B, H, ...]

    return to_rows(out, (dim,)), to_rows(peak, ()), to_rows(total, ())


def _own_part(q, keys, values, kv_heads: int):
    """Attention of every row's (scaled) query to its own new tokens ``keys``/``values`` ``[B, KV, T, D]``."""
    rows, heads, dim = q.shape
    scores = torch.matmul(q.view(rows, kv_heads, heads // kv_heads, dim), keys.transpose(-1, -2))  # [B, KV, G, T]
    peak = scores.amax(dim=-1, keepdim=True)
    weights = scores.sub_(peak).exp_()
    total = weights.sum(dim=-1)
    out = torch.matmul(weights, values)  # [B, KV, G, D]
    return out.view(rows, heads, dim), peak.view(rows, heads), total.view(rows, heads)


def combine(first, second) -> torch.Tensor:
    """Softmax attention over the union of two parts' keys from each part's unnormalised output,
    max and sum (``[B, H, D]``, ``[B, H]``, ``[B, H]``): the split softmax of flash-decoding. A
    part whose keys were all masked (max at the dtype's minimum) weighs nothing."""
    out_a, peak_a, total_a = first
    out_b, peak_b, total_b = second
    peak = torch.maximum(peak_a, peak_b)
    scale_a, scale_b = torch.exp(peak_a - peak), torch.exp(peak_b - peak)
    total = total_a * scale_a + total_b * scale_b
    return (out_a * scale_a[..., None] + out_b * scale_b[..., None]) / total[..., None]


def decode(
    fused: FusedDecoder,
    batch: PaddedBatch,
    prompt_cache,
    prompt_of_row: Sequence[int],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[list[list[int]], list[bool]]:
    """New tokens for every row of ``batch``, as :func:`memalpha.lm.decode.decode` returns them.

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
    if sorted(first_row) != list(range(len(first_row))):
        raise ValueError("prompt_of_row must number the distinct prompts 0..U-1")
    prompt_layers = [] if prompt_cache is None or stop == 0 else [(l.keys, l.values) for l in prompt_cache.layers]
    masked = ~batch.attention_mask[[first_row[p] for p in range(len(first_row))], :stop].bool()[:, None, None, :]
    groups = PromptGroups(prompt_of_row, device)
    sample = fused.layers[0].qkv[0]
    own_keys = [sample.new_empty((rows, fused.kv_heads, max_new_tokens, fused.head_dim)) for _ in fused.layers]
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
            qkv = F.linear(rms_norm(layer.input_norm, x), *layer.qkv).view(x.shape[0], heads + 2 * kv_heads, -1)
            q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
            if layer.q_norm is not None:
                q, k = rms_norm(layer.q_norm, q), rms_norm(layer.k_norm, k)
            q = rotate(q, cos, signed_sin) * fused.scaling
            own_keys[index][:, :, step] = rotate(k, cos, signed_sin)
            own_values[index][:, :, step] = v
            own = _own_part(q, own_keys[index][:, :, : step + 1], own_values[index][:, :, : step + 1], kv_heads)
            if prompt_layers:
                keys, values = prompt_layers[index]
                attended = combine(own, _prompt_part(q, keys, values, masked, groups, kv_heads))
            else:
                attended = own[0] / own[2][..., None]
            x = x + F.linear(attended.reshape(x.shape[0], -1), *layer.output)
            h = rms_norm(layer.post_attention_norm, x)
            x = x + F.linear(layer.activation(F.linear(h, *layer.gate)) * F.linear(h, *layer.up), *layer.down)
        logits = fused.head(rms_norm(fused.decoder.norm, x)[:, None])[:, -1]  # [B, 1, H] in, as model.forward
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
                renumber = {p: i for i, p in enumerate(still_read)}
                prompt_of_kept = [renumber[p] for p in prompt_of_kept]
            groups.update(prompt_of_kept)
            responses.keep_only(keep)
    return responses.tokens, responses.truncated
