"""Scale check without downloads: one full GRPO step of a random-weight Qwen3-4B as NF4 QLoRA.

Run (GPU, the real shape, capped to 24 GiB):
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_scale.py
Run (CPU, a scaled-down shape of the same structure):
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_scale.py --scale 0.125 \
          --prompt-tokens 256 --response-tokens 32 --group-size 8

Memory and time of a step depend only on the model's shapes, so the architecture is built
from Qwen3-4B's published config values (hidden 2560, 36 layers, 32 attention heads, 8 KV
heads, head dim 128, intermediate 9728, vocabulary 151,936, tied embeddings) with random
weights, saved to a temporary folder, and loaded through :func:`memalpha.lm.core.policy.load_policy`
exactly as ``configs/qlora_4090.yaml`` does: NF4 base (double quantisation), LoRA r 32 / alpha
64 on all linear layers, gradient checkpointing. One GRPO step at that config's lengths follows:

1. ``generate``   ``group_size`` rollouts, each of its own ``prompt_tokens``-long random prompt
                  (nothing shared, so :mod:`memalpha.lm.core.prompt_sharing` saves nothing: the worst case),
                  forced to exactly ``response_tokens`` new tokens (the end-of-sequence id handed to
                  :func:`memalpha.lm.sampling.generation.generate` is one past the vocabulary, so it can never
                  be sampled), ``generation_batch_size`` prompts per call;
2. ``reference``  reference log-probs (the fresh adapter's reference is the base; no grad),
                  ``micro_batch_size`` at a time (:func:`memalpha.train.step.score_samples`);
3. ``policy``     per micro-batch: policy log-probs with grad and the clipped GRPO loss with the
                  k3 KL term (``forward``), then ``backward``;
4. ``optimizer``  gradient clipping and the optimiser step (3 and 4 are
                  :func:`memalpha.grpo.update.train_minibatch`, the step ``memalpha fit`` takes;
                  bitsandbytes paged 8-bit AdamW on a GPU, as the config says; torch AdamW on a CPU).
                  ``policy_forward`` is the gradient pass outside the ``backward`` calls in it.

On a GPU the process is capped to 24 GiB with ``torch.cuda.set_per_process_memory_fraction``
and the peak allocated/reserved memory of every phase is reported (the paged optimiser's
state lives in CUDA unified memory, outside PyTorch's allocator, and is not in those peaks).
On a CPU the peak resident set size of every phase is reported instead. With ``--scale s``
layers, hidden size, intermediate size and head counts are multiplied by ``s`` (head dim,
vocabulary, GQA ratio and tying stay); ``--vocab-size`` shrinks the vocabulary for smoke tests.
``--tokenizer`` names a folder holding only a tokenizer, for machines without the embedded model's
package (its ids are never decoded: prompts are random ids, so any tokenizer with a pad token works).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.allocator import prefer_expandable_segments
from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import ONE_PROCESS, Optimisation, train_minibatch
from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path
from memalpha.lm.core.policy import load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.backend import SAMPLING_BACKENDS
from memalpha.lm.sampling.generation import sampler_for
from memalpha.train.step import Samples, score_samples
from memalpha_lab.common import (
    RESULTS_DIR,
    RssSampler,
    Stopwatch,
    command_line,
    gib,
    machine_info,
    print_table,
    write_json,
)
from memalpha_lab.gpu_record import GpuRecord, add_arguments
from memalpha_lab.qlora_4090 import (
    CONFIG_PATH,
    GPU_CAP_BYTES,
    QWEN3_4B,
    build_random_model_dir,
    read_recipe,
    scaled_shape,
)

DEFAULT_OUT = RESULTS_DIR / "bench_scale.json"
CPU_DEFAULTS = {"scale": 0.125, "prompt_tokens": 256, "response_tokens": 32}


class Phase:
    """Time and peak memory of one phase (CUDA allocator peaks on a GPU, sampled RSS on a CPU)."""

    def __init__(self, name: str, cuda: bool, clock=None) -> None:
        self.name, self.cuda, self.clock = name, cuda, clock
        self.seconds = 0.0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.peak_rss = 0
        self.device_used = 0  # total - free from the driver (the least free polled during the phase, with a
        # clock): counts the paged optimiser's unified memory too
        self.error: str | None = None

    def run(self, fn):
        with self.timing():
            return fn()

    @contextmanager
    def timing(self):
        """Time the block and record its peak memory (the context manager :meth:`run` uses)."""
        sync = torch.cuda.synchronize if self.cuda else None
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sampler = RssSampler() if not self.cuda else nullcontext()
        watch = Stopwatch(sync)
        recorded = self.clock.phase(self.name) if self.clock is not None else nullcontext()
        try:
            with recorded, sampler, watch:
                yield
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            raise
        finally:
            self.seconds += watch.seconds if watch.seconds else 0.0
            if self.cuda:
                self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated())
                self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved())
                free, total = torch.cuda.mem_get_info()
                polled = self.clock.entries[-1]["device_used_peak_gib"] if self.clock is not None else None
                used = polled * 2**30 if polled is not None else total - free  # the phase's polled peak
                self.device_used = max(self.device_used, int(used))
            else:
                self.peak_rss = max(self.peak_rss, sampler.peak_bytes)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.name, "seconds": self.seconds}
        if self.cuda:
            out.update(peak_allocated_gib=gib(self.peak_allocated), peak_reserved_gib=gib(self.peak_reserved),
                       device_used_gib=gib(self.device_used))
        else:
            out["peak_rss_gib"] = gib(self.peak_rss)
        if self.error:
            out["error"] = self.error
        return out


class GradientPass:
    """The ``policy_forward`` and ``backward`` phases of one gradient pass, taking turns: the pass
    (:func:`memalpha.grpo.update.train_minibatch`'s ``gradients`` stage) runs as ``policy_forward``
    except inside each micro-batch's ``backward`` call, which runs as ``backward``."""

    def __init__(self, forward: Phase, backward: Phase) -> None:
        self.forward, self.backward_phase = forward, backward
        self._open_block = None

    def _open(self) -> None:
        self._open_block = self.forward.timing()
        self._open_block.__enter__()

    def _close(self, error: BaseException | None) -> None:
        block, self._open_block = self._open_block, None
        if block is not None:
            block.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)

    @contextmanager
    def stage(self):
        self._open()
        try:
            yield
        except BaseException as error:
            self._close(error)
            raise
        self._close(None)

    def backward(self, loss: torch.Tensor) -> None:
        self._close(None)
        self.backward_phase.run(loss.backward)
        self._open()


