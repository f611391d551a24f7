"""The trained agent in use, without a model: a scripted sampler writes each turn's calls, and the
real prompts, parser, tools, reader and memory files do the rest (memalpha/agent/reading.py,
memalpha/inference/memory_agent.py)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from memalpha.agent.prompt_budget import chunk_room
from memalpha.agent.reading import read_instances
from memalpha.agent.rollout import RolloutError
from memalpha.data.plain_text import text_chunks
from memalpha.data.schema import QA, DataValidationError, Instance
from memalpha.inference.memory_agent import MemoryAgent
from memalpha.inference.memory_file import MemoryFileError, save_memory
from memalpha.lm.sampling.generation import Generation
from memalpha.memory.store import EPISODIC
from memalpha.tools.formats import get_call_format
from memalpha.tools.schemas import INSERT
from memalpha.train.settings_loader import AgentLoadError, agent_settings

CHUNK = re.compile(r"<new_chunk>\n(.*)\n</new_chunk>", re.DOTALL)
ROLLOUT = {"call_format": "hermes", "prompt_profile": "compact", "max_prompt_tokens": 1536,
           "core_token_limit": 128, "max_new_tokens": 256}


class CopyChunk:
    """A generate function that answers every memorising prompt with one call: insert the chunk it
    shows into the episodic list (and counts the prompts it saw)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prompts = 0

    def __call__(self, prompts, **_sampling) -> Generation:
        replies = []
        for prompt in prompts:
            chunk = CHUNK.findall(self.tokenizer.decode(prompt))[-1]
            call = (INSERT, {"memory_type": EPISODIC, "content": chunk})
            text = get_call_format("hermes").render_calls([call])
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            replies.append(ids + [self.tokenizer.eos_token_id])
        self.prompts += len(prompts)
        return Generation([list(p) for p in prompts], replies, [False] * len(prompts))


@pytest.fixture
def agent(tokenizer):
    settings = agent_settings({"rollout": ROLLOUT, "reader": {"kind": "extractive"}})
    return MemoryAgent.assembled(settings, None, tokenizer, sampler=CopyChunk(tokenizer))


def test_read_instances_memorises_answers_and_leaves_the_given_memory_alone(agent, tokenizer):
    start = agent.new_memory()
    start.insert("semantic", "kept from before")
    asked = Instance("a", "synth_personal", ["Ada lives in Lisbon.", "Ada's cat is Pixel."],
                     [QA("Where does Ada live?", "Lisbon"), QA("Who is Zed?", "a dog")])
    plain = Instance("b", "text", ["Bo sings."], [])
    readings = read_instances(agent.agent, [asked, plain], seed=0, memories=[start, None])
    first, second = readings
    assert [e.content for e in first.memory.episodic] == ["Ada lives in Lisbon.", "Ada's cat is Pixel."]
    assert [e.content for e in first.memory.semantic] == ["kept from before"]
    assert [e.content for e in start.episodic] == [] and len(start.semantic) == 1  # the caller's copy
    call = first.turns[1]["results"][0]
    assert call["tool"] == INSERT and call["status"] == "ok"
    assert call["arguments"] == {"memory_type": EPISODIC, "content": "Ada's cat is Pixel."}
    assert [q["score"] for q in first.questions] == [1.0, 0.0] and first.accuracy == 0.5
    assert second.questions == [] and second.accuracy is None
    record = second.record()
    assert record["memory"]["episodic"][0]["content"] == "Bo sings." and record["chunks"] == 1
    with pytest.raises(ValueError, match="give a reader"):
        read_instances(replace(agent.agent, reader=None), [asked], seed=0)


def test_remember_read_answer_and_a_memory_file(agent, tmp_path):
    turn = agent.remember("Ada moved to Lisbon in March.")
    assert turn.calls[0]["status"] == "ok" and not turn.truncated
    assert turn.memory.episodic[0].content == "Ada moved to Lisbon in March."
    text = "Grace teaches in Coimbra.\n\n\nHer brother Bo sings.\n"
    reading = agent.memorise(text, turn.memory, split="blank_lines")
    assert [e.content for e in reading.memory.episodic] == [
        "Ada moved to Lisbon in March.", "Grace teaches in Coimbra.", "Her brother Bo sings."
    ]
    assert [e.content for e in turn.memory.episodic] == ["Ada moved to Lisbon in March."]
    path = save_memory(reading.memory, tmp_path / "ada.json")
    loaded = agent.load_memory(path)
    assert loaded.to_dict() == reading.memory.to_dict()
    assert loaded.total_tokens() == reading.memory.total_tokens()  # the agent's tokenizer counts
    question = ["Where does Grace teach?"]
    answers = agent.answer(question, loaded, golds=["Coimbra"], data_source="synth_personal")
    assert answers[0]["score"] == 1.0 and "Coimbra" in answers[0]["prediction"]
    bare = agent.answer(["Where does Grace teach?"], loaded)
    assert "score" not in bare[0] and "Coimbra" in bare[0]["prediction"]


def test_read_cuts_a_long_text_into_chunks_that_fit_and_refuses_a_size_that_cannot(agent, tokenizer):
    text = " ".join(f"Fact {i}: item {i} is kept in box {i * 7}." for i in range(400))
    room = chunk_room(tokenizer, agent.settings.rollout)
    reading = agent.memorise(text)
    assert len(reading.turns) > 1 and agent.sampler.prompts == len(reading.turns)
    assert len(reading.turns) == len(text_chunks(text, tokenizer, room, "tokens", "text"))
    assert "".join(e.content for e in reading.memory.episodic).replace("\n", "") in text.replace("\n", "")
    prompts = agent.sampler.prompts
    refused = r"text: instance 'text', chunk 0 \(\d+ tokens\), cut at data.load.chunk_tok"
    with pytest.raises(RolloutError, match=refused):
        agent.memorise(text, chunk_tokens=100_000)
    assert agent.sampler.prompts == prompts  # refused before the agent read anything
    small = agent.memorise(text, chunk_tokens=200)
    assert len(small.turns) > len(reading.turns)


@pytest.mark.parametrize("text", ["", "  \n\n \t"])
def test_an_empty_text_or_chunk_is_one_line(agent, text):
    with pytest.raises(DataValidationError, match="^text: empty text: there is nothing to read$"):
        agent.memorise(text)
    with pytest.raises(DataValidationError, match="^chunk: empty text: there is nothing to read$"):
        agent.remember(text)


def test_a_chunk_over_the_prompt_budget_is_one_line_and_the_memory_is_kept(agent):
    memory = agent.new_memory()
    memory.insert("semantic", "precious")
    with pytest.raises(RolloutError) as error:
        agent.remember("word " * 3000, memory)
    assert "over rollout.max_prompt_tokens=1536" in str(error.value) and "\n" not in str(error.value)
    assert [e.content for e in memory.semantic] == ["precious"]


def test_a_memory_file_of_another_version_is_one_line(agent, tmp_path):
    path = tmp_path / "new.json"
    path.write_text(save_memory(agent.new_memory(), tmp_path / "m.json").read_text().replace(
        "memalpha.memory/1", "memalpha.memory/7"))
    with pytest.raises(MemoryFileError, match="newer memalpha .memory format version 7"):
        agent.load_memory(path)


def test_the_readers_a_served_agent_cannot_have_are_refused(agent):
    with pytest.raises(AgentLoadError, match="reader.kind: local needs the policy's weights here"):
        agent.with_reader({"kind": "local"})
    assert agent.with_reader({"kind": "extractive"}).sampler is agent.sampler
