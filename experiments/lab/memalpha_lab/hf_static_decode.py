"""transformers' own fast path for decoding, timed: ``model.generate`` with its static cache.

What a user tries first to make ``generate`` fast is ``cache_implementation="static"``: on CUDA
transformers then compiles the decoding forward with ``torch.compile`` by itself (its
``CompileConfig``; ``compile=False`` turns that off through ``disable_compile``). On the CPU it
does not compile unless asked, which keeps the smoke runs fast.

``generate`` no longer waits for the device between steps (it checks the stopping criteria
late), so a per-step clock on the host would time the launches, not the steps. The decoding rate
is therefore the difference of two calls with the same prompts and the same static cache
(``max_cache_len`` fixed to the longer call's): one of ``max_new_tokens`` and one of a single
new token (the prefill and its draw only); their time difference covers ``max_new_tokens - 1``
decoding steps. A warm-up call of the long length runs first, so compilation is not timed.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _generate(model, ids: torch.Tensor, new_tokens: int, cache_len: int, compile_decoding: bool, seed: int):
    """One sampling call (temperature 1, no filter, no end token), timed to the device's end."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0,
        top_p=1.0, eos_token_id=None, pad_token_id=0, cache_implementation="static", max_cache_len=cache_len,
        disable_compile=not compile_decoding, use_cache=True,
    )
    device = ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    return out[:, ids.shape[1]:], seconds


def run_hf_static(model, prompts: list[list[int]], max_new_tokens: int, seed: int, *, compile_decoding: bool,
                  folded: bool) -> dict[str, Any]:
    """Time ``generate`` with a static cache on equal-length ``prompts`` (the module docstring
    says how). ``folded`` runs it inside ``folded_adapters(model, quantised=True)``: the dense
    weights the graph backend multiplies, so both read the same bytes. Returns ``tokens``,
    ``total_s`` (the long call), ``decode_s`` and ``steps`` (the difference of the two calls),
    ``compiled`` (whether transformers compiled its decoding forward) and ``warmup_s``."""
    from memalpha.lm.core.modes import eval_mode, folded_adapters

    if max_new_tokens < 2:
        raise ValueError("the static-cache arm needs max_new_tokens >= 2: it times the steps after the first")
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("the static-cache arm takes prompts of one length (no padding to lay out)")
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    cache_len = ids.shape[1] + max_new_tokens
    weights = folded_adapters(model, quantised=True) if folded else nullcontext()
    with eval_mode(model), torch.no_grad(), weights:
        _, warmup_s = _generate(model, ids, max_new_tokens, cache_len, compile_decoding, seed)
        _, short_s = _generate(model, ids, 1, cache_len, compile_decoding, seed)
        tokens, total_s = _generate(model, ids, max_new_tokens, cache_len, compile_decoding, seed)
    return {
        "tokens": int(tokens.numel()), "total_s": total_s, "decode_s": max(total_s - short_s, 0.0),
        "steps": max_new_tokens - 1, "prefill_s": short_s, "warmup_s": warmup_s,
        "compiled": hasattr(_base(model), "_compiled_call"),
    }
