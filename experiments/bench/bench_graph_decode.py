"""New tokens per second of memalpha's decoding loop, of the CUDA-graph backend and of
transformers' own static-cache ``generate``, on a random-weight Qwen3 (Qwen3-4B's shapes by
default), optionally NF4 with a LoRA adapter; each beside its fraction of the bytes-read limit.

Run on a GPU:  .venv/bin/python experiments/bench/bench_graph_decode.py --device cuda --nf4
Smoke on CPU:  .venv/bin/python experiments/bench/bench_graph_decode.py --device cpu --tiny --nf4

The shapes of issue 37: ``--rows 8 --prompt-tokens 1024``, ``--rows 32 --prompt-tokens 1024`` and
``--rows 8 --prompt-tokens 6144 --max-new-tokens 2048``; ``--identical-prompts`` gives every row
the same prompt (a GRPO group at chunk 1), which the loop and the graph backend prefill once.

On an H100 the GPU run should take a minute or two (drawing and quantising the weights, the
check, ``--loop-max-new-tokens`` 64 steps of the loop at ~150 ms, the graph's 256 steps); a
failed capture is an error (``--capture off`` times the eager step instead).

The model is built in place (no checkpoint to read): ``Qwen3ForCausalLM`` from
``transformers.Qwen3Config`` under ``with torch.device(device)``, so 4B random weights are drawn
on the GPU in seconds, in bf16 (float32 on the CPU). With ``--nf4`` every linear layer of the
decoder becomes a bitsandbytes NF4 ``Linear4bit`` (double-quantised, compute dtype as the
weights) and the model is prepared as memalpha's policy loader prepares it
(``prepare_model_for_kbit_training``: embeddings, norms and head in float32). ``--lora-rank`` r
(0: none) adds a LoRA adapter on every linear layer with B drawn (a fresh B is zero and would
fold to nothing). The prompts are ``--rows`` random token sequences of ``--prompt-tokens``.

Three paths, each sampling at temperature 1 with no end token (every row decodes in full):

* ``loop``  -- the reference loop (:mod:`memalpha_lab.growing_cache`, memalpha's ``growing-cache``
               backend until it was retired) through PEFT's layers (4-bit bases dequantised at
               every step on a GPU);
* ``graph`` -- :func:`memalpha.lm.sampling.graph_decode.sample`: dense weights folded once, a static
               cache read in buckets of ``--bucket-columns`` (0: whole), the step captured as a
               CUDA graph per bucket on a GPU (eager on the CPU), drawing its tokens inside the
               graph as ``generate`` does (``--sampling host``: picked on the host every step);
* ``hf-static`` -- ``model.generate(cache_implementation="static")``, which compiles its decoding
               forward with ``torch.compile`` on CUDA (``--hf-compile off``: not), over the same
               folded dense weights (``--hf-weights model``: through the model's own layers);
               timed by the difference of two calls (:mod:`memalpha_lab.hf_static_decode`).

Each result carries ``bytes_limit`` (:mod:`memalpha_lab.bytes_limit`): the bytes a step
must read (dense weights in the compute dtype, plus the KV cache filled on average over the
timed steps, in the embedding's dtype), the GPU's bandwidth (its table, or ``--bandwidth``), the
shortest step that allows and the fraction of it the measured ms/step reaches.

Decode tokens/s counts the tokens of whole decoding steps over their time: for the loop and the
host-picking graph clocked at the token picker (:class:`PickClock`: no prefill, no capture), for
the in-graph sampler the token loop less its captures (it reads the host every
``EOS_CHECK_STEPS`` steps, so no picker runs per step); total tokens/s
counts every token over the whole call (weights folded, prefill, capture included). Before timing,
``--check-steps`` steps of each path run with the same scripted tokens fed back (teacher forcing) and their
logits are compared step by step (:func:`check_logits`): the backend against the loop should differ by the
folded weights' bf16 rounding (a few 1e-2 at most; a wrong mask, position or cache column gives ~1), and the
captured step against the same step run eagerly by nothing (a stale buffer in the graph shows there). Writes
``experiments/results/bench_graph_decode.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.allocator import prefer_expandable_segments
from memalpha.lm.core.modes import is_four_bit
from memalpha.lm.core.prompt_sharing import pad_prompt_response, split_decoder_and_head
from memalpha.lm.sampling import graph_decode
from memalpha.lm.sampling.filters import next_tokens
from memalpha_lab import growing_cache as own_loop
from memalpha_lab.bytes_limit import StepShape, bandwidth_for, limit_record
from memalpha_lab.common import command_line, machine_info, print_table, write_json
from memalpha_lab.hf_static_decode import run_hf_static

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench_graph_decode.json"
PATHS = ("loop", "graph", "hf-static")
NO_END = 10**9  # an end token no row emits

QWEN3_4B = {
    "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
    "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}


def build_model(
    device: torch.device, *, tiny: bool, nf4: bool, lora_rank: int, seed: int, upcast: bool = True
):
    """The random Qwen3 the module docstring describes, in eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen3Config(**(TINY if tiny else QWEN3_4B), use_sliding_window=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    model.to(device)  # a no-op when the weights were drawn there, as they should be
    if nf4:
        quantise_decoder(model, dtype, upcast=upcast)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear")
        )
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 0.02)
    return model.eval()


