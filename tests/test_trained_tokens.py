"""Trained tokens: GRPO trains a response only up to its first tool-result marker.

The cut (:meth:`memalpha.tools.formats.CallFormat.trained_length`) on hand-made responses
through the embedded tokenizer, for both call formats, and a rollout whose training samples
end before the marker while the memory still got the calls.
"""

from __future__ import annotations

import json

import pytest
import torch

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import QA, Instance
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import accumulate_grpo_gradients
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer, response_logprobs, token_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.reader.local import LocalReader
from memalpha.tools.formats import RESPONSE_OPEN, RESULT_MARK, get_call_format
from memalpha.tools.schemas import INSERT

QWEN, HERMES = get_call_format("qwen"), get_call_format("hermes")
FACT = {"memory_type": "semantic_memory", "content": "Anna lives in Oslo."}
QWEN_CALL = QWEN.render_call(INSERT, FACT)
HERMES_CALL = HERMES.render_call(INSERT, FACT)
MADE_UP = json.dumps({"status": "success"})


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# the byte-level alphabet's letters for the UTF-8 bytes C3 A9 and E2 9C BF
BYTE_LEVEL = {"é": "Ã©", "✿": "âľ¿"}


def byte_tokens(tokenizer, char: str) -> list[int]:
    """``char`` as one token per UTF-8 byte (a split no tokenizer would choose, but a policy may sample)."""
    ids = tokenizer.convert_tokens_to_ids(list(BYTE_LEVEL[char]))
    assert len(ids) == len(char.encode("utf-8")) and tokenizer.decode(ids) == char
    return ids


def check_cut(tokenizer, fmt, ids: list[int], trained_text: str) -> int:
    """The trained tokens decode to ``trained_text`` and end before the first token reaching the marker."""
    trained = fmt.trained_length(ids, tokenizer)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    start = fmt.result_start(text)
    assert tokenizer.decode(ids[:trained], skip_special_tokens=True) == trained_text
    assert text[start:].startswith(fmt.result_marker)
    assert text[:start].startswith(trained_text)  # nothing of the marker is trained
    # the next token reaches into the marker: its text is no longer a prefix of what comes before it
    assert not text[:start].startswith(tokenizer.decode(ids[: trained + 1], skip_special_tokens=True))
    return trained


@pytest.mark.parametrize(
    ("fmt", "before", "after"),
    [
        (QWEN, QWEN_CALL + "\n", f"{RESULT_MARK}: {MADE_UP}\n{QWEN_CALL}"),
        (HERMES, HERMES_CALL + "\n", f"{RESPONSE_OPEN}\n{MADE_UP}\n</tool_response>\n{HERMES_CALL}"),
    ],
    ids=["qwen", "hermes"],
)
def test_a_marker_mid_response_ends_the_trained_tokens_there(tokenizer, fmt, before, after):
    ids = ids_of(tokenizer, before + after) + [tokenizer.eos_token_id]
    trained = check_cut(tokenizer, fmt, ids, before)
    assert ids[:trained] == ids_of(tokenizer, before)  # the call block, its newline included
    assert tokenizer.eos_token_id not in ids[:trained]


MARKERS = [(QWEN, RESULT_MARK), (HERMES, RESPONSE_OPEN)]


@pytest.mark.parametrize(("fmt", "marker"), MARKERS, ids=["qwen", "hermes"])
def test_a_marker_at_the_start_leaves_nothing_to_train(tokenizer, fmt, marker):
    ids = ids_of(tokenizer, f"{marker}: {MADE_UP}") + [tokenizer.eos_token_id]
    assert check_cut(tokenizer, fmt, ids, "") == 0


@pytest.mark.parametrize(("fmt", "call"), [(QWEN, QWEN_CALL), (HERMES, HERMES_CALL)], ids=["qwen", "hermes"])
def test_without_a_marker_everything_is_trained_the_end_token_included(tokenizer, fmt, call):
    ids = ids_of(tokenizer, f"{call}\n{call}") + [tokenizer.eos_token_id]
    assert fmt.result_start(tokenizer.decode(ids, skip_special_tokens=True)) is None
    assert fmt.trained_length(ids, tokenizer) == len(ids)
    # the other format's marker is plain text here
    other = HERMES if fmt is QWEN else QWEN
    ids = ids_of(tokenizer, f"{call}\n{other.result_marker}: {MADE_UP}") + [tokenizer.eos_token_id]
    assert fmt.trained_length(ids, tokenizer) == len(ids)


