"""The CUDA-graph sampling backend on the CPU: its step runs eagerly here (no capture), so these
tests check everything but the capture itself: the same greedy tokens as memalpha's loop and
``model.generate``, the same seeded samples and distribution, end tokens, the dense copies of
float and NF4 weights, and the models it refuses."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    SAMPLING_FILTERS,
    SAMPLING_PROMPT,
    SAMPLING_ROWS,
    assert_follows_the_models_distribution,
    build_tiny_model_dir,
    early_end_token,
    loop_generate,
    model_generate_path,
    randomise_lora_b,
)
from numerics import assert_close

from memalpha.lm.core.modes import folded_adapters, folded_weight, is_four_bit, plain_adapters
from memalpha.lm.core.prompt_sharing import (
    PromptSharing,
    pad_prompt_response,
    split_decoder_and_head,
    unique_rows,
)
from memalpha.lm.sampling import graph_decode
from memalpha.lm.sampling.filters import next_tokens
from memalpha.lm.sampling.generation import generate

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]
# repeated prompts, a single one, and one far shorter than the rest (left padding)
PROMPTS = [SYSTEM + [20, 21, 22], SYSTEM + [20, 21, 22], SYSTEM + [30], SYSTEM + [40, 41], [19, 23]]
NEVER = 10_000  # an end token no row emits


def graph_sample(model, tokenizer, prompts, *, max_new_tokens, eos_token_id, do_sample=True, seed=None,
                 bucket_columns=graph_decode.BUCKET_COLUMNS, share_prefix=True, in_graph=False,
                 eos_check_steps=graph_decode.EOS_CHECK_STEPS, stats=None, compile_backend=None, **filters):
    """The backend on ``prompts`` with :func:`generate`'s arguments: seeded the way ``generate``
    seeds (a forked global RNG), drawing through the same :func:`next_tokens`: on the host after
    every step, or with ``in_graph`` inside the step (:class:`graph_decode.GraphSampling`)."""

    def pick(logits):
        return next_tokens(logits, do_sample=do_sample, **filters)

    how = {"sampling": graph_decode.GraphSampling(do_sample, **filters)} if in_graph else {"pick": pick}
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        return graph_decode.sample(
            model,
            prompts,
            pad_id=tokenizer.pad_token_id,
            max_new_tokens=max_new_tokens,
            eos_ids=[eos_token_id],
            bucket_columns=bucket_columns,
            share_prefix=share_prefix,
            eos_check_steps=eos_check_steps,
            stats=stats,
            compile_backend=compile_backend,
            **how,
        )


def lora_and_four_bit_layers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if plain_adapters(m, quantised=True) is not None or is_four_bit(m)]


@pytest.fixture(scope="module")
def nf4_policy(tmp_path_factory, tokenizer):
    """The peaked tiny Llama loaded in NF4 (float32 compute) with a drawn LoRA adapter."""
    from memalpha.lm.core.policy import LoraSettings, load_policy

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("nf4-policy"), tokenizer, initializer_range=0.3)
    torch.manual_seed(0)
    model, tokenizer = load_policy(
        folder, precision="nf4", compute_dtype="float32", lora=LoraSettings(r=4, alpha=8)
    )
    randomise_lora_b(model, 0.2)
    for module in model.modules():  # bitsandbytes' AVX512-BF16 CPU kernel would multiply in bf16
        if is_four_bit(module):
            module.support_avx512bf16_for_cpu = False
    return model.eval(), tokenizer


# ----------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_greedy_tokens_equal_generate_and_model_generate_while_rows_end_apart(
    peaked_policy, monkeypatch, dtype
):
    model, tokenizer = peaked_policy
    model = copy.deepcopy(model).to(dtype).eval()
    assert graph_decode.supports(model) is None
    end = early_end_token(model, tokenizer, PROMPTS, others_from=1, all_others=False)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": end}
    ours, cut = graph_sample(model, tokenizer, PROMPTS, **kwargs)
    own_loop = generate(model, tokenizer, PROMPTS, **kwargs)
    assert ours == own_loop.response_ids and cut == own_loop.truncated
    if dtype == torch.float64:  # model.generate too (in float32 once is enough: it is the slow one)
        theirs = model_generate_path(model, tokenizer, PROMPTS, **kwargs)
        assert ours == theirs.response_ids and cut == theirs.truncated
    lengths = [len(r) for r in ours]
    assert min(lengths) < max(lengths) == 10, "the rows should end at different steps, some never"
    assert ours[0][-1] == end and not cut[0] and cut[lengths.index(10)]


def test_seeded_samples_equal_memalphas_loop_while_rows_end(peaked_policy):
    """Only live rows draw, in their order, so the random stream is the reference loop's."""
    model, tokenizer = peaked_policy
    end = early_end_token(model, tokenizer, PROMPTS, others_from=1, all_others=False)
    kwargs = {
        "max_new_tokens": 12,
        "eos_token_id": end,
        "seed": 5,
        "temperature": 1.3,
        "top_k": 40,
        "top_p": 0.95,
    }
    ours, cut = graph_sample(model, tokenizer, PROMPTS, **kwargs)
    theirs = generate(model, tokenizer, PROMPTS, **kwargs)
    assert ours == theirs.response_ids and cut == theirs.truncated


