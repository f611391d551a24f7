"""The official processing of raw MemoryAgentBench (``memalpha data convert --processing official``) on
hand-made inputs."""

from __future__ import annotations

import json

import pytest

from memalpha.commands.data import main
from memalpha.data.loaders import load_instances
from memalpha.data.official_processing import (
    drop_reason,
    load_keyword_golds,
    pack_sentences,
    process_instance,
    process_official,
    rewrite_labelled_chunk,
    split_sentences,
)
from memalpha.data.schema import QA, Instance
from memalpha.data.wrapping import parse_wrapped_chunk, wrap_chunks


def words(text: str) -> int:
    """A hand-countable tokenizer: one token a white-space word, and one for a lone space."""
    return len(text.split()) if text.strip() else 1


# Three labelled examples, as the benchmark's classification contexts hold them.
TTL_CONTEXT = (
    "where is my card\nlabel: 11\n\ntop up failed. please help\nlabel: 58\n\nwhy was I charged?\nlabel: 4"
)


def test_sentences_and_packing_on_a_hand_made_text():
    sentences = split_sentences(TTL_CONTEXT)
    assert sentences == [
        "where is my card\nlabel: 11\n\ntop up failed.",  # 9 words
        "please help\nlabel: 58\n\nwhy was I charged?",  # 8 words
        "label: 4",  # 2 words
    ]
    # 9 alone (9 + 8 > 10); then 8, and 8 + 2 = 10 still fits (the join's space is counted after)
    assert pack_sentences(sentences, words, 10) == [
        "where is my card\nlabel: 11\n\ntop up failed.",
        "please help\nlabel: 58\n\nwhy was I charged? label: 4",
    ]
    # the join's space counts: 4 + 3 + 1 = 8 after two sentences, and 8 + 2 > 9
    assert pack_sentences(["a b c d", "e f g", "h i"], words, 9) == ["a b c d e f g", "h i"]
    assert pack_sentences(["one two three four five"], words, 2) == ["one two three four five"]  # alone, over
    assert pack_sentences(["a<|endoftext|>b"], words, 5) == ["a\nb"]
    assert split_sentences('He said "stop." Then left!  Why?\nNo') == [
        'He said "stop."',
        "Then left!",
        "Why?",
        "No",
    ]


def test_ttl_rewrite_gives_the_exact_text_and_chunk_boundaries():
    instance = Instance("7", "icl_banking77_5900shot_balance", [TTL_CONTEXT[:30], TTL_CONTEXT[30:]],
                        [QA("my card is late", ["11"])], {"source": "icl_banking77_5900shot_balance"})
    processed = process_instance(instance, words, chunk_tokens=2048, ttl_chunk_tokens=10)
    expected = [
        # the second example was cut by the boundary: its unlabelled start is dropped
        "Sentence: where is my card\nLabel: 11",
        "Sentence: please help\nLabel: 58\n\nSentence: why was I charged?\nLabel: 4",
    ]
    assert processed.chunks == wrap_chunks(expected, "dialogue")
    assert [parse_wrapped_chunk(c).text for c in processed.chunks] == expected
    assert processed.questions == instance.questions
    assert processed.metadata["chunk_tokens"] == 10 and processed.metadata["processing"] == "official"


def test_labelled_pieces_that_the_rewrite_drops():
    chunk = "a label: 1 label: 2\n\n  \nlabel: 5\n\nno label here\n\nkept\nlabel:  9 \n\nlast label:"
    assert rewrite_labelled_chunk(chunk) == "Sentence: kept\nLabel: 9\n\nSentence: last\nLabel:"
    assert rewrite_labelled_chunk("nothing labelled") == ""
    assert rewrite_labelled_chunk("upper case\nLabel: 3") == ""  # the mark is the lower-case 'label:'


DROPPED = ["ruler_niah_mq_16k", "eventqa_full", "eventqa_65536", "eventqa_131072", "infbench_qa_eng_shots2",
           "recsys_redial_full", "longmemeval_s_-1_500", "factconsolidation_mh_6k"]
KEPT = ["ruler_qa1_197K", "ruler_qa2_421K", "longmemeval_s*", "icl_trec_coarse_6600shot_balance"]


def test_dropped_sources_are_dropped():
    assert all(drop_reason(s) for s in DROPPED) and not any(drop_reason(s) for s in KEPT)
    instances = [
        Instance(str(n), source, ["Fact one. Fact two\nlabel: 1"], [QA("q?", "a")])
        for n, source in enumerate(DROPPED + KEPT)
    ]
    kept, dropped = process_official(instances, words, chunk_tokens=2048)
    assert [i.data_source for i in kept] == KEPT
    assert [(i, s) for i, s, _ in dropped] == [(str(n), s) for n, s in enumerate(DROPPED)]
    lme = kept[KEPT.index("longmemeval_s*")]
    assert lme.chunks == ["Fact one. Fact two\nlabel: 1"]  # its loader chunks stay, unwrapped
    ruler = kept[0]
    assert [parse_wrapped_chunk(c).text for c in ruler.chunks] == ["Fact one. Fact two\nlabel: 1"]


