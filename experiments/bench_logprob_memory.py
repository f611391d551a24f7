"""Peak memory of the per-token log-prob step vs a naive full log_softmax, and generate throughput.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench_logprob_memory.py [--skip-generate]

Memory is the peak of bytes held by PyTorch's CPU allocator during the call, read from the
profiler's allocation events (``profile_memory=True``), so kernel temporaries count too.
Throughput is wall-clock generated tokens per second of the embedded model on this CPU at
1 and 2 torch threads; the machine may be shared with other processes (with busy cores,
2 threads can be much slower than 1), so treat the numbers as indicative.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from memalpha.lm.core.layout import pad_prompt_response
from memalpha.lm.scoring.logprobs import token_logprobs


def peak_allocated_bytes(fn) -> tuple[int, object]:
    """Run ``fn()`` and return (peak bytes allocated on the CPU during it, its result)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    peak = 0
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
            peak = max(peak, event.typed[1].total_allocated)
    return peak, result


def naive_logprobs(model, prompts, responses, pad_id: int = 0) -> torch.Tensor:
    """Full-vocabulary logits for the whole batch, then log_softmax + gather."""
    batch = pad_prompt_response(prompts, responses, pad_id)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.float()
    width = batch.response_mask.shape[1]
    start = batch.prompt_width - 1
    logp = torch.log_softmax(logits[:, start : start + width], dim=-1)
    return logp.gather(-1, batch.input_ids[:, batch.prompt_width :, None]).squeeze(-1) * batch.response_mask


def tiny_large_vocab_model(vocab: int = 32000, hidden: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def memory_table(batch: int = 2, prompt_len: int = 16, response_len: int = 1024, token_chunk: int = 256) -> None:
    model = tiny_large_vocab_model()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (batch, prompt_len), generator=generator).tolist()
    responses = torch.randint(3, vocab, (batch, response_len), generator=generator).tolist()
    chunk_bytes = token_chunk * vocab * 4
    print(f"model: 2-layer Llama, hidden 32, vocab {vocab}; batch {batch}, prompt {prompt_len}, response {response_len}")
    print(f"one micro-chunk of logits: {token_chunk} x {vocab} x 4 B = {chunk_bytes / 2**20:.1f} MiB\n")
    print("| method | peak allocated (MiB) | / chunk | max abs diff vs naive |")
    print("|---|---|---|---|")
    with torch.no_grad():
        naive_peak, reference = peak_allocated_bytes(lambda: naive_logprobs(model, prompts, responses))
        print(f"| naive log_softmax over [B, R, V] | {naive_peak / 2**20:.1f} | {naive_peak / chunk_bytes:.2f} | 0 |")
        for label, kwargs, unit in (
            (f"token_logprobs token_chunk={token_chunk}", {}, chunk_bytes),
            (f"token_logprobs token_chunk={token_chunk}, vocab_chunk=8000", {"vocab_chunk": 8000},
             token_chunk * 8000 * 4),
        ):
            peak, ours = peak_allocated_bytes(
                lambda kw=kwargs: token_logprobs(
                    model, prompts, responses, micro_batch_size=batch, token_chunk=token_chunk, **kw
                )
            )
            diff = (ours - reference).abs().max().item()
            print(f"| {label} | {peak / 2**20:.1f} | {peak / unit:.2f} (of its chunk) | {diff:.2e} |")
    grad_peak, _ = peak_allocated_bytes(
        lambda: token_logprobs(model, prompts, responses, micro_batch_size=batch, token_chunk=token_chunk)
        .sum()
        .backward()
    )
    model.zero_grad(set_to_none=True)
    naive_grad_peak, _ = peak_allocated_bytes(lambda: naive_logprobs(model, prompts, responses).sum().backward())
    print(f"| with grad, forward+backward: token_logprobs | {grad_peak / 2**20:.1f} | {grad_peak / chunk_bytes:.2f} | |")
    print(f"| with grad, forward+backward: naive | {naive_grad_peak / 2**20:.1f} | {naive_grad_peak / chunk_bytes:.2f} | |")


def throughput_table(batches=(1, 4, 16), threads=(1, 2), new_tokens: int = 64, repeats: int = 1) -> None:
    """Generated tokens/s of the embedded model; every row runs to ``new_tokens`` (eos disabled)."""
    from transformers.utils import logging as hf_logging

    from memalpha.lm.sampling.generation import generate
    from memalpha.lm.core.policy import load_policy

    hf_logging.set_verbosity_error()  # eos_token_id=-1 (never sampled) would warn on every call
    model, tokenizer = load_policy("smollm2-135m-instruct", lora=None)
    messages = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    print(f"\nembedded model (SmolLM2-135M-Instruct), fp32, prompt {len(prompt)} tokens, max_new_tokens "
          f"{new_tokens}, sampling T=1.0, eos disabled so every row generates {new_tokens} tokens; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| torch threads | batch | generated tokens | seconds | tokens/s |")
    print("|---|---|---|---|---|")
    for count in threads:
        torch.set_num_threads(count)
        generate(model, tokenizer, [prompt], max_new_tokens=4, seed=0)  # warm-up
        for batch in batches:
            best = None
            for repeat in range(repeats):
                start = time.perf_counter()
                out = generate(model, tokenizer, [prompt] * batch, max_new_tokens=new_tokens, seed=repeat,
                               eos_token_id=-1)
                seconds = time.perf_counter() - start
                rate = out.num_generated_tokens / seconds
                if best is None or rate > best[2]:
                    best = (out.num_generated_tokens, seconds, rate)
            print(f"| {count} | {batch} | {best[0]} | {best[1]:.2f} | {best[2]:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-generate", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to time")
    args = parser.parse_args()
    if not args.skip_memory:
        memory_table()
    if not args.skip_generate:
        throughput_table(threads=tuple(args.threads))


if __name__ == "__main__":
    main()