@pytest.mark.parametrize("in_graph", [False, True], ids=["host", "in-graph"])
def test_sampled_tokens_follow_the_models_distribution(small_vocab_model_dir, in_graph):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_dir, dtype=torch.float64).eval()
    tokenizer = AutoTokenizer.from_pretrained(small_vocab_model_dir)
    ours, _ = graph_sample(model, tokenizer, [SAMPLING_PROMPT] * SAMPLING_ROWS, max_new_tokens=2, seed=0,
                           eos_token_id=NEVER, in_graph=in_graph, **SAMPLING_FILTERS)
    assert_follows_the_models_distribution(model, torch.tensor(ours))


def test_end_tokens_stop_rows_and_only_live_rows_are_picked(peaked_policy):
    """A scripted pick: row 1 ends at once, row 0 at the third token, row 2 never; the tokens after
    an end are dropped, the flags say who ran out, and ``pick`` sees only the live rows."""
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(PROMPTS[2:5], [[], [], []], tokenizer.pad_token_id)
    script = iter([[5, 99, 6], [7, 8], [99, 9], [10]])
    seen_rows = []

    def pick(logits):
        seen_rows.append(logits.shape[0])
        return torch.tensor(next(script))

    with torch.no_grad():
        tokens, cut = graph_decode.decode_in_graph(
            decoder, head, config, batch, max_new_tokens=4, eos_ids=[99], pick=pick
        )
    assert tokens == [[5, 7, 99], [99], [6, 8, 9, 10]]
    assert cut == [False, False, True]
    assert seen_rows == [3, 2, 2, 1]


def test_a_step_run_twice_changes_nothing_and_reads_buffers_that_never_move(peaked_policy):
    """What a CUDA graph needs of the step, checked eagerly: the capture's warm-up runs the step on
    the same buffers before its replay, so running a step twice must change nothing (its cache
    column is written again with the same values); and a replay reads the addresses seen at
    capture, so the step's inputs and the cache must be written in place, never rebound."""
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(PROMPTS, [[] for _ in PROMPTS], tokenizer.pad_token_id)
    greedy = {"max_new_tokens": 6, "eos_ids": [NEVER], "pick": lambda logits: logits.argmax(-1)}
    original = graph_decode.FixedStep.step
    addresses = []

    def twice(self, *width):
        tensors = [self.tokens, self.positions, self.column, self.padding, self.open]
        tensors += [b for layer in self.cache.layers for b in (layer.key_buffer, layer.value_buffer)]
        addresses.append([t.data_ptr() for t in tensors])
        first = original(self, *width)
        second = original(self, *width)
        assert torch.equal(first, second)
        return second

    with torch.no_grad():
        expected, _ = graph_decode.decode_in_graph(decoder, head, config, batch, **greedy)
        graph_decode.FixedStep.step = twice
        try:
            repeated, _ = graph_decode.decode_in_graph(decoder, head, config, batch, **greedy)
        finally:
            graph_decode.FixedStep.step = original
    assert repeated == expected
    assert len(addresses) == 5 and all(a == addresses[0] for a in addresses)


HOST_READS = {
    "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
}
"""Operators that read a device tensor on the host (``item``, ``bool``, ``tolist``) or size their
output by its data: a CUDA graph cannot capture them."""


RANDOM_DRAWS = {"uniform_", "rand", "rand_like", "randint", "random_", "normal_", "randn", "bernoulli",
                "bernoulli_", "multinomial", "exponential_"}
"""Operators that advance an RNG's state: a captured step must run none (its variates come in a buffer)."""

IN_GRAPH_FILTERS = {"temperature": 1.3, "top_k": 40, "top_p": 0.9}


