"""The reader: prompt budgeting, the local backend (tiny model, PEFT base weights, embedded
model) and the OpenAI-compatible backend against the real loopback server."""

from __future__ import annotations

import re

import pytest

from memalpha.agent.answer_metrics import score_answer
from memalpha.memory.store import EPISODIC, SEMANTIC, Memory
from memalpha.reader.answer_prompts import answer_messages, render_answer
from memalpha.reader.base import ReaderAnswer, ReaderSampling
from memalpha.reader.local import LocalReader
from memalpha.reader.openai_compat import OpenAIReader
from memalpha.reader.options import OpenAISettings, RetrievalSettings
from memalpha.reader.retrieval import retrieve_for_questions


def load_model(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def embedded_model(embedded_model_dir):
    return load_model(embedded_model_dir)


def fact_memory(n: int = 10) -> Memory:
    memory = Memory()
    memory.core = "The user is a teacher from Oslo."
    for i in range(n):
        memory.insert(SEMANTIC, f"Fact {i}: the locker number {i} belongs to student number {100 + i}.")
        memory.insert(EPISODIC, f"At 2024-03-{i + 1:02d} 10:00, student number {100 + i} opened locker {i}.")
    return memory


def capital_memory() -> Memory:
    memory = Memory()
    memory.core = "The user is studying geography."
    memory.insert(SEMANTIC, "Canberra is the capital city of Australia.")
    memory.insert(SEMANTIC, "The Nile is the longest river in Africa.")
    memory.insert(EPISODIC, "At 2024-05-02 09:00, the user read a book about Australia.")
    return memory


def numbered_lines(conversation) -> int:
    return len(re.findall(r"^\d+\. ", conversation[0]["content"], flags=re.MULTILINE))


def test_local_reader_batches_and_respects_the_prompt_budget(tiny_model, tokenizer):
    memory = fact_memory(10)
    question = "Who opened locker number 3?"
    reader = LocalReader(tiny_model, tokenizer, max_new_tokens=4, batch_size=2,
                         retrieval=RetrievalSettings(top_k_entries=10))
    base = reader.conversation_tokens(answer_messages(render_answer(memory, [], []), question))
    reader.prompt_budget_tokens = base + 150
    conversation = reader.answer_conversations([(memory, question)])[0]
    assert reader.conversation_tokens(conversation) <= reader.prompt_budget_tokens
    k = numbered_lines(conversation) // 2
    assert 0 < k < 10
    semantic, episodic = retrieve_for_questions(memory, [question], top_k=10)[0]
    bigger = answer_messages(render_answer(memory, semantic[: k + 1], episodic[: k + 1]), question)
    assert reader.conversation_tokens(bigger) > reader.prompt_budget_tokens
    assert "the locker number 3 belongs" in conversation[0]["content"]  # the best match is kept
    assert conversation[1] == {"role": "user", "content": question}

    # five items from two memories, batch size 2: one reply per item, in order
    other = capital_memory()
    items = [(memory, question), (other, "Capital of Australia?"), (memory, "Locker 7?"),
             (other, "Longest river?"), (memory, "Who is the user?")]
    answers = reader.answer(items)
    assert len(answers) == 5 and all(isinstance(a, ReaderAnswer) and a.ok for a in answers)
    # greedy decoding is deterministic and independent of batching
    single = LocalReader(
        tiny_model,
        tokenizer,
        max_new_tokens=4,
        batch_size=1,
        retrieval=RetrievalSettings(top_k_entries=10, prompt_tokens=reader.prompt_budget_tokens),
    )
    assert [a.text for a in single.answer(items)] == [a.text for a in answers]

    # core + question alone over budget: answered anyway, counted
    reader.prompt_budget_tokens = 5
    assert reader.answer([(memory, question)])[0].ok
    assert reader.over_budget == 1


def test_local_reader_complete_takes_per_call_sampling(tiny_model, tokenizer, monkeypatch):
    """A ``ReaderSampling`` given to ``complete`` reaches ``generate`` for that call only; every other
    call keeps the reader's own settings (greedy, 2 tokens here)."""
    from memalpha.lm.sampling import generation

    real = generation.generate
    seen = []

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((kwargs["max_new_tokens"], kwargs["do_sample"], kwargs["temperature"],
                     max(len(r) for r in out.response_ids)))
        return out

    monkeypatch.setattr(generation, "generate", recording)
    reader = LocalReader(tiny_model, tokenizer, max_new_tokens=2, temperature=0.0)
    prompts = ["Is the sky blue?", "Name a colour."]
    assert all(a.ok for a in reader.complete(prompts))
    assert all(a.ok for a in reader.complete(prompts, sampling=ReaderSampling(temperature=0.1, max_tokens=6)))
    assert all(a.ok for a in reader.complete(prompts, sampling=ReaderSampling(max_tokens=5)))
    assert all(a.ok for a in reader.complete(prompts, sampling=ReaderSampling()))  # overrides nothing
    assert all(a.ok for a in reader.answer([(capital_memory(), "What is the capital city of Australia?")]))
    settings = [(cap, sample, temperature) for cap, sample, temperature, _ in seen]
    assert settings == [(2, False, 1.0), (6, True, 0.1), (5, False, 1.0), (2, False, 1.0), (2, False, 1.0)]
    assert all(longest <= cap for cap, _, _, longest in seen)
    assert reader.max_new_tokens == 2 and reader.temperature == 0.0  # the reader's settings are untouched


def test_openai_reader_complete_sends_per_call_sampling(tiny_model, tokenizer):
    """The request body carries the override's temperature and ``max_tokens`` for that call only,
    and the loopback server generates with them."""
    from memalpha_lab.reader_server import ChatCompletionServer

    client = OpenAIReader(OpenAISettings("http://127.0.0.1:1/v1", "tiny"), temperature=0.0, max_tokens=3,
                          extra_body={"seed": 1})
    question = [{"role": "user", "content": "q"}]
    body = client.request_body(question, ReaderSampling(temperature=0.1, max_tokens=512))
    assert (body["temperature"], body["max_tokens"], body["top_p"], body["seed"]) == (0.1, 512, 1.0, 1)
    body = client.request_body([{"role": "user", "content": "q"}], ReaderSampling(max_tokens=9))
    assert (body["temperature"], body["max_tokens"]) == (0.0, 9)
    assert client.request_body([{"role": "user", "content": "q"}]) == client.request_body(
        [{"role": "user", "content": "q"}], ReaderSampling())

    with ChatCompletionServer(
        LocalReader(tiny_model, tokenizer, max_new_tokens=4), model_name="tiny"
    ) as server:
        received = []
        submit = server.submit
        server.submit = lambda messages, params: received.append(params) or submit(messages, params)
        client = OpenAIReader(OpenAISettings(server.base_url, "tiny", max_retries=0, max_concurrency=2),
                              temperature=0.0, max_tokens=3)
        prompts = ["Is the sky blue?", "Name a colour."]
        assert all(a.ok for a in client.complete(prompts))
        brief = ReaderSampling(temperature=0.1, max_tokens=7)
        assert all(a.ok for a in client.complete(prompts, sampling=brief))
        shorter = ReaderSampling(max_tokens=5)
        assert all(a.ok for a in client.complete(prompts[:1], systems=["Be brief."], sampling=shorter))
        assert all(a.ok for a in client.complete(prompts[:1]))
    assert [(p.max_tokens, p.temperature) for p in received] == [(3, 0.0)] * 2 + [(7, 0.1)] * 2 + [
        (5, 0.0),
        (3, 0.0),
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [({"temperature": -1.0}, "sampling temperature must be >= 0 (0 = greedy), got -1.0"),
     ({"max_tokens": 0}, "sampling max_tokens must be >= 1, got 0")],
)
def test_sampling_overrides_are_checked(options, message):
    with pytest.raises(ValueError) as info:
        ReaderSampling(**options)
    assert str(info.value) == message


def test_local_reader_answers_with_peft_base_weights(tiny_model_dir, tokenizer):
    import torch
    from peft import LoraConfig, get_peft_model

    base = load_model(tiny_model_dir)
    items = [(capital_memory(), "What is the capital of Australia?"), (fact_memory(3), "Locker 1?")]
    expected = [a.text for a in LocalReader(base, tokenizer, max_new_tokens=8).answer(items)]
    torch.manual_seed(0)
    peft_model = get_peft_model(
        load_model(tiny_model_dir),
        LoraConfig(
            r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
        ),
    )
    peft_model.train()
    # the model inside the PEFT wrapper holds the LoRA layers switched on
    with_adapters = LocalReader(peft_model.get_base_model(), tokenizer, max_new_tokens=8).answer(items)
    without = LocalReader(peft_model, tokenizer, max_new_tokens=8).answer(items)
    assert [a.text for a in without] == expected  # the frozen base answered
    assert [a.text for a in with_adapters] != expected  # (the adapters do change the model)
    assert peft_model.training  # the caller's mode is restored


@pytest.mark.embedded
def test_embedded_local_reader_answers_from_memory(embedded_model, tokenizer):
    reader = LocalReader(embedded_model, tokenizer, max_new_tokens=32, batch_size=2)
    questions = ["What is the capital city of Australia?", "Which is the longest river in Africa?"]
    golds = ["Canberra", "Nile"]
    memory = capital_memory()
    answers = reader.answer([(memory, q) for q in questions])
    assert all(a.ok and a.text.strip() for a in answers)
    scores = [score_answer("squad", a.text, g, q) for a, g, q in zip(answers, golds, questions)]
    print(f"\nembedded reader answers: {[a.text for a in answers]}; substring scores {scores}")


@pytest.fixture(scope="module")
def server(embedded_model, tokenizer):
    from memalpha_lab.reader_server import ChatCompletionServer

    reader = LocalReader(embedded_model, tokenizer, max_new_tokens=16, batch_size=4)
    with ChatCompletionServer(reader, model_name="smollm2", port=0, max_batch=4) as srv:
        yield srv


@pytest.mark.embedded
def test_openai_reader_round_trip_through_loopback_server(server, monkeypatch):
    monkeypatch.setenv("MEMALPHA_TEST_KEY", "secret")
    assert server.base_url.startswith("http://127.0.0.1:")
    client = OpenAIReader(
        OpenAISettings(server.base_url, "smollm2", "MEMALPHA_TEST_KEY", max_concurrency=4, max_retries=0),
        temperature=0.0, max_tokens=16,
    )
    memory = capital_memory()
    questions = ["What is the capital city of Australia?", "Which is the longest river in Africa?",
                 "What did the user read?", "Who is the user?"]
    answers = client.answer([(memory, q) for q in questions])
    assert len(answers) == 4 and all(a.ok and a.text.strip() for a in answers)
    assert client.failures == 0
    # the server used the same template and greedy decoding as the local reader
    local = LocalReader(server.reader.model, server.reader.tokenizer, max_new_tokens=16)
    assert answers[0].text == local.answer([(memory, questions[0])])[0].text
    judged = client.complete(["Is Canberra the capital of Australia? Answer yes or no."])
    assert judged[0].ok and judged[0].text


@pytest.mark.parametrize("backend", ["auto", "cpu-fused", "hf-generate"])
def test_the_local_reader_samples_through_the_policys_backends_with_the_adapters_off(
    peaked_policy, backend, caplog, monkeypatch
):
    """The reader takes the policy's decoding loop (issue 38, item 1): every backend answers as the
    base model does (float64, a drawn adapter that changes the answers), and the choice is logged
    as the reader's."""
    import logging

    from memalpha.lm.sampling import backend as backends

    model, tokenizer = peaked_policy
    prompts = ["Where does Anna live?", "What is the capital of Norway? Answer in one word.", "Locker 1?"]
    kwargs = {"max_new_tokens": 6, "batch_size": 2}
    base = LocalReader(model, tokenizer, backend="hf-generate", **kwargs)
    expected = [a.text for a in base.complete(prompts)]
    # the model inside the PEFT wrapper holds the LoRA layers switched on
    adapted = LocalReader(model.get_base_model(), tokenizer, backend="hf-generate", **kwargs)
    assert [a.text for a in adapted.complete(prompts)] != expected  # (the adapter does change the answers)

    reader = LocalReader(model, tokenizer, backend=backend, **kwargs)
    monkeypatch.setattr(backends, "_said", set())  # each choice is said once per process
    with caplog.at_level(logging.INFO, logger="memalpha.lm.sampling.backend"):
        answers = reader.complete(prompts)
    assert [a.text for a in answers] == expected and all(a.ok for a in answers)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reader backend: ")]
    name = "cpu-fused" if backend == "auto" else backend
    assert len(said) == 1 and said[0].startswith(f"reader backend: {name} -- "), said