def quantise_decoder(model, compute_dtype: torch.dtype, upcast: bool = True) -> None:
    """Every ``torch.nn.Linear`` of the decoder layers as an NF4 ``Linear4bit`` (quantised as it
    is moved to its device), then memalpha's k-bit preparation: with ``upcast`` (``lm.upcast_unquantised``,
    the default) embeddings, norms and head in float32; without (configs/qlora_4090.yaml) they stay
    in ``compute_dtype`` and only the base is frozen."""
    import bitsandbytes as bnb
    from peft import prepare_model_for_kbit_training

    for layer in model.model.layers:
        for name, module in list(layer.named_modules()):
            if type(module) is not torch.nn.Linear:
                continue
            parent = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
            quantised = bnb.nn.Linear4bit(
                module.in_features,
                module.out_features,
                bias=module.bias is not None,
                compute_dtype=compute_dtype,
                compress_statistics=True,
                quant_type="nf4",
                device="meta",
            )
            quantised.weight = bnb.nn.Params4bit(
                module.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4"
            )
            if module.bias is not None:
                quantised.bias = torch.nn.Parameter(module.bias.data, requires_grad=False)
            quantised = quantised.to(module.weight.device)
            if module.weight.device.type == "cpu":  # its AVX512-BF16 repacking would compute in bf16
                quantised.support_avx512bf16_for_cpu = False
            setattr(parent, name.rpartition(".")[2], quantised)
    model.is_loaded_in_4bit = True  # so PEFT wraps the layers in its 4-bit LoRA class, as for a loaded model
    if upcast:
        prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        model.requires_grad_(False)


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PickClock:
    """Wraps the token picker and notes when each call starts. Each step ends on a host read of
    its tokens (``Responses.add``), so from the second call on a call starts after the previous
    step has really finished: the span from the second call to the last covers whole steps only
    (no prefill, no capture), and both paths are measured alike."""

    def __init__(self, pick):
        self.pick = pick
        self.stamps: list[float] = []

    def __call__(self, logits: torch.Tensor, **settings) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return self.pick(logits, **settings)

    def decode_seconds(self) -> tuple[float, int]:
        """Seconds of the steps between the second pick and the last, and how many there were."""
        if len(self.stamps) < 3:
            return 0.0, 0
        return self.stamps[-1] - self.stamps[1], len(self.stamps) - 2

    def first_timed_filled(self, prompt_tokens: int) -> int:
        """Cache columns after the first timed step: the third pick's forward ran at column
        ``prompt_tokens + 1`` (the first came from the prefill)."""
        return prompt_tokens + 2


def run_loop(model, prompts, max_new_tokens: int, seed: int, device: torch.device) -> dict[str, Any]:
    """The reference loop (:mod:`memalpha_lab.growing_cache`) through the model as loaded, its
    picker clocked."""
    decoder, head, config = split_decoder_and_head(model)
    clock = PickClock(lambda logits: next_tokens(logits, do_sample=True))
    batch = pad_prompt_response(prompts, [[] for _ in prompts], 0, device)
    torch.manual_seed(seed)
    synchronise(device)
    start = time.perf_counter()
    with torch.no_grad():
        room = own_loop.growing_cache(decoder, batch.input_ids.shape[1] + max_new_tokens)
        tokens, _ = own_loop.decode(decoder, head, config, batch, room, max_new_tokens=max_new_tokens,
                                    eos_ids=[NO_END], pick=clock)  # fmt: skip
    synchronise(device)
    total = time.perf_counter() - start
    seconds, steps = clock.decode_seconds()
    return record(len(prompts), sum(len(t) for t in tokens), total, seconds, steps,
                  clock.first_timed_filled(len(prompts[0])), captured=None)