def make_optimizer(params, name: str, cuda: bool, lr: float, weight_decay: float):
    """Paged 8-bit AdamW (bitsandbytes) on a GPU when the recipe asks for it, else torch AdamW;
    constant LR."""
    name = name if cuda and name == "paged_adamw_8bit" else "adamw"
    settings = OptimizerSettings(name=name, learning_rate=lr, weight_decay=weight_decay, warmup_ratio=0.0)
    optimizer, _ = build_optimizer(params, settings)
    return optimizer, name


def grpo_step(
    policy,
    tokenizer,
    recipe: dict[str, Any],
    phases: dict[str, Phase],
    *,
    vocab_size: int,
    prompt_tokens: int,
    response_tokens: int,
    group_size: int,
    cuda: bool,
    seed: int,
) -> dict[str, Any]:
    """Generation, reference log-probs, policy forward/backward per micro-batch, optimiser step."""
    mbs = recipe["micro_batch_size"]
    temperature = recipe["temperature"]
    pad_id = tokenizer.pad_token_id
    generator = torch.Generator().manual_seed(seed)
    low = min(1000, vocab_size // 2)  # keep clear of the special tokens at the start of the vocabulary
    # A different prompt per rollout: from the second chunk on, rollouts differ in their memory, and
    # random prompts share nothing at all, so no pass can reuse a prefix: the worst case for time and memory.
    prompts = torch.randint(low, vocab_size, (group_size, prompt_tokens), generator=generator).tolist()

    generation = phases["generate"].run(
        lambda: sampler_for(policy, tokenizer, recipe["backend"])(
            prompts, max_new_tokens=response_tokens, temperature=temperature,
            do_sample=True, seed=seed, batch_size=recipe["generation_batch_size"],
            eos_token_id=vocab_size,  # one past the vocabulary: never sampled, so no early stop
        )
    )
    lengths = generation.response_lengths
    if any(n != response_tokens for n in lengths):
        raise RuntimeError(
            f"generation was meant to be forced to {response_tokens} tokens, got lengths {lengths}"
        )
    responses = generation.response_ids

    update = UpdateSettings(kl_coef=recipe["kl_coef"], clip_low=recipe["clip_low"],
                            clip_high=recipe["clip_high"], micro_batch_size=mbs, loss_agg="token-mean")
    logprob_spec = LogprobSpec(temperature=temperature, micro_batch_size=mbs, pad_id=pad_id)
    samples = Samples(prompts, responses, torch.rand(group_size, generator=generator),
                      torch.zeros(group_size, dtype=torch.long))
    gradients = GradientPass(phases["policy_forward"], phases["backward"])
    stages = {"logprobs": phases["reference"].timing, "gradients": gradients.stage,
              "optimizer": phases["optimizer"].timing}
    scored = score_samples(policy, samples, update, logprob_spec, round_samples=group_size, seed=seed,
                           clock=lambda stage: stages[stage]())
    if scored.nonfinite is not None:
        raise RuntimeError(f"non-finite {scored.nonfinite} in the random model's round")
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer, optimizer_name = make_optimizer(params, recipe["optimizer"], cuda, recipe["learning_rate"],
                                               recipe["weight_decay"])
    policy.train()
    result = train_minibatch(
        micro_batch_scorer(policy, logprob_spec),
        scored.batches[0],
        update,
        ONE_PROCESS,
        Optimisation(optimizer, params, recipe["grad_clip"], backward=gradients.backward),
        max_response_len=response_tokens,
        clock=lambda stage: stages[stage](),
    )
    optimizer.zero_grad(set_to_none=True)
    return {"loss": result.metrics["loss"], "grad_norm": result.grad_norm, "optimizer": optimizer_name,
            "trainable_parameters": sum(p.numel() for p in params), "generated_tokens": sum(lengths)}


def run_benchmark(
    *,
    scale: float | None = None,
    prompt_tokens: int | None = None,
    response_tokens: int | None = None,
    group_size: int | None = None,
    micro_batch_size: int | None = None,
    vocab_size: int | None = None,
    compute_dtype: str | None = None,
    device: str | None = None,
    seed: int = 0,
    tokenizer: str = "smollm2-135m-instruct",
    out: str | os.PathLike | None = DEFAULT_OUT,
    verbose: bool = True,
    backend: str | None = None,
    allow_dirty: bool = False,
) -> dict[str, Any]:
    """Build, quantise and step once; print the phase table; write the JSON to ``out`` (None: don't).

    Unset sizes take the recipe's values on a GPU and :data:`CPU_DEFAULTS` on a CPU. The report's
    ``record`` (:mod:`gpu_record`) names the commit (a GPU run refuses a dirty tree unless
    ``allow_dirty``), the backend that sampled, and each phase's peaks sampled while it ran.
    """
    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device cuda asked for but torch sees no GPU")
    recipe = read_recipe()
    recipe["backend"] = backend or recipe["backend"]
    if micro_batch_size is not None:
        recipe["micro_batch_size"] = micro_batch_size
    if group_size is not None:
        recipe["group_size"] = group_size
    scale = scale if scale is not None else (1.0 if cuda else CPU_DEFAULTS["scale"])
    prompt_tokens = prompt_tokens or (recipe["prompt_tokens"] if cuda else CPU_DEFAULTS["prompt_tokens"])
    response_tokens = response_tokens or (
        recipe["response_tokens"] if cuda else CPU_DEFAULTS["response_tokens"]
    )
    compute_dtype = compute_dtype or (recipe["compute_dtype"] if cuda else "float32")
    shape = scaled_shape(scale, vocab_size)
    record = GpuRecord.start(allow_dirty=allow_dirty or not cuda)  # a CPU run is no GPU result
    machine = machine_info()
    cap_fraction = None
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        cap_fraction = min(1.0, GPU_CAP_BYTES / total)
        torch.cuda.set_per_process_memory_fraction(cap_fraction, 0)

    names = ("load", "generate", "reference", "policy_forward", "backward", "optimizer")
    phases = {name: Phase(name, cuda, record.clock) for name in names}
    report: dict[str, Any] = {
        "benchmark": "bench_scale",
        "command": command_line(),
        "device": "cuda" if cuda else "cpu",
        "gpu_cap_gib": gib(GPU_CAP_BYTES) if cuda else None,
        "gpu_cap_fraction": cap_fraction,
        "scale": scale,
        "shape": shape,
        "full_qwen3_4b_shape": scale == 1.0 and vocab_size in (None, QWEN3_4B["vocab_size"]),
        "prompt_tokens": prompt_tokens,
        "response_tokens": response_tokens,
        "group_size": recipe["group_size"],
        "micro_batch_size": recipe["micro_batch_size"],
        "generation_batch_size": recipe["generation_batch_size"],
        "compute_dtype": compute_dtype,
        "lora": {
            "r": recipe["lora"].r,
            "alpha": recipe["lora"].alpha,
            "target_modules": recipe["lora"].target_modules,
        },
        "gradient_checkpointing": recipe["gradient_checkpointing"],
        "backend": recipe["backend"],
        "upcast_unquantised": recipe["upcast_unquantised"],
        "recipe": str(CONFIG_PATH.relative_to(CONFIG_PATH.parent.parent)),
    }
    if cuda:
        try:
            import bitsandbytes

            report["bitsandbytes"] = bitsandbytes.__version__
        except ImportError:
            report["bitsandbytes"] = None
    tokenizer = load_tokenizer(str(resolve_model_path(tokenizer)))
    status = "ok"
    with record, tempfile.TemporaryDirectory(prefix="memalpha-scale-") as folder:
        # 4B random weights: seconds on a GPU, minutes on its CPU
        with torch.device("cuda" if cuda else "cpu"):
            report["base_parameters"] = build_random_model_dir(folder, shape, tokenizer, seed=seed)
        if cuda:
            torch.cuda.empty_cache()
        try:
            policy, policy_tokenizer = phases["load"].run(
                lambda: load_policy(
                    folder, precision="nf4", lora=recipe["lora"], compute_dtype=compute_dtype,
                    gradient_checkpointing=recipe["gradient_checkpointing"], device="cuda" if cuda else "cpu",
                    upcast_unquantised=recipe["upcast_unquantised"],
                )
            )
            report["step"] = grpo_step(
                policy, policy_tokenizer, recipe, phases, vocab_size=shape["vocab_size"],
                prompt_tokens=prompt_tokens, response_tokens=response_tokens, group_size=recipe["group_size"],
                cuda=cuda, seed=seed,
            )
        except torch.cuda.OutOfMemoryError:
            status = "out_of_memory"  # the phase that ran out carries the error in its row
    report["status"] = status
    report["record"] = record.as_dict()
    report["phases"] = [p.as_dict() for p in phases.values()]
    step_phases = [p for name, p in phases.items() if name != "load"]
    report["step_seconds"] = sum(p.seconds for p in step_phases)
    report["time_share"] = {
        p.name: p.seconds / report["step_seconds"] if report["step_seconds"] > 0 else 0.0 for p in step_phases
    }
    if cuda:
        report["peak_allocated_gib"] = max(gib(p.peak_allocated) for p in phases.values())
        report["peak_reserved_gib"] = max(gib(p.peak_reserved) for p in phases.values())
        report["device_used_gib"] = max(gib(p.device_used) for p in phases.values())
        report["fits_24gib"] = status == "ok" and max(
            report["peak_reserved_gib"], report["device_used_gib"]
        ) <= gib(GPU_CAP_BYTES)
    else:
        report["peak_rss_gib"] = max(gib(p.peak_rss) for p in phases.values())

    if verbose:
        what = "Qwen3-4B" if report["full_qwen3_4b_shape"] else f"Qwen3-4B structure at scale {scale}"
        print(
            f"\n{what}: {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"heads {shape['num_attention_heads']}/{shape['num_key_value_heads']}, vocab "
            f"{shape['vocab_size']}, {report['base_parameters'] / 1e6:.0f}M params; "
            f"n={recipe['group_size']}, prompt {prompt_tokens}, response {response_tokens}, "
            f"micro-batch {recipe['micro_batch_size']}, {report['device']}"
        )
        mem_header = ("peak alloc GiB", "peak reserved GiB") if cuda else ("peak RSS GiB",)
        rows = []
        for p in phases.values():
            d = p.as_dict()
            share = None if p.name == "load" else 100 * report["time_share"][p.name]
            mem = (d["peak_allocated_gib"], d["peak_reserved_gib"]) if cuda else (d["peak_rss_gib"],)
            rows.append([p.name, p.seconds, share, *mem])
        rows.append(["step (no load)", report["step_seconds"], 100.0,
                     *((report["peak_allocated_gib"], report["peak_reserved_gib"]) if cuda
                       else (report["peak_rss_gib"],))])
        print_table(("phase", "seconds", "% of step", *mem_header), rows)
        print(f"status: {status}")
    if out is not None:
        path = write_json(report, out, machine=machine)
        if verbose:
            print(f"wrote {path}")
    report["machine"] = machine
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scale", type=float, default=None,
                        help=f"shrink layers/widths/heads (default 1 on GPU, {CPU_DEFAULTS['scale']} on CPU)")
    parser.add_argument(
        "--prompt-tokens", type=int, default=None, help="prompt length (default: the recipe's 6144 on GPU)"
    )
    parser.add_argument("--response-tokens", type=int, default=None,
                        help="forced response length (default: the recipe's 2048 on GPU)")
    parser.add_argument(
        "--group-size", type=int, default=None, help="rollouts in the step (default: the recipe's 8)"
    )
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--vocab-size", type=int, default=None, help="shrink the vocabulary (smoke tests)")
    parser.add_argument("--compute-dtype", choices=("bfloat16", "float32", "float16"), default=None,
                        help="NF4 compute dtype (default: the recipe's bfloat16 on GPU, float32 on CPU)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct",
                        help="tokenizer folder or the embedded model's name (default: the embedded one)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny run for tests: scale 0.03, vocab 2048, prompt 16, response 4, n 2, micro-batch 1",
    )
    parser.add_argument("--backend", default=None, choices=SAMPLING_BACKENDS,
                        help="how tokens are sampled (model.rollout.backend; default the recipe's, auto)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale, args.vocab_size = args.scale or 0.03, args.vocab_size or 2048
        args.prompt_tokens, args.response_tokens = args.prompt_tokens or 16, args.response_tokens or 4
        args.group_size, args.micro_batch_size = args.group_size or 2, args.micro_batch_size or 1
        args.device = args.device or "cpu"
    for name in ("prompt_tokens", "response_tokens", "group_size", "micro_batch_size", "vocab_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return run_benchmark(
        scale=args.scale, prompt_tokens=args.prompt_tokens, response_tokens=args.response_tokens,
        group_size=args.group_size, micro_batch_size=args.micro_batch_size, vocab_size=args.vocab_size,
        compute_dtype=args.compute_dtype, device=args.device, seed=args.seed, tokenizer=args.tokenizer,
        out=args.out, backend=args.backend, allow_dirty=args.allow_dirty,
    )


if __name__ == "__main__":
    prefer_expandable_segments()  # before anything touches CUDA (memalpha/allocator.py)
    main()
