"""memalpha's memory task as a TRL environment (memalpha/integrations/trl_environment.py): its tools are
memalpha's (same schema, same executor), its reward is memalpha's for the same memory and answers, a bad
instance or a reader fault stops with memalpha's one line, and TRL's real ``GRPOTrainer`` trains one
optimiser step with it, its tool calls reaching the memory.

A random tiny model makes no tool calls, so in the trainer test the tokens the policy samples are
scripted (the completion ids of ``GRPOTrainer._generate_single_turn``); TRL's own parsing, tool loop,
environment calls, rewards, loss and optimiser step run as they are.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from memalpha.agent.answer_metrics import score_answers
from memalpha.agent.reward_math import TurnCalls, rollout_rewards
from memalpha.agent.reward_settings import RewardSettings
from memalpha.data.schema import DataValidationError
from memalpha.data.synthetic import generate_synthetic
from memalpha.integrations.trl_environment import NO_MORE_CHUNKS, MemoryEnvironment, instance_rows
from memalpha.reader.base import ReaderAnswer
from memalpha.reader.extractive import ExtractiveReader
from memalpha.tools.schemas import TOOL_SCHEMAS
from memalpha.train.step_faults import ReaderFailureError


@pytest.fixture(scope="module")
def instance():
    return generate_synthetic(1, split="validation", num_chunks=2, facts_per_chunk=2, distractors_per_chunk=0,
                              questions_per_instance=2, chunk_words=40, families=("synth_personal",))[0]


def row(instance) -> dict:
    return instance_rows([instance], "Store what matters.")[0]


def test_the_tools_take_memalphas_arguments():
    from transformers.utils import get_json_schema

    for schema in TOOL_SCHEMAS:
        name, parameters = schema["function"]["name"], schema["function"]["parameters"]
        derived = get_json_schema(getattr(MemoryEnvironment, name))["function"]["parameters"]
        assert derived["required"] == parameters["required"], name
        assert {k: (v["type"], v.get("enum")) for k, v in derived["properties"].items()} == \
            {k: (v["type"], v.get("enum")) for k, v in parameters["properties"].items()}, name


def stored_fact(instance) -> str:
    """A fact of chunk 0 that answers a question (the synthetic personal family: pho, the favourite dish)."""
    return instance.metadata["notes"][0][1]["fact"]


def test_the_reward_is_memalphas_for_the_same_memory_and_answers(instance):
    reader, weights = ExtractiveReader(), RewardSettings()
    env = MemoryEnvironment(reader, reward=weights)
    first = env.reset(**row(instance))
    assert instance.chunks[0] in first and "Chunk 1 of 2" in first
    assert env.new_memory_insert("semantic_memory", stored_fact(instance)).startswith("ok: inserted")
    assert env.memory_update("core_memory", "The user keeps notes.").startswith("ok")
    assert env.memory_delete("semantic_memory", "zz99").startswith("error")
    assert instance.chunks[1] in env.read_next_chunk()
    assert env.read_next_chunk() == NO_MORE_CHUNKS
    assert [e.content for e in env.memory.semantic] == [stored_fact(instance)]

    answers = reader.answer([(env.memory, q.question) for q in instance.questions],
                            [instance.data_source] * len(instance.questions))
    golds = [q.answer for q in instance.questions]
    scores, _ = score_answers(instance.data_source, [a.text for a in answers], golds,
                              questions=[q.question for q in instance.questions])
    turns = [TurnCalls(results=list(env.turns[0].results), chunk=instance.chunks[0]),
             TurnCalls(chunk=instance.chunks[1])]
    chunk_tokens = sum(len(c.split()) for c in instance.chunks)
    expected = rollout_rewards(scores, turns, env.memory.total_tokens(), chunk_tokens, weights,
                               weights.build_content_judge(reader))
    assert env.get_reward() == pytest.approx(sum(expected.total) / 2)
    assert expected.r2[0] == pytest.approx(1 / 3)  # only the insert: the core text is no chunk text


def test_a_bad_instance_stops_with_memalphas_one_line(instance):
    env = MemoryEnvironment(ExtractiveReader())
    broken = instance.to_dict()
    broken["chunks"] = []
    with pytest.raises(DataValidationError) as error:
        env.reset(instance=json.dumps(broken))
    assert "field 'chunks'" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="'instance' column"):
        env.reset(prompt="no instance")
    with pytest.raises(DataValidationError, match="column .instance. is not a JSON record"):
        env.reset(instance="{not json")


class DownReader(ExtractiveReader):
    """A remote reader whose every answer failed in transport."""

    def answer(self, items, sources=None, top_k=None):
        self.failures += len(items)
        return [ReaderAnswer(text="", ok=False, error="ConnectError: refused") for _ in items]


def test_a_reader_fault_is_never_a_reward(instance):
    env = MemoryEnvironment(DownReader())
    env.reset(**row(instance))
    with pytest.raises(ReaderFailureError) as error:
        env.get_reward()
    message = str(error.value)
    assert "2 of 2 reader answers failed" in message and "ConnectError" in message and "\n" not in message


def test_trls_grpo_trainer_trains_a_step_whose_tool_calls_reach_the_memory(instance, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    facts = [note["fact"] for note in instance.metadata["notes"][0]]  # the answer is in the second

    def turn(content: str) -> str:
        insert = {"name": "new_memory_insert",
                  "arguments": {"memory_type": "semantic_memory", "content": content}}
        read_on = {"name": "read_next_chunk", "arguments": {}}
        blocks = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in (insert, read_on))
        return blocks + "<|im_end|>"

    calls = {"n": 0}

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The first turn of rollout i stores facts[i] and reads on; the next turn ends the rollout."""
        texts = [turn(facts[i]) for i in range(len(prompt_ids))] if calls["n"] == 0 else \
            ["Stored.<|im_end|>"] * len(prompt_ids)
        calls["n"] += 1
        return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2, num_generations=2,
                      max_steps=1, max_completion_length=256, learning_rate=1e-3, use_cpu=True, bf16=False,
                      report_to="none", save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0)
    trainer = GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([row(instance)] * 2),
                          environment_factory=functools.partial(MemoryEnvironment, ExtractiveReader()))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    environments = trainer._environment_pool[None]
    assert len(environments) == 2
    assert sorted(e.memory.semantic[0].content for e in environments) == sorted(facts)  # calls reached memory
    assert all(len(e.memory.semantic) == 1 and len(e.turns) == 2 for e in environments)  # and read on
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0
    rewards = []
    for fact in facts:
        expected = MemoryEnvironment(ExtractiveReader())
        expected.reset(**row(instance))
        expected.new_memory_insert("semantic_memory", fact)
        expected.read_next_chunk()
        rewards.append(expected.get_reward())
    assert rewards[1] > rewards[0]  # only the second fact answers a question: the advantages are not 0
    assert logged["rewards/MemoryEnvironment/mean"] == pytest.approx(sum(rewards) / 2)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # the step moved the model