def run_graph(model, prompts, max_new_tokens: int, seed: int, device: torch.device, capture: bool | None,
              bucket_columns: int | None = graph_decode.BUCKET_COLUMNS, sampling: str = "in-graph",
              compile_backend: str | None = None):
    """The CUDA-graph backend (the weights folded inside the call). ``sampling`` ``in-graph`` is
    what ``generate(backend="cuda-graph")`` runs: the step draws its tokens inside the graph and
    the host reads them every ``graph_decode.EOS_CHECK_STEPS`` steps; its decoding time is the
    token loop less the captures (``decode_s - capture_s``). ``host`` picks on the host after
    every step (the backend's first form), timed at the picker (:class:`PickClock`)."""
    stats: dict[str, Any] = {}
    clock = PickClock(lambda logits: next_tokens(logits, do_sample=True))
    choice = (
        {"sampling": graph_decode.GraphSampling(do_sample=True)}
        if sampling == "in-graph"
        else {"pick": clock}
    )
    synchronise(device)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        tokens, _ = graph_decode.sample(
            model, prompts, pad_id=0, max_new_tokens=max_new_tokens, eos_ids=[NO_END], capture=capture,
            stats=stats, bucket_columns=bucket_columns, compile_backend=compile_backend, **choice,
        )
    synchronise(device)
    total = time.perf_counter() - start
    if sampling == "in-graph":  # every step, captures taken out; the first runs the last prompt column
        seconds, steps = stats["decode_s"] - stats["capture_s"], stats["steps"]
        first_filled = len(prompts[0])
    else:
        seconds, steps = clock.decode_seconds()
        first_filled = clock.first_timed_filled(len(prompts[0]))
    return record(len(prompts), sum(len(t) for t in tokens), total, seconds, steps, first_filled,
                  captured=stats["captured"], capture_s=stats["capture_s"], prefill_s=stats["prefill_s"],
                  graphs=len(stats["widths"]), bucket_columns=bucket_columns, sampling=sampling,
                  compile_backend=compile_backend)


def run_hf(model, prompts, max_new_tokens: int, seed: int, *, compile_decoding: bool, folded: bool):
    """transformers' static-cache ``generate`` (:func:`memalpha_lab.hf_static_decode.run_hf_static`)."""
    timing = run_hf_static(model, prompts, max_new_tokens, seed, compile_decoding=compile_decoding,
                           folded=folded)
    # the timed steps are the long call's forwards after the prefill: columns P + 1 .. P + N - 1 filled
    return record(len(prompts), timing["tokens"], timing["total_s"], timing["decode_s"], timing["steps"],
                  len(prompts[0]) + 1, captured=None, compiled=timing["compiled"],
                  prefill_s=timing["prefill_s"], warmup_s=timing["warmup_s"], folded_weights=folded)


def record(rows: int, tokens: int, total: float, seconds: float, steps: int, first_filled: int,
           **extra) -> dict[str, Any]:
    """One timed run: ``steps`` decoding steps took ``seconds``; the first of them left
    ``first_filled`` columns in every row's cache (each later one a column more)."""
    return {
        "tokens": tokens, "total_s": total, "tokens_per_s": tokens / total, "timed_steps": steps,
        "decode_s": seconds, "decode_tokens_per_s": rows * steps / seconds if seconds > 0 else None,
        "ms_per_step": 1000 * seconds / steps if steps and seconds > 0 else None,
        "mean_filled_tokens": first_filled + (steps - 1) / 2 if steps else None, **extra,
    }