def summary_instance(instance_id: str = "3") -> Instance:
    return Instance(instance_id, "infbench_sum_eng_shots2", ["Ann left home. ", "She came back."],
                    [QA("Summarize the book.", "a long reference summary")])


def test_summary_source_without_keyword_golds_is_a_one_line_error():
    with pytest.raises(ValueError) as info:
        process_instance(summary_instance(), words, chunk_tokens=3)
    message = str(info.value)
    assert "infbench_sum_eng_shots2" in message and "--keyword-golds" in message and "\n" not in message
    with pytest.raises(ValueError, match="no entry for instance '3'"):
        process_instance(summary_instance(), words, chunk_tokens=3, keyword_golds={"9": ["x"]})


def test_keyword_golds_replace_the_summary_question_and_gold():
    by_id = process_instance(summary_instance(), words, chunk_tokens=3, keyword_golds={"3": ["Ann", "home"]})
    assert [parse_wrapped_chunk(c).text for c in by_id.chunks] == ["Ann left home.", "She came back."]
    assert all(parse_wrapped_chunk(c).style == "reading" for c in by_id.chunks)
    assert by_id.questions == [
        QA("Summarise the book I read between 2024-01-01 and 2024-01-02.", ["Ann", "home"])
    ]
    by_source = process_instance(
        summary_instance(),
        words,
        chunk_tokens=3,
        keyword_golds={"infbench_sum_eng_shots2": ["back"], "4": ["no"]},
    )
    assert by_source.questions[0].answer == ["back"]


def test_keyword_gold_files(tmp_path):
    official_shape = tmp_path / "golds.json"
    official_shape.write_text(json.dumps({"0": {"keywords": ["lamp", " storm "]}, "1": "a, b ,c"}))
    assert load_keyword_golds(official_shape) == {"0": ["lamp", "storm"], "1": ["a", "b", "c"]}
    lines = tmp_path / "golds.jsonl"
    lines.write_text(
        '{"source": "infbench_sum_eng_shots2", "keywords": ["x"]}\n\n{"instance_id": 5, "keywords": "y"}\n'
    )
    assert load_keyword_golds(lines) == {"infbench_sum_eng_shots2": ["x"], "5": ["y"]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"0": []}))
    with pytest.raises(ValueError, match=r"--keyword-golds .*bad.json: entry '0' must be"):
        load_keyword_golds(bad)
    with pytest.raises(ValueError, match="no such file"):
        load_keyword_golds(tmp_path / "missing.json")


def raw_records() -> list[dict]:
    """Raw MemoryAgentBench records (one ``context`` each)."""
    examples = "\n\n".join(f"request number {i} is about topic {i % 3}\nlabel: {i % 3}" for i in range(60))
    return [
        {
            "context": examples,
            "questions": ["request number 99 is about topic 0"],
            "answers": [["0"]],
            "metadata": {"source": "icl_trec_coarse_6600shot_balance"},
        },
        {
            "context": "The keeper lit the lamp. " * 30,
            "questions": ["Summarise."],
            "answers": [["long summary"]],
            "metadata": {"source": "infbench_sum_eng_shots2"},
        },
        {
            "context": "Needle here. " * 5,
            "questions": ["Where?"],
            "answers": [["here"]],
            "metadata": {"source": "ruler_niah_mk_8k"},
        },
    ]


def test_convert_with_official_processing(tmp_path, embedded_model_dir, capsys):
    raw = tmp_path / "mab.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in raw_records()))
    out = tmp_path / "official.jsonl"
    args = ["convert", str(raw), str(out), "--tokenizer", str(embedded_model_dir), "--processing", "official"]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'infbench_sum_eng_shots2'" in err and "--keyword-golds FILE" in err
    assert not out.exists()

    golds = tmp_path / "golds.json"
    golds.write_text(json.dumps({"infbench_sum_eng_shots2": ["keeper", "lamp"]}))
    main([*args, "--keyword-golds", str(golds)])
    printed = capsys.readouterr().out
    assert "wrote 2 instances (official processing)" in printed
    assert "dropped 1 ruler_niah_mk_8k (a needle-in-a-haystack source)" in printed
    (ttl, summary), _ = load_instances(out)
    assert ttl.data_source == "icl_trec_coarse_6600shot_balance" and ttl.metadata["chunk_tokens"] == 1024
    texts = [parse_wrapped_chunk(c).text for c in ttl.chunks]
    # 60 examples of ~14 tokens: a few 1,024-token chunks, every kept example rewritten whole
    assert len(texts) >= 1 and all(t.startswith("Sentence: request number ") for t in texts)
    pairs = [pair for t in texts for pair in t.split("\n\n")]
    assert pairs == [
        f"Sentence: request number {i} is about topic {i % 3}\nLabel: {i % 3}" for i in range(60)
    ]
    assert summary.questions[0].answer == ["keeper", "lamp"]
    assert summary.questions[0].question.startswith("Summarise the book I read between 2024-01-01 and ")

    with pytest.raises(SystemExit):
        main([*args, "--keyword-golds", str(golds), "--wrap", "dialogue"])
    assert "--wrap does not combine" in capsys.readouterr().err