def step_operators(model, tokenizer, prompts, in_graph: bool = False) -> set[str]:
    """``namespace::name`` of every operator one decoding step of ``model`` runs (after the prefill
    and a first step), inside the backend's dense weights; with ``in_graph`` the step that also
    filters, draws and feeds its tokens (:class:`graph_decode.InGraphSampler`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Operators(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(f"{func.namespace}::{func.overloadpacket.__name__}")
            return func(*args, **(kwargs or {}))

    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(prompts, [[] for _ in prompts], tokenizer.pad_token_id)
    with torch.no_grad(), folded_adapters(model, quantised=True):
        fixed = graph_decode.FixedStep(decoder, head, config, batch, max_new_tokens=3, bucket_columns=4)
        if in_graph:
            fixed.prefill_columns()
            sampling = graph_decode.GraphSampling(True, **IN_GRAPH_FILTERS)
            sampler = graph_decode.InGraphSampler(fixed, sampling, [NEVER], chunk=3)
            sampler.begin()
            sampler.step(fixed.width())
            fixed.filled += 1
            step = sampler.step
        else:
            fixed.advance(fixed.prefill().argmax(-1), None)
            step = fixed.step
        assert fixed.width() < fixed.capacity  # a bucket, not the whole cache
        with Operators() as operators:
            step(fixed.width())
        with Operators() as probe:  # the probe sees a host read when there is one
            torch.ones(1).item()
    assert "aten::_local_scalar_dense" in probe.seen
    return operators.seen


@pytest.mark.parametrize("which", ["float64", "nf4", "float64-in-graph"])
def test_the_step_never_reads_a_tensor_on_the_host_nor_runs_a_4bit_kernel(which, peaked_policy, nf4_policy):
    """What capture needs, checked on the CPU: no operator of the step waits for the device or
    sizes a tensor by its data, and with NF4 layers none dequantises (the dense copies serve).
    The step that samples inside the graph filters and draws without touching an RNG."""
    model, tokenizer = nf4_policy if which == "nf4" else peaked_policy
    seen = step_operators(model, tokenizer, PROMPTS, in_graph=which.endswith("in-graph"))
    assert "aten::index_copy_" in seen and seen & {"aten::mm", "aten::addmm", "aten::bmm"}
    assert not {name for name in seen if name.split("::")[1] in HOST_READS}
    assert not {name for name in seen if name.startswith("bitsandbytes::")}
    assert not {name for name in seen if name.split("::")[1] in RANDOM_DRAWS}
    if which.endswith("in-graph"):  # the filters and the draw ran inside the step
        assert {"aten::topk", "aten::sort", "aten::searchsorted"} <= seen


def test_a_shared_prefix_layout_gives_the_same_tokens(peaked_policy):
    """The batch may come laid out with a shared prefix (a masked hole after it), as generation
    lays it out when it shares the prefix's cache."""
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model.eval())
    prompts = PROMPTS[:4]
    greedy = {"max_new_tokens": 6, "eos_ids": [NEVER], "pick": lambda logits: logits.argmax(-1)}
    with torch.no_grad():
        plain = pad_prompt_response(prompts, [[] for _ in prompts], tokenizer.pad_token_id)
        holed = pad_prompt_response(
            prompts, [[] for _ in prompts], tokenizer.pad_token_id, shared_prefix=len(SYSTEM)
        )
        assert not torch.equal(plain.attention_mask, holed.attention_mask)
        expected, _ = graph_decode.decode_in_graph(decoder, head, config, plain, **greedy)
        assert graph_decode.decode_in_graph(decoder, head, config, holed, **greedy)[0] == expected


# ----------------------------------------------------------------------------- buckets and shared prompts


def test_bucket_width_rounds_the_filled_length_up_and_stops_at_the_capacity():
    assert [graph_decode.bucket_width(f, 4, 10) for f in (1, 4, 5, 8, 9, 10)] == [4, 4, 8, 8, 10, 10]
    assert graph_decode.bucket_width(3, None, 10) == 10
    assert graph_decode.bucket_width(7, 1, 10) == 7
    for bad in ((0, 4, 10), (11, 4, 10)):
        with pytest.raises(ValueError, match="filled columns"):
            graph_decode.bucket_width(*bad)
    with pytest.raises(ValueError, match="bucket_columns"):
        graph_decode.bucket_width(3, 0, 10)
    assert graph_decode.first_rows([0, 0, 1, 0, 2]) == [0, 2, 4]
    with pytest.raises(ValueError, match="first appearance"):
        graph_decode.first_rows([1, 0])


def forced_logits(run, steps: int, rows: int, seed: int = 0) -> list[torch.Tensor]:
    """The ``[B, V]`` logits ``run(pick)`` hands its picker at each step when every row is fed the
    same scripted tokens (teacher forcing), so two paths can be compared step by step."""
    script = torch.randint(0, 1000, (steps, rows), generator=torch.Generator().manual_seed(seed))
    seen: list[torch.Tensor] = []

    def pick(logits):
        seen.append(logits.double().clone())
        return script[len(seen) - 1]

    run(pick)
    assert len(seen) == steps
    return seen