def step_bytes_limit(model, result: dict[str, Any], rows: int, device: torch.device,
                     bandwidth: float | None) -> dict[str, Any] | None:
    """The bytes-read limit of a timed step of ``result`` and the fraction of it reached
    (:func:`memalpha_lab.bytes_limit.limit_record`); None when nothing was timed."""
    if not result["timed_steps"]:
        return None
    decoder, _, config = split_decoder_and_head(model)
    weight_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the folded copies'
    kv_dtype = decoder.get_input_embeddings().weight.dtype  # the activations', hence the cache's
    shape = StepShape.of_config(
        config, weight_dtype_bytes=weight_dtype.itemsize, kv_dtype_bytes=kv_dtype.itemsize,
        filled_tokens=result["mean_filled_tokens"], rows=rows,
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return limit_record(shape, bandwidth or bandwidth_for(name), result["ms_per_step"], name)


def profile_graph_steps(
    model, prompts, steps: int, device: torch.device, top: int = 15
) -> list[dict[str, Any]]:
    """The kernels (or, on a CPU, operators) that took the most time over ``steps`` decoding steps
    of the graph backend run eagerly (a captured replay shows as one launch; its kernels are the
    eager step's): name, calls, total milliseconds, share of the profiled time. Printed as a table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        graph_decode.sample(model, prompts, pad_id=0, max_new_tokens=steps, eos_ids=[NO_END],
                            pick=lambda logits: next_tokens(logits, do_sample=True), capture=False)
        synchronise(device)
    on_device = device.type == "cuda"
    # On a GPU keep the kernels only: an operator's device time is its kernels', listed too (the
    # first H200 run's table counted both, so its shares are half of the true ones).
    events = [e for e in prof.key_averages()
              if (e.self_device_time_total > 0 and str(e.device_type).endswith("CUDA") if on_device
                  else e.self_cpu_time_total > 0)]
    timed = sorted(
        events, key=lambda e: e.self_device_time_total if on_device else e.self_cpu_time_total, reverse=True
    )
    total = sum(e.self_device_time_total if on_device else e.self_cpu_time_total for e in events) or 1.0
    rows = [{"name": e.key[:80], "calls": e.count,
             "ms": (e.self_device_time_total if on_device else e.self_cpu_time_total) / 1000.0,
             "share": (e.self_device_time_total if on_device else e.self_cpu_time_total) / total}
            for e in timed[:top]]
    print(f"[bench_graph_decode] profile of {steps} eager graph-backend steps (prefill included), "
          f"{'device' if on_device else 'CPU'} time {total / 1000:.1f} ms:", flush=True)
    print_table(
        ["kernel", "calls", "ms", "share"],
        [[r["name"], r["calls"], r["ms"], r["share"]] for r in rows],
        floats=3,
    )
    return rows


def check_logits(model, prompts, steps: int, capture: bool | None, seed: int) -> dict[str, list[float]]:
    """Per step, the relative norm difference of the logits when every path is fed the same
    scripted tokens: ``graph_vs_loop`` (the backend, captured as ``capture`` says, against
    memalpha's loop: the rounding of the folded bf16 weights, a few 1e-2 at most; ~1 is a bug)
    and ``captured_vs_eager`` (the same backend with and without the capture: 0 up to kernel
    choice; anything else is a stale buffer in the graph)."""
    from memalpha.lm.core.modes import folded_adapters

    decoder, head, config = split_decoder_and_head(model)
    device = decoder.get_input_embeddings().weight.device
    generator = torch.Generator().manual_seed(seed)
    script = torch.randint(0, config.vocab_size, (steps, len(prompts)), generator=generator).to(device)

    def recorder(seen: list[torch.Tensor]):
        def pick(logits: torch.Tensor) -> torch.Tensor:
            seen.append(logits.double().cpu())
            return script[len(seen) - 1]
        return pick

    def difference(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> list[float]:
        return [((a - b).norm() / b.norm()).item() for a, b in zip(ours, theirs)]

    batch = pad_prompt_response(prompts, [[] for _ in prompts], 0, device)
    limits = {"max_new_tokens": steps, "eos_ids": [NO_END]}
    loop_logits: list[torch.Tensor] = []
    graph_logits: list[torch.Tensor] = []
    eager_logits: list[torch.Tensor] = []
    with torch.no_grad():
        cache = own_loop.growing_cache(decoder, batch.input_ids.shape[1] + steps)
        own_loop.decode(decoder, head, config, batch, cache, pick=recorder(loop_logits), **limits)
        with folded_adapters(model, quantised=True):
            graph_decode.decode_in_graph(
                decoder, head, config, batch, pick=recorder(graph_logits), capture=capture, **limits
            )
            graph_decode.decode_in_graph(
                decoder, head, config, batch, pick=recorder(eager_logits), capture=False, **limits
            )
    return {
        "graph_vs_loop": difference(graph_logits, loop_logits),
        "captured_vs_eager": difference(graph_logits, eager_logits),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--tiny", action="store_true", help="a 2-layer, 64-wide Qwen3 instead of Qwen3-4B's shapes"
    )
    parser.add_argument(
        "--nf4", action="store_true", help="NF4 decoder layers (bitsandbytes), as memalpha's QLoRA"
    )
    parser.add_argument(
        "--lora-rank", type=int, default=32, help="LoRA rank on every linear layer (0: no adapter)"
    )
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="tokens per row for the graph and hf-static paths")
    parser.add_argument("--loop-max-new-tokens", type=int, default=64,
                        help="tokens per row for the loop (~150 ms a step on an H100 at Qwen3-4B NF4)")
    parser.add_argument("--check-steps", type=int, default=16, help="teacher-forced steps compared (0: skip)")
    parser.add_argument("--capture", choices=("auto", "on", "off"), default="auto",
                        help="auto: capture on CUDA, eager on the CPU; on: CUDA only; off: eager")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--upcast-unquantised",
        choices=("on", "off"),
        default="on",
        help="model.lm.upcast_unquantised: on (the default) keeps embedding, norms and head in float32 "
        "(a float32 residual stream and cache); off keeps them in bf16 (configs/qlora_4090.yaml)",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after timing, run this many graph steps eagerly under torch.profiler and report the "
        "kernels that took the most device time (0: skip)",
    )
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}"
    )
    parser.add_argument(
        "--sampling",
        choices=("in-graph", "host"),
        default="in-graph",
        help="graph path: in-graph draws inside the captured step, the host reading tokens every "
        "EOS_CHECK_STEPS steps (what generate runs); host picks after every step",
    )
    parser.add_argument("--compile-step", default="off",
                        help="graph path: torch.compile backend of the decoding step before each width is "
                        "captured (e.g. inductor; off: none); its compile time falls in capture_s")
    parser.add_argument("--bucket-columns", type=int, default=graph_decode.BUCKET_COLUMNS,
                        help="graph path: columns its attention span grows by (0: the whole static cache)")
    parser.add_argument("--identical-prompts", action="store_true",
                        help="every row the same prompt (a GRPO group at chunk 1): "
                             "prefilled once by loop and graph")
    parser.add_argument("--hf-compile", choices=("auto", "off"), default="auto",
                        help="hf-static: auto lets transformers compile its decoding forward "
                             "(it does on CUDA); off disables it")
    parser.add_argument("--hf-weights", choices=("folded", "model"), default="folded",
                        help="hf-static: folded runs over the graph path's dense bf16 copies "
                             "(the same bytes); model through the model's own (4-bit, LoRA) layers")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="memory bandwidth in B/s for the bytes-read limit "
                             "(default: the GPU's, from the table)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS), help="JSON report path")
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        parser.error(f"--paths: unknown {unknown or 'empty list'}; choose from {list(PATHS)}")
    for name in ("rows", "prompt_tokens", "max_new_tokens", "loop_max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.bucket_columns < 0:
        parser.error("--bucket-columns must be >= 0")
    if "hf-static" in paths and args.max_new_tokens < 2:
        parser.error("the hf-static path needs --max-new-tokens >= 2")
    args.paths = paths
    args.capture = {"auto": None, "on": True, "off": False}[args.capture]
    args.bucket_columns = args.bucket_columns or None
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = machine_info()
    device = torch.device(args.device)
    start = time.perf_counter()
    model = build_model(device, tiny=args.tiny, nf4=args.nf4, lora_rank=args.lora_rank, seed=args.seed,
                        upcast=args.upcast_unquantised == "on")
    synchronise(device)
    build_s = time.perf_counter() - start
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(2, vocab, (args.rows, args.prompt_tokens), generator=generator).tolist()
    if args.identical_prompts:
        prompts = [prompts[0]] * args.rows
    refused = graph_decode.supports(model)
    print(
        f"[bench_graph_decode] model built in {build_s:.1f} s on {device}; "
        f"4-bit layers {sum(is_four_bit(m) for m in model.modules())}; "
        f"graph backend: {refused or 'supported'}",
        flush=True,
    )
    check = (
        check_logits(model, prompts, args.check_steps, args.capture, args.seed) if args.check_steps else {}
    )
    for name, differences in check.items():
        print(f"[bench_graph_decode] teacher-forced logits, relative difference {name.replace('_', ' ')}: "
              f"max {max(differences):.3g}, per step {[float(f'{d:.3g}') for d in differences]}", flush=True)
    tokens = {"loop": args.loop_max_new_tokens, "graph": args.max_new_tokens,
              "hf-static": args.max_new_tokens}
    records: dict[str, list[dict[str, Any]]] = {path: [] for path in args.paths}
    for repeat in range(args.repeats):
        for path in args.paths:
            seed = args.seed + repeat
            if path == "loop":
                result = run_loop(model, prompts, tokens[path], seed, device)
            elif path == "graph":
                compile_backend = None if args.compile_step == "off" else args.compile_step
                result = run_graph(model, prompts, tokens[path], seed, device, args.capture,
                                   args.bucket_columns, args.sampling, compile_backend)
            else:
                compiled = args.hf_compile == "auto"
                result = run_hf(model, prompts, tokens[path], seed, compile_decoding=compiled,
                                folded=args.hf_weights == "folded")
            result["bytes_limit"] = step_bytes_limit(model, result, args.rows, device, args.bandwidth)
            records[path].append(result)
            print(
                f"[bench_graph_decode] repeat {repeat + 1}/{args.repeats} {path}: "
                f"{result['decode_tokens_per_s'] or 0:.1f} new tokens/s decoding, "
                f"{result['tokens_per_s']:.1f} overall",
                flush=True,
            )
    best = {path: max(recs, key=lambda r: r["decode_tokens_per_s"] or 0) for path, recs in records.items()}
    print_table(
        ["path", "rows", "new tokens", "ms/step", "decode tok/s", "limit ms", "of limit", "total s",
         "tok/s overall", "captured"],
        [
            [path, args.rows, tokens[path], r["ms_per_step"], r["decode_tokens_per_s"],
             (r["bytes_limit"] or {}).get("limit_ms_per_step") or "-",
             (r["bytes_limit"] or {}).get("fraction") or "-",
             r["total_s"], r["tokens_per_s"], str(r["captured"]) if r["captured"] is not None else "-"]
            for path, r in best.items()
        ],
        floats=1,
    )
    if "loop" in best and "graph" in best:
        print(
            "speed-up of decoding: "
            f"{best['graph']['decode_tokens_per_s'] / best['loop']['decode_tokens_per_s']:.1f}x"
        )
    profile = profile_graph_steps(model, prompts, args.profile_steps, device) if args.profile_steps else []
    report = {
        "benchmark": "bench_graph_decode",
        "command": command_line(),
        "settings": {
            "device": str(device),
            "tiny": args.tiny,
            "nf4": args.nf4,
            "lora_rank": args.lora_rank,
            "rows": args.rows,
            "prompt_tokens": args.prompt_tokens,
            "max_new_tokens": tokens,
            "capture": args.capture,
            "model_config": TINY if args.tiny else QWEN3_4B,
            "build_s": build_s,
            "backend_refusal": refused,
            "upcast_unquantised": args.upcast_unquantised == "on",
            "profile_steps": args.profile_steps,
            "bucket_columns": args.bucket_columns,
            "identical_prompts": args.identical_prompts,
            "hf_compile": args.hf_compile,
            "hf_weights": args.hf_weights,
            "bandwidth_Bps": args.bandwidth,
        },
        "profile_top_kernels": profile,
        "check_relative_difference": check,
        "peak_gpu_memory_gib": (
            torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        ),
        "best": best,
        "runs": records,
    }
    path = write_json(report, args.out, machine=machine)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    prefer_expandable_segments()  # before anything touches CUDA (memalpha/allocator.py)
    main()
