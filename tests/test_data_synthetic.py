"""Synthetic memory tasks: deterministic, grounded in the chunks, and disjoint across splits."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memalpha.data.loaders import load_instances, save_jsonl
from memalpha.data.schema import Instance, parse_record
from memalpha.data.synthetic import DEFAULT_FAMILIES, generate_synthetic
from memalpha.data.wrapping import parse_wrapped_chunk

KNOBS = {"num_chunks": 5, "facts_per_chunk": 4, "distractors_per_chunk": 2, "questions_per_instance": 6}


def _texts(instance: Instance) -> str:
    parts = list(instance.chunks)
    for qa in instance.questions:
        parts.append(qa.question)
        parts.append(qa.answer)  # always one string in the synthetic families
    return "\n".join(parts)


def test_same_seed_gives_byte_identical_files_across_processes(tmp_path):
    save_jsonl(generate_synthetic(12, split="train", seed=5), tmp_path / "a.jsonl")
    save_jsonl(generate_synthetic(12, split="train", seed=5), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    # another interpreter with another hash seed writes the same bytes
    code = (
        "import sys; from memalpha.data.loaders import save_jsonl; "
        "from memalpha.data.synthetic import generate_synthetic;"
        "save_jsonl(generate_synthetic(12, split='train', seed=5), sys.argv[1])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.jsonl")], check=True, env=env)
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    save_jsonl(generate_synthetic(12, split="train", seed=6), tmp_path / "d.jsonl")
    assert (tmp_path / "d.jsonl").read_bytes() != (tmp_path / "a.jsonl").read_bytes()


def test_splits_never_share_an_entity():
    sets = {
        split: generate_synthetic(24, split=split, seed=1, **KNOBS)
        for split in ("train", "validation", "test")
    }
    entities = {
        split: set().union(*(set(i.metadata["entities"]) for i in insts)) for split, insts in sets.items()
    }
    for a in sets:
        for b, other in sets.items():
            if a == b:
                continue
            assert not entities[a] & entities[b]
            # and no entity of one split occurs anywhere in the other split's text
            pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, entities[a])) + r")\b", re.IGNORECASE)
            clash = pattern.search("\n".join(_texts(i) for i in other))
            assert clash is None, (a, b, clash and clash.group(0))


def test_val_alias_and_split_names():
    val = generate_synthetic(2, split="val")
    assert val == generate_synthetic(2, split="validation")
    assert val[0].instance_id == "synth_personal-validation-s0-00000"
    with pytest.raises(ValueError, match="unknown split 'holdout'"):
        generate_synthetic(1, split="holdout")


def test_families_cycle_and_instances_are_valid():
    instances = generate_synthetic(8, seed=2)
    assert [i.data_source for i in instances] == list(DEFAULT_FAMILIES) * 2
    assert len({i.instance_id for i in instances}) == 8
    for instance in instances:
        assert parse_record(instance.to_dict()) == instance
        assert len(instance.chunks) == 4 and len(instance.questions) == 4
        assert len(instance.metadata["evidence_chunks"]) == len(instance.questions)


def test_default_chunks_are_short():
    for instance in generate_synthetic(8):
        for chunk in instance.chunks:
            words = len(parse_wrapped_chunk(chunk).text.split())
            assert 100 <= words <= 175, (instance.instance_id, words)


def test_knobs_are_respected():
    instances = generate_synthetic(
        8, num_chunks=6, facts_per_chunk=2, distractors_per_chunk=0, questions_per_instance=3, chunk_words=60
    )
    for instance in instances:
        assert len(instance.chunks) == 6 and len(instance.questions) == 3
        assert all(len(parse_wrapped_chunk(c).text.split()) >= 60 for c in instance.chunks)
        assert not instance.metadata.get("distractor_people")
    few = generate_synthetic(4, num_chunks=1, facts_per_chunk=1, questions_per_instance=9, chunk_words=0)
    # at most one question per fact (icl makes new sentences)
    assert [len(i.questions) for i in few] == [1, 1, 9, 1]
    for bad in ({"num_chunks": 0}, {"chunk_words": -1}, {"families": ("synth_poetry",)}, {"families": ()}):
        with pytest.raises(ValueError):
            generate_synthetic(1, **bad)


def _sentences(chunk: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+", parse_wrapped_chunk(chunk).text)


def test_personal_and_timeline_answers_sit_in_the_evidence_chunk():
    instances = generate_synthetic(16, seed=3, families=("synth_personal", "synth_timeline"), **KNOBS)
    for instance in instances:
        for qa, evidence in zip(instance.questions, instance.metadata["evidence_chunks"]):
            assert qa.answer.lower() not in qa.question.lower()
            chunk = instance.chunks[evidence[0]]
            if instance.data_source == "synth_personal":
                person = re.search(
                    r"(?:did|is|has|does) ([A-Z]\w+ [A-Z]\w+)|([A-Z]\w+ [A-Z]\w+)'s", qa.question
                )
                name = person.group(1) or person.group(2)
                assert any(name in s and qa.answer in s for s in _sentences(chunk))
                others = [c for k, c in enumerate(instance.chunks) if k != evidence[0]]
                assert not any(name in s and qa.answer in s for c in others for s in _sentences(c))
            else:
                name, day = re.fullmatch(r"What did (.+) do on (\d{4}-\d\d-\d\d)\?", qa.question).groups()
                assert str(parse_wrapped_chunk(chunk).day) == day
                assert f"{name} {qa.answer}." in chunk


def test_icl_gold_is_a_bare_label_backed_by_examples():
    for instance in generate_synthetic(6, seed=4, families=("synth_icl",), **KNOBS):
        examples = "\n".join(parse_wrapped_chunk(c).text for c in instance.chunks)
        labels = set(re.findall(r"^Label: (\d+)$", examples, re.MULTILINE))
        n_labels = instance.metadata["num_labels"]
        assert labels == {str(k) for k in range(n_labels + 1)}  # the asked labels plus the distractor label
        for qa in instance.questions:
            assert qa.answer in {str(k) for k in range(n_labels)}
            assert qa.question.startswith("Sentence: ") and "\\boxed{}" in qa.question
            sentence = qa.question.split("\n")[0].removeprefix("Sentence: ")
            assert f"Sample: {sentence}\n" not in "\n".join(instance.chunks)  # a new sentence, not a copy


def test_summary_keywords_come_from_the_asked_range():
    for instance in generate_synthetic(6, seed=5, families=("synth_summary",), **KNOBS):
        days = [str(parse_wrapped_chunk(c).day) for c in instance.chunks]
        assert all(parse_wrapped_chunk(c).style == "reading" for c in instance.chunks)
        # the first asks for everything
        assert f"from {days[0]} to {days[-1]}" in instance.questions[0].question
        for qa, evidence in zip(instance.questions, instance.metadata["evidence_chunks"]):
            assert days[evidence[0]] in qa.question and days[evidence[-1]] in qa.question
            keywords = qa.answer.split(", ")
            assert keywords[:2] == [instance.metadata["protagonist"], instance.metadata["town"]]
            inside = "\n".join(instance.chunks[k] for k in evidence)
            outside = "\n".join(c for k, c in enumerate(instance.chunks) if k not in evidence)
            for keyword in keywords[2:]:
                assert keyword in inside and keyword not in outside


def test_synthetic_files_load_back(tmp_path):
    instances = generate_synthetic(4, split="validation", seed=9)
    save_jsonl(instances, tmp_path / "validation.jsonl")
    assert load_instances(tmp_path, split="validation")[0] == instances
    assert Path(tmp_path / "validation.jsonl").read_text(encoding="utf-8").count("\n") == 4


def test_stretch_chunks_cover_the_input_in_order():
    from memalpha.data.synthetic import stretch_chunks

    assert stretch_chunks(8, 4) == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    assert stretch_chunks(32, 3) == [range(10), range(10, 21), range(21, 32)]
    assert stretch_chunks(2, 4) == [range(1), range(1), range(1, 2), range(1, 2)]  # shorter than a chunk


@pytest.mark.parametrize("family", ["synth_personal", "synth_timeline"])
def test_spread_evidence_asks_about_every_stretch_first_chunks_included(family):
    for chunks in (2, 8, 32, 128):
        instances = generate_synthetic(
            6, split="validation", seed=3, num_chunks=chunks, facts_per_chunk=3, distractors_per_chunk=0,
            questions_per_instance=6, chunk_words=20, families=(family,), evidence="spread",
        )
        for instance in instances:
            evidence = [e[0] for e in instance.metadata["evidence_chunks"]]
            assert len(evidence) == 6
            # question i asks about the i-th of 6 equal stretches (one shorter than a chunk: its chunk)
            for i, chunk in enumerate(evidence):
                assert i * chunks // 6 <= chunk < max(i * chunks // 6 + 1, (i + 1) * chunks // 6)
            assert evidence[0] < max(1, chunks // 6)  # the first stretch: the first chunks are asked about


def test_random_evidence_is_unchanged_by_the_new_setting():
    # the default placement draws exactly as before: the demo and every study keep their instances
    a = generate_synthetic(8, split="validation", seed=0, **KNOBS)
    b = generate_synthetic(8, split="validation", seed=0, **KNOBS, evidence="random")
    assert [i.to_dict() for i in a] == [i.to_dict() for i in b]
    # what the generator drew before the setting existed (printed by the commit before it)
    assert [i.metadata["evidence_chunks"] for i in a][:2] == [[[3], [0], [4], [1], [2], [0]],
                                                             [[2], [4], [0], [0], [3], [1]]]
    assert [q.answer for q in a[0].questions] == ["Tallinn", "Rascal", "Marmalade", "Quarry Hill",
                                                  "salsa dancing", "Heron Drive"]


def test_question_facts_name_the_fact_each_question_asks_for():
    from memalpha.agent.fact_recall import instance_facts

    families = ("synth_personal", "synth_timeline")
    for instance in generate_synthetic(8, split="validation", seed=2, families=families, **KNOBS):
        facts = instance.metadata["question_facts"]
        assert len(facts) == len(instance.questions)
        for fact, qa, (chunk,) in zip(facts, instance.questions, instance.metadata["evidence_chunks"]):
            assert fact in instance_facts(instance.metadata)
            assert qa.answer in fact and qa.answer in instance.chunks[chunk]


def test_an_unknown_evidence_placement_is_one_line():
    from memalpha.data.synthetic import SyntheticSettings

    with pytest.raises(ValueError, match=r"data.synthetic.evidence must be one of \['random', 'spread'\]"):
        SyntheticSettings(evidence="everywhere")


REAL_SHAPES = ("synth_conversation", "synth_document")


def test_the_real_shapes_never_share_an_entity_between_splits():
    sets = {split: generate_synthetic(12, split=split, seed=1, families=REAL_SHAPES, **KNOBS)
            for split in ("train", "validation", "test")}
    entities = {split: set().union(*(set(i.metadata["entities"]) for i in insts))
                for split, insts in sets.items()}
    for a in sets:
        for b, other in sets.items():
            if a != b:
                pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, entities[a])) + r")\b")
                clash = pattern.search("\n".join(_texts(i) for i in other))
                assert clash is None, (a, b, clash and clash.group(0))


def test_a_conversation_is_dated_sessions_of_speakers_with_a_fact_changed_later():
    instances = generate_synthetic(8, split="validation", seed=4, families=("synth_conversation",), **KNOBS)
    for instance in instances:
        speakers = instance.metadata["people"]
        for number, chunk in enumerate(instance.chunks, start=1):
            header, *turns = chunk.splitlines()
            when = r"\d+:\d\d [ap]m on \d+ \w+, 2\d{3}"
            assert re.fullmatch(rf"\[Chat between .+, session {number}, {when}\]", header)
            # every line a speaker's, the last one included
            assert turns and all(line.split(": ", 1)[0] in speakers for line in turns)
            assert len(chunk.split()) >= 60  # topped up to chunk_words by small talk
        # every answer is told by its owner in the evidence session, in the first person
        for qa, (chunk,) in zip(instance.questions, instance.metadata["evidence_chunks"]):
            assert any(line.startswith(tuple(speakers)) and qa.answer in line
                       for line in instance.chunks[chunk].splitlines())
            if qa.question.startswith("What did "):  # a day's event: one by that speaker that session
                person = qa.question.split()[2]
                events = [line for line in instance.chunks[chunk].splitlines()
                          if line.startswith(f"{person}: ") and "today" in line.lower()]
                assert len(events) == 1, (qa.question, events)
        changed = instance.metadata["changed_fact"]
        old_session = next(k for k, c in enumerate(instance.chunks) if changed["was"] in c)
        assert old_session < changed["chunk"] and "Change of plan" in instance.chunks[changed["chunk"]]
        assert changed["now"] in instance.chunks[changed["chunk"]]
        # the question about it asks what holds now, and its evidence is the later session
        asked = [(qa, e) for qa, e in zip(instance.questions, instance.metadata["evidence_chunks"])
                 if qa.question == changed["question"]]
        assert asked == [(asked[0][0], [changed["chunk"]])] and asked[0][0].answer == changed["now"]


def test_a_document_states_the_names_numbers_and_dates_its_questions_ask():
    instances = generate_synthetic(8, split="train", seed=5, families=("synth_document",), **KNOBS)
    kinds = set()
    for instance in instances:
        for qa, fact, (chunk,) in zip(instance.questions, instance.metadata["question_facts"],
                                      instance.metadata["evidence_chunks"]):
            assert fact in instance.chunks[chunk] and qa.answer in fact
            assert sum(fact in c for c in instance.chunks) == 1
            kinds.add("number" if qa.answer.isdigit() else "date" if qa.answer[-4:].isdigit() else "name")
    assert kinds == {"number", "date", "name"}


@pytest.mark.parametrize("family", REAL_SHAPES)
def test_the_real_shapes_give_oracle_demonstrations_that_store_every_note(family, tokenizer):
    from memalpha.agent.oracle_demos import oracle_demonstrations
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.synthetic import SyntheticSettings
    from memalpha.tools.formats import get_call_format

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "tiny_cpu.yaml").read_text())
    # a chat session tells facts and events (two lists, two calls): over 112 tokens, within 160
    settings = RolloutSettings(**config["model"]["rollout"])
    assert settings.max_new_tokens == 160  # the recipe sizes its replies for these chunks
    synthetic = {**config["data"]["synthetic"], "families": [family]}
    instances = SyntheticSettings(**synthetic).generate("train", 0, 4)
    demos = oracle_demonstrations(instances, tokenizer, settings, seed=0)
    assert len(demos) == sum(len(i.chunks) for i in instances)
    call_format = get_call_format(settings.call_format)
    by_id = {i.instance_id: i for i in instances}
    for demo in demos:
        notes = by_id[demo.metadata["instance_id"]].metadata["notes"][demo.metadata["chunk_index"]]
        stored = " ".join(call.arguments["content"] for call in call_format.parse(demo.response).calls)
        assert all(note["fact"].rstrip(".") in stored for note in notes)


def test_a_long_chunk_of_examples_is_stored_as_its_leading_examples_within_the_reply(tokenizer):
    from memalpha.agent.oracle_demos import DEFAULT_REPLY_SHARE, oracle_demonstrations
    from memalpha.agent.rollout import make_token_counter
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.synthetic import SyntheticSettings
    from memalpha.tools.formats import get_call_format

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "documents_cpu.yaml").read_text())
    settings = RolloutSettings(**config["model"]["rollout"])
    synthetic = {**config["data"]["synthetic"], "families": ["synth_icl", "synth_document"]}
    instances = SyntheticSettings(**synthetic).generate("train", 0, 2)
    demos = oracle_demonstrations(instances, tokenizer, settings, seed=0)
    call_format = get_call_format(settings.call_format)
    count_tokens = make_token_counter(tokenizer)
    by_id = {i.instance_id: i for i in instances}
    kept: dict[str, list[tuple[int, int]]] = {}
    for demo in demos:
        notes = by_id[demo.metadata["instance_id"]].metadata["notes"][demo.metadata["chunk_index"]]
        stored = " ".join(call.arguments["content"] for call in call_format.parse(demo.response).calls)
        assert count_tokens(demo.response) + 1 <= DEFAULT_REPLY_SHARE * settings.max_new_tokens
        held = [note["fact"] in stored for note in notes]
        kept.setdefault(demo.metadata["data_source"], []).append((sum(held), len(held)))
        # what is stored is a prefix of the chunk's notes: no note is held after one left out
        assert held == sorted(held, reverse=True)
        if demo.metadata["data_source"] == "synth_document":
            assert all(held)  # a report's facts are facts a question asks for: all of them, always
    # every chunk of examples (about 70 of them) keeps some (about 18) and leaves the others out
    assert all(0 < n < total for n, total in kept["synth_icl"])