def reference_logits(model, tokenizer, prompts, steps: int) -> list[torch.Tensor]:
    """The reference loop's (memalpha_lab.growing_cache) teacher-forced logits, plain left-padded batch."""
    from memalpha_lab import growing_cache

    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(prompts, [[] for _ in prompts], tokenizer.pad_token_id)
    room = growing_cache.growing_cache(decoder, batch.input_ids.shape[1] + steps)
    limits = {"max_new_tokens": steps, "eos_ids": [NEVER]}
    with torch.no_grad():
        return forced_logits(
            lambda pick: growing_cache.decode(decoder, head, config, batch, room, pick=pick, **limits),
            steps, len(prompts),
        )


def graph_logits(model, tokenizer, prompts, steps: int, *, bucket_columns, share: bool, stats=None):
    """The backend's teacher-forced logits, each distinct prompt prefilled once when ``share``."""
    decoder, head, config = split_decoder_and_head(model.eval())
    limits = {"max_new_tokens": steps, "eos_ids": [NEVER], "bucket_columns": bucket_columns, "stats": stats}
    with torch.no_grad(), folded_adapters(model, quantised=True):
        sharing = PromptSharing.of(decoder, prompts, share)
        prefix, prompt_of_row = sharing.prefix, sharing.prompt_of_row(prompts)
        batch = sharing.layout(prompts, [[] for _ in prompts], tokenizer.pad_token_id, "cpu")
        return forced_logits(
            lambda pick: graph_decode.decode_in_graph(decoder, head, config, batch, pick=pick, prefix=prefix,
                                             prompt_of_row=prompt_of_row, **limits),
            steps, len(prompts),
        )


@pytest.mark.parametrize("bucket_columns", [None, 1, 4, 5])
def test_bucketed_steps_give_the_reference_loops_logits_in_float64(peaked_policy, bucket_columns):
    """Teacher-forced, every step's logits equal the reference loop's to float64 rounding, while
    the steps attend over a few widths only, each a bucket of the filled length, in order."""
    model, tokenizer = peaked_policy
    steps = 10
    expected = reference_logits(model, tokenizer, PROMPTS, steps)
    stats: dict = {}
    ours = graph_logits(model, tokenizer, PROMPTS, steps, bucket_columns=bucket_columns, share=False,
                        stats=stats)
    for step, (a, b) in enumerate(zip(ours, expected)):
        assert_close(a, b, 1e-12, f"logits of step {step}")
    width, capacity = max(len(p) for p in PROMPTS), max(len(p) for p in PROMPTS) + steps
    filled = range(width + 1, width + steps)  # the cache after each step that follows the prefill
    assert stats["widths"] == sorted({graph_decode.bucket_width(f, bucket_columns, capacity) for f in filled})
    assert stats["steps"] == steps - 1 and stats["captured"] is False


@pytest.mark.parametrize(
    ("prompts", "prefix_length"),
    [(PROMPTS, 0), (PROMPTS[2:], 0), (PROMPTS[:4], len(SYSTEM)), (PROMPTS[1:4], len(SYSTEM)),
     ([PROMPTS[0]] * 4, len(PROMPTS[0]) - 1)],
    ids=["none", "none-distinct", "prefix", "prefix-distinct", "identical"],
)
def test_shared_prompts_prefilled_once_give_the_unshared_logits_in_float64(
    peaked_policy, prompts, prefix_length
):
    """Each distinct prompt prefilled once (on its shared prefix) and copied to its rows gives every
    row the logits it gets alone; no prefill, distinct prompts or identical, hands the decoder a
    per-row mask of more than one query (a prompt runs alone, at batch size 1, unpadded)."""
    model, tokenizer = peaked_policy
    decoder, _, _ = split_decoder_and_head(model)
    steps = 6
    expected = reference_logits(model, tokenizer, prompts, steps)
    masks = []
    hook = decoder.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(tuple(kwargs["attention_mask"].shape)), with_kwargs=True
    )
    try:
        shared = graph_logits(model, tokenizer, prompts, steps, bucket_columns=4, share=True)
    finally:
        hook.remove()
    for step, (a, b) in enumerate(zip(shared, expected)):
        assert_close(a, b, 1e-12, f"logits of step {step}")
    sharing = PromptSharing.of(decoder, prompts)
    prefix, prompt_of_row = sharing.prefix, sharing.prompt_of_row(prompts)
    assert (prefix.length if prefix else 0) == prefix_length
    assert prompt_of_row == unique_rows([p[prefix_length:] for p in prompts])[1]
    prefills = [shape for shape in masks if len(shape) == 2]
    assert len(prefills) == len(set(prompt_of_row)) and all(shape[0] == 1 for shape in prefills), masks
    assert all(shape[-2] == 1 for shape in masks if len(shape) == 4), masks  # no [B, 1, P, P] mask