def test_a_marker_split_over_tokens_and_merged_with_the_text_before_it(tokenizer):
    # the embedded tokenizer writes " ✿" as [" " + first byte of ✿, second byte, third byte]
    ids = ids_of(tokenizer, f"{QWEN_CALL} {RESULT_MARK}: {MADE_UP}")
    trained = check_cut(tokenizer, QWEN, ids, QWEN_CALL)  # the space went with the marker's first byte
    assert tokenizer.decode(ids[trained : trained + 3]) == " ✿"
    assert all("✿" not in tokenizer.decode([token]) for token in ids[trained : trained + 3])
    # "</tool_call><tool_response>" merges the closing ">" with the marker's "<"
    ids = ids_of(tokenizer, f"{HERMES_CALL}{RESPONSE_OPEN}{MADE_UP}")
    check_cut(tokenizer, HERMES, ids, HERMES_CALL[:-1])
    assert tokenizer.decode(ids[len(ids_of(tokenizer, HERMES_CALL)) - 1]) == "><"


def test_a_marker_sampled_byte_by_byte_after_a_split_character(tokenizer):
    """Ids no tokenizer would choose: "é" and "✿" each one token per byte."""
    head = ids_of(tokenizer, QWEN_CALL + "\nDone")
    tail = ids_of(tokenizer, "RESULT✿: x")
    ids = head + byte_tokens(tokenizer, "é") + byte_tokens(tokenizer, "✿") + tail
    trained = check_cut(tokenizer, QWEN, ids, QWEN_CALL + "\nDoneé")
    assert trained == len(head) + 2


class ByteFallbackDecoder:
    """Token ``i`` is byte ``i``; bytes that form no character decode to one "�" each, as
    SentencePiece's byte fallback writes them (the embedded tokenizer writes one per character)."""

    def decode(self, ids, skip_special_tokens=True):
        data, text = bytes(ids), ""
        while True:
            try:
                return text + data.decode("utf-8")
            except UnicodeDecodeError as error:
                stray = "\N{REPLACEMENT CHARACTER}" * (error.end - error.start)
                text += data[: error.start].decode("utf-8") + stray
                data = data[error.end :]


def test_incomplete_bytes_before_the_marker_are_not_mistaken_for_it():
    ids = list(f"ok✿{RESULT_MARK}: x".encode())
    # two bytes of the "✿" before the marker decode to "ok��", as long as "ok✿✿" would be
    assert QWEN.trained_length(ids, ByteFallbackDecoder()) == len("ok✿".encode())


def test_a_marker_inside_reasoning_ends_nothing(tokenizer):
    thinking = f"<think>I must not write {RESULT_MARK} myself.</think>\n"
    ids = ids_of(tokenizer, thinking + QWEN_CALL) + [tokenizer.eos_token_id]
    assert QWEN.trained_length(ids, tokenizer) == len(ids)
    ids = ids_of(tokenizer, f"{thinking}{QWEN_CALL}\n{RESULT_MARK}: {MADE_UP}")
    check_cut(tokenizer, QWEN, ids, f"{thinking}{QWEN_CALL}\n")


# ---------------------------------------------------------------------------------------
# a rollout: the calls reach the memory, the training samples end before the marker
# ---------------------------------------------------------------------------------------