def test_memorising_rows_carry_memalphas_own_prompt_of_chunk_0(instance, tokenizer):
    from memalpha.agent.rollout import turn_prompt
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.integrations.trl_environment import memorising_rows
    from memalpha.memory.store import Memory
    from memalpha.tools.formats import get_call_format

    settings = RolloutSettings(call_format="hermes", prompt_profile="compact")
    rows = memorising_rows([instance], settings)
    hermes = get_call_format("hermes")
    messages, _ = turn_prompt(tokenizer, Memory(), instance.chunks[0], hermes, settings, "chunk 0")
    assert rows[0]["prompt"] == messages
    env = MemoryEnvironment(ExtractiveReader(), first_chunk_in_prompt=True)
    assert env.reset(**rows[0]) is None and env.turns[0].chunk == instance.chunks[0]


def test_the_memorising_template_renders_memalphas_prompt_and_parses_its_calls(instance, tokenizer):
    import copy

    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.integrations.trl_environment import memorising_rows, use_memorising_template

    tok = copy.deepcopy(tokenizer)
    use_memorising_template(tok)
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    prompt = memorising_rows([instance], RolloutSettings(call_format="hermes"))[0]["prompt"]
    tools = [getattr(MemoryEnvironment, name) for name in ("new_memory_insert", "read_next_chunk")]
    rendered = tok.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "You may call one or more functions" not in rendered  # no schema block of TRL's
    assert prompt[0]["content"] in rendered
    call = '<tool_call>\n{"name": "new_memory_insert", "arguments": {"memory_type": "semantic_memory", ' \
           '"content": "Tom lives in Oslo."}}\n</tool_call><|im_end|>'
    parsed = tok.parse_response(tok(call, add_special_tokens=False)["input_ids"], prefix=[])
    assert parsed["tool_calls"][0]["function"] == {"name": "new_memory_insert", "arguments": {
        "memory_type": "semantic_memory", "content": "Tom lives in Oslo."}}