def test_buckets_and_shared_prompts_keep_seeded_samples_and_generates_tokens(peaked_policy):
    """Seeded samples through small buckets and shared prompts are the reference loop's; and
    ``graph_decode.sample`` with ``generate``'s own in-graph filters and seeding (what the named
    backend runs on CUDA) gives the reference loop's tokens."""
    model, tokenizer = peaked_policy
    prompts = PROMPTS[:2] * 2 + PROMPTS[2:]
    end = early_end_token(model, tokenizer, prompts, others_from=1, all_others=False)
    kwargs = {"max_new_tokens": 12, "eos_token_id": end, "seed": 7, "temperature": 1.3, "top_k": 40,
              "top_p": 0.95}
    ours, cut = graph_sample(model, tokenizer, prompts, bucket_columns=3, **kwargs)
    theirs = loop_generate(model, tokenizer, prompts, **kwargs)
    assert ours == theirs.response_ids and cut == theirs.truncated
    in_graph, in_graph_cut = graph_sample(model, tokenizer, prompts, in_graph=True, **kwargs)
    assert in_graph == theirs.response_ids and in_graph_cut == theirs.truncated


# ----------------------------------------------------------------------------- sampling inside the graph


@pytest.mark.parametrize("eos_check_steps", [1, 3, graph_decode.EOS_CHECK_STEPS])
def test_in_graph_greedy_tokens_equal_the_reference_loops_while_rows_end_apart(peaked_policy,
                                                                                   eos_check_steps):
    """Rows that end keep running inside a chunk; their tokens after the end are cut on the host."""
    model, tokenizer = peaked_policy
    end = early_end_token(model, tokenizer, PROMPTS, others_from=1, all_others=False)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": end}
    ours, cut = graph_sample(model, tokenizer, PROMPTS, in_graph=True, eos_check_steps=eos_check_steps,
                             bucket_columns=4, **kwargs)
    theirs = loop_generate(model, tokenizer, PROMPTS, **kwargs)
    assert ours == theirs.response_ids and cut == theirs.truncated
    lengths = [len(r) for r in ours]
    assert min(lengths) < max(lengths) == 10 and ours[0][-1] == end