def script_generation(monkeypatch, tokenizer, responses: list[str]) -> list[list[int]]:
    """Make the decoding loop answer prompt ``i`` of each batch with ``responses[i]`` and the end token.

    A tiny random model does not write tool calls, let alone made-up results, so the sampled
    tokens are scripted; everything around them (the prompts, the batched generation with its
    prefix cache, parsing, execution, samples, rewards, log-probs, the update) runs for real.
    """
    from memalpha.lm.sampling import generation

    script = [ids_of(tokenizer, text) + [tokenizer.eos_token_id] for text in responses]

    def scripted(model, batch, cache, eos_ids, pad_id, max_new_tokens, *sampling):
        assert max(len(s) for s in script) <= max_new_tokens
        assert tokenizer.eos_token_id in eos_ids
        rows = batch.input_ids.shape[0]
        return [list(script[i]) for i in range(rows)], [False] * rows

    monkeypatch.setattr(generation, "_hf_generate", scripted)  # under rollout.backend: hf-generate
    return script


@pytest.mark.parametrize(
    ("fmt", "call", "marker"), [(QWEN, QWEN_CALL, RESULT_MARK), (HERMES, HERMES_CALL, RESPONSE_OPEN)],
    ids=["qwen", "hermes"],
)
def test_a_rollout_trains_nothing_after_the_marker_and_still_executes_the_calls(
    tiny_model_dir, tokenizer, monkeypatch, fmt, call, marker
):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    policy, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    hallucinated = f"{call}\n{marker}: {MADE_UP}\n"
    responses = [f"{marker}: {MADE_UP}", hallucinated, call]  # nothing but a result / made-up result / clean
    script = script_generation(monkeypatch, tokenizer, responses)
    reader = LocalReader(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, max_new_tokens=2)
    instance = Instance("anna", "synth_personal", [FACT["content"]], [QA("Where does Anna live?", "Oslo")])
    settings = RolloutSettings(group_size=3, max_new_tokens=64, max_prompt_tokens=4096, call_format=fmt.name,
                               prompt_profile="compact", backend="hf-generate")

    out = Agent(policy, tokenizer, reader, settings, RewardSettings()).rollouts([instance], seed=0)

    cut = len(ids_of(tokenizer, f"{call}\n"))
    samples = sorted(out.samples, key=lambda s: s.rollout_id)
    assert [s.response_ids for s in samples] == [[], script[1][:cut], script[2]]
    trained_texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
    assert trained_texts == ["", f"{call}\n", call]
    records = sorted(out.records, key=lambda r: r.rollout_index)
    assert [r.turns[0]["response"] for r in records] == responses  # the records keep the whole response
    contents = [[e["content"] for e in r.memory["semantic"]] for r in records]
    assert contents == [[], [FACT["content"]], [FACT["content"]]]  # the calls before the marker ran
    assert [s.num_calls for s in samples] == [0, 1, 1]

    # cutting trains what masking would: the kept tokens' log-probs do not depend on the cut ones
    prompt = samples[1].prompt_ids
    logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=1, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        whole = token_logprobs(policy, [prompt], [script[1]], logprob_spec)[0, :cut]
        kept = token_logprobs(policy, [prompt], [samples[1].response_ids], logprob_spec)[0]
    gap = torch.linalg.vector_norm(whole.double() - kept.double())
    assert gap <= 1e-5 * torch.linalg.vector_norm(whole.double())

    # the update takes the samples one per micro-batch, the first with no token to train
    prompts, trained = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
    batch = GRPOBatch(prompts, trained, advantages=torch.tensor([0.5, -1.0, 1.0]),
                      ref_logps=response_logprobs(policy, prompts, trained, logprob_spec))
    for share_prefix in (False, True):
        policy.zero_grad()
        metrics, finite = accumulate_grpo_gradients(
            micro_batch_scorer(policy, LogprobSpec(
                temperature=1.0,
                micro_batch_size=UpdateSettings(micro_batch_size=1, kl_coef=0.001).micro_batch_size,
                pad_id=tokenizer.pad_token_id,
                share_prefix=share_prefix,
            )),
            batch,
            UpdateSettings(micro_batch_size=1, kl_coef=0.001),
            max_response_len=64,
            token_normaliser=float(batch.response_tokens),
            seq_normaliser=3.0,
            backward=lambda loss: loss.backward(),
        )
        assert finite and metrics["tokens"] == cut + len(script[2])
        grads = [p.grad for p in policy.parameters() if p.requires_grad]
        assert all(g is not None for g in grads) and sum(float(g.norm()) for g in grads) > 0