@pytest.mark.parametrize("eos_check_steps", [1, 3, 5, graph_decode.EOS_CHECK_STEPS])
def test_in_graph_seeded_samples_equal_the_reference_loops_while_rows_end(peaked_policy, eos_check_steps):
    """The live rows take the variates the reference loop draws for them, across chunks whose
    variates were drawn before the rows ended: the same tokens, seeded, rows ending or not."""
    model, tokenizer = peaked_policy
    prompts = PROMPTS[:2] * 2 + PROMPTS[2:]
    kwargs = {"max_new_tokens": 14, "seed": 7, **IN_GRAPH_FILTERS}
    kwargs["eos_token_id"] = sampled_end_token(model, tokenizer, prompts, kwargs)
    stats: dict = {}
    ours, cut = graph_sample(model, tokenizer, prompts, in_graph=True, eos_check_steps=eos_check_steps,
                             bucket_columns=3, stats=stats, **kwargs)
    theirs = loop_generate(model, tokenizer, prompts, **kwargs)
    assert ours == theirs.response_ids and cut == theirs.truncated
    lengths = [len(r) for r in ours]
    assert min(lengths) < 6 and max(lengths) == 14, "some rows should end early, some never"
    assert stats["host_reads"] == -(-14 // eos_check_steps) and stats["steps"] == 14


@pytest.mark.parametrize("in_graph", [True, False])
def test_a_compiled_step_traces_whole_once_per_width_and_samples_the_same(peaked_policy, in_graph):
    """``compile_backend`` compiles the step with ``fullgraph`` (a graph break would raise) once per
    attention width, more widths than dynamo's default limit of 8 included, and the seeded samples
    stay the reference loop's. The ``eager`` backend traces as ``inductor`` does without generating
    kernels, so the CPU checks the tracing in seconds; the kernels are the GPU check's."""
    import torch._dynamo

    model, tokenizer = peaked_policy
    prompts = PROMPTS[:2] * 2 + PROMPTS[2:]
    kwargs = {"max_new_tokens": 12, "seed": 7, **IN_GRAPH_FILTERS, "eos_token_id": NEVER}
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    stats: dict = {}
    ours, cut = graph_sample(model, tokenizer, prompts, in_graph=in_graph, bucket_columns=1, stats=stats,
                             compile_backend=counter, **kwargs)
    torch._dynamo.reset()
    theirs = loop_generate(model, tokenizer, prompts, **kwargs)
    assert ours == theirs.response_ids and cut == theirs.truncated
    assert len(stats["widths"]) > 8 and counter.frame_count == len(stats["widths"])


def test_compile_limits_leave_room_for_every_width_and_refuse_a_silent_fall_back():
    import torch._dynamo.config as dynamo

    with graph_decode.compile_limits(capacity=6144 + 2048, bucket_columns=256):
        assert dynamo.recompile_limit == 32 + 2 and dynamo.fail_on_recompile_limit_hit
    with graph_decode.compile_limits(capacity=100, bucket_columns=None):
        assert dynamo.recompile_limit == 8
    assert graph_decode.compiled_step(len, None) is len


def sampled_end_token(model, tokenizer, prompts, kwargs) -> int:
    """A token that row 0 samples (seeded by ``kwargs``) at its second to fifth step, and half the
    rows or more never sample: as the end token it makes some rows end early and others run out."""
    free = loop_generate(model, tokenizer, prompts, eos_token_id=NEVER, **kwargs)
    rows = free.response_ids
    for step in range(1, 5):
        token = rows[0][step]
        if token not in rows[0][:step] and sum(token not in row for row in rows) >= len(rows) // 2:
            return token
    pytest.fail("the seeded rows share every early token of row 0: pick another seed")


def test_variates_hand_the_live_rows_the_stream_the_reference_draws():
    """Rows dying mid-chunk: every step's variates for the live rows are the next ones of the
    global stream, as ``torch.rand((live, 1))`` per step gives them to the reference loop."""
    alive_by_step = [[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 0], [0, 0, 1, 0],
                     [0, 0, 0, 0], [0, 0, 0, 0]]
    chunk = 3
    torch.manual_seed(11)
    variates = graph_decode.Variates(chunk * 4, torch.float64, torch.device("cpu"))
    ours = []
    for first in range(0, len(alive_by_step), chunk):
        variates.refill()
        spent = 0
        for alive in alive_by_step[first : first + chunk]:
            alive = torch.tensor(alive, dtype=torch.bool)
            ours.append(variates.take(alive)[alive])
            spent += int(alive.sum())
        variates.spent = spent
    torch.manual_seed(11)
    expected = [torch.rand((sum(alive), 1), dtype=torch.float64) for alive in alive_by_step]
    for step, (a, b) in enumerate(zip(ours, expected)):
        assert torch.equal(a, b), f"variates of step {step}"


@pytest.mark.parametrize("filters", [{}, {"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.6},
                                     {"temperature": 1.3, "top_k": 5, "top_p": 0.8}])
def test_in_graph_pick_equals_the_filters_on_the_same_logits(filters):
    """Same logits (ties included), same variates: the tokens of :func:`next_tokens`, float64."""
    logits = torch.randn((64, 30), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits[:, 7] = logits[:, 3]  # a tie at every row
    with torch.random.fork_rng():
        torch.manual_seed(1)
        expected = next_tokens(logits, do_sample=True, **filters)
        torch.manual_seed(1)
        draws = torch.rand((64, 1), dtype=torch.float64)
        ours = graph_decode.GraphSampling(True, **filters).pick(logits, draws)
    assert torch.equal(ours, expected) and len(set(ours.tolist())) > 1
    assert torch.equal(graph_decode.GraphSampling(False).pick(logits, None), logits.argmax(-1))


class HostReads:
    """Counts the reads of tensor data on the host while open: ``tolist`` and ``numpy`` calls and
    the dispatched operators of :data:`HOST_READS` (``item``, ``bool``, ``nonzero``, ...)."""

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode

        self.count = 0
        counter = self

        class Dispatched(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.count += func.overloadpacket.__name__ in HOST_READS
                return func(*args, **(kwargs or {}))

        self.mode = Dispatched()
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original))

    def _counted(self, original):
        def read(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)

        return read

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def test_in_graph_sampling_reads_the_host_once_a_chunk_not_once_a_token(peaked_policy, monkeypatch):
    """Host syncs per generated token, counted over whole decodings of 8 and 24 tokens: their
    difference is the token loop's (the prefill's few reads, per prompt, are the same in both):
    one a chunk of ``eos_check_steps`` steps when the step samples, one a token when the host picks."""
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(PROMPTS, [[] for _ in PROMPTS], tokenizer.pad_token_id)
    chunk = 8
    choices = {"host": {"pick": lambda logits: next_tokens(logits, do_sample=True)},
               "in-graph": {"sampling": graph_decode.GraphSampling(), "eos_check_steps": chunk}}
    reads, loop_reads = {}, {}
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for how, choice in choices.items():
            for tokens in (8, 24):
                stats: dict = {}
                limits = {"max_new_tokens": tokens, "eos_ids": [NEVER], "bucket_columns": 4, "stats": stats}
                with HostReads(monkeypatch) as counter:
                    generated, _ = graph_decode.decode_in_graph(
                        decoder, head, config, batch, **choice, **limits
                    )
                assert all(len(row) == tokens for row in generated)
                reads[how, tokens], loop_reads[how, tokens] = counter.count, stats["host_reads"]
    per_token = {how: (reads[how, 24] - reads[how, 8]) / 16 for how in choices}
    assert per_token == {"host": 1.0, "in-graph": 1 / chunk}
    assert all(loop_reads[how, 24] - loop_reads[how, 8] == reads[how, 24] - reads[how, 8] for how in choices)
    assert loop_reads["in-graph", 24] == 24 // chunk


def test_a_capture_puts_back_what_the_warm_up_advanced(monkeypatch):
    """The warm-up really runs the step, which advances its own buffers when it samples in the
    graph; the capture copies them back, so the first replay is the step's first run. CUDA is
    faked: a stream API that does nothing and a graph that records the step and replays it."""
    from contextlib import contextmanager

    capturing = []

    class Graph:
        def replay(self):
            self.output.copy_(self.step())

    @contextmanager
    def graph(recorded, **kwargs):
        capturing.append(True)
        yield
        capturing.pop()

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextmanager(lambda: (yield))())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    counter = torch.zeros(1)

    def step():
        if not capturing:  # a capture records the kernels without running them
            counter.add_(1)
        return counter.clone()

    replayed = graph_decode.ReplayedStep(step, capture=True, warmup=2, state=[counter])
    original_record = replayed._record

    def record():
        original_record()
        replayed.graph.step = step
        replayed.graph.output = replayed.output

    replayed._record = record
    assert replayed().tolist() == [1.0] and replayed().tolist() == [2.0] and replayed.captured


# ----------------------------------------------------------------------------- dense weights


def test_folded_weight_is_w_plus_s_b_a_in_float64(peaked_policy):
    model, _ = peaked_policy
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    (name,) = plain_adapters(layer)
    a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
    expected = layer.get_base_layer().weight + layer.scaling[name] * b @ a
    assert expected.dtype == torch.float64 and (b @ a).norm() > 0
    assert_close(folded_weight(layer, [name]), expected, 1e-14, "folded weight")


def test_nf4_folded_weight_is_the_dequantised_weight_plus_s_b_a(nf4_policy):
    from bitsandbytes.functional import dequantize_4bit

    model, _ = nf4_policy
    layer = model.get_base_model().model.layers[1].mlp.down_proj
    base = layer.get_base_layer()
    assert is_four_bit(base) and plain_adapters(layer) is None  # not folded unless asked
    (name,) = plain_adapters(layer, quantised=True)
    a, b = layer.lora_A[name].weight.double(), layer.lora_B[name].weight.double()
    dequantised = dequantize_4bit(base.weight.data, base.weight.quant_state).double()
    expected = dequantised + layer.scaling[name] * b @ a
    folded = folded_weight(layer, [name])
    assert folded.dtype == torch.float32  # the layer's compute dtype
    assert_close(folded.double(), expected, 1e-6, "folded NF4 weight")


def test_nf4_layers_run_dense_inside_the_block_and_get_their_forwards_back(nf4_policy):
    model, _ = nf4_policy
    ids = torch.tensor([PROMPTS[0]])
    layers = lora_and_four_bit_layers(model)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with folded_adapters(model, quantised=True) as count:
            dense = model(input_ids=ids).logits
            swapped = [m for m in model.modules() if "forward" in vars(m)]
    lora = [m for m in layers if plain_adapters(m, quantised=True) is not None]
    assert count == len(swapped) == len(lora) == 14  # every 4-bit base sits under a LoRA layer
    assert all(not is_four_bit(m) for m in swapped)
    assert_close(dense, expected, 1e-5, "logits from dense copies")
    assert all("forward" not in vars(m) for m in model.modules())
    with pytest.raises(RuntimeError, match="boom"), folded_adapters(model, quantised=True):
        raise RuntimeError("boom")
    assert all("forward" not in vars(m) for m in model.modules())
    with model.disable_adapter(), folded_adapters(model, quantised=True) as count:  # bare 4-bit layers
        assert count == 14 and all(is_four_bit(m) for m in model.modules() if "forward" in vars(m))


def test_nf4_greedy_tokens_equal_generate(nf4_policy):
    model, tokenizer = nf4_policy
    assert graph_decode.supports(model) is None
    kwargs = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": NEVER}
    ours, _ = graph_sample(model, tokenizer, PROMPTS, **kwargs)
    assert ours == generate(model, tokenizer, PROMPTS, **kwargs).response_ids
    assert all("forward" not in vars(m) for m in model.modules())  # the dense copies are gone


# ----------------------------------------------------------------------------- what it refuses


def test_dora_sliding_windows_and_training_mode_are_refused(tmp_path, tokenizer, peaked_policy):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM

    folder = build_tiny_model_dir(tmp_path / "dora", tokenizer)
    dora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True),
    )
    assert "DoRA" in graph_decode.supports(dora)
    with pytest.raises(ValueError, match="cannot sample from this model: .*DoRA"):
        graph_decode.sample(
            dora, PROMPTS, pad_id=0, max_new_tokens=2, eos_ids=[NEVER], pick=lambda x: x.argmax(-1)
        )
    windowed = MistralForCausalLM(
        MistralConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=4,
            vocab_size=64,
        )
    )
    assert "sliding-window" in graph_decode.supports(windowed)
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model)
    batch = pad_prompt_response(PROMPTS, [[] for _ in PROMPTS], tokenizer.pad_token_id)
    model.train()
    try:
        with pytest.raises(ValueError, match="eval mode"):
            graph_decode.decode_in_graph(
                decoder, head, config, batch, max_new_tokens=2, eos_ids=[NEVER], pick=lambda x: x
            )
    finally:
        model.eval()
    with pytest.raises(ValueError, match="CUDA device"):
        graph_decode.decode_in_graph(
            decoder, head, config, batch, max_new_tokens=2, eos_ids=[NEVER], pick=lambda x: x, capture=True
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the capture succeeds: nothing to fail")
def test_a_failed_capture_raises_and_never_decodes_eagerly():
    """Without CUDA the capture fails at its first CUDA call: the step raises instead of running
    eagerly under a name that says captured."""
    calls = []

    def step():
        calls.append(1)
        return torch.ones(2)

    with pytest.raises((RuntimeError, AssertionError)):
        graph_decode.ReplayedStep(step, capture=True)()
    assert not calls  # nothing ran eagerly
    eager = graph_decode.ReplayedStep(step, capture=False)
    assert torch.equal(eager(), torch.ones(2)) and not eager.captured


def test_a_capture_warm_up_at_a_chunks_last_slot_stays_in_bounds(peaked_policy):
    """The warm-up before a capture really runs the step (twice): each run starts from the state
    the real step will find, so a step that is the last of its chunk of host reads (a width's first
    step can be, for prompts of any length) writes no history slot past the chunk's. Run here on
    the CPU, where an index past the end raises, as on the GPU it fails a device-side assert that
    ends the process's CUDA context (the fit of configs/qlora_4090.yaml on an H200 did)."""
    model, tokenizer = peaked_policy
    decoder, head, config = split_decoder_and_head(model.eval())
    batch = pad_prompt_response(PROMPTS, [[] for _ in PROMPTS], tokenizer.pad_token_id)
    with torch.no_grad(), folded_adapters(model, quantised=True):
        fixed = graph_decode.FixedStep(decoder, head, config, batch, max_new_tokens=3, bucket_columns=4)
        fixed.prefill_columns()
        sampler = graph_decode.InGraphSampler(fixed, graph_decode.GraphSampling(True), [NEVER], chunk=3)
        sampler.begin()
        for _ in range(2):
            sampler.step(fixed.width())
            fixed.filled += 1
        assert int(sampler.slot) == 2 and int(fixed.column) == fixed.capacity - 2  # the last step's
        width = fixed.width()
        before = [tensor.clone() for tensor in sampler.state()]
        step = graph_decode.ReplayedStep(lambda: sampler.step(width), capture=False, state=sampler.state())
        step.warm_up()
        for tensor, copy in zip(sampler.state(), before):
            assert torch.equal(tensor, copy)
        step()  # the real step, at the same slot and column
        assert int(sampler.slot) == 3 and int(fixed.column) == fixed.capacity - 1
