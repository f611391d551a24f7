"""The ``locomo`` layout (memalpha/data/locomo.py) on a small hand-written file in LoCoMo's layout
(tests/fixtures/data/locomo_small.json: two short conversations, every category, a numeric answer,
evidence ids in each of the forms the public file writes): one instance per conversation, the
sessions split between turns over the budget and the load saying so, evidence ids as the chunks
that hold them, the adversarial protocol, and one line naming file, record and field for each bad
input. Token counts are white-space words here (no tokenizer), so the splits are hand-checkable."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import yaml
from test_training import scalars, version_dirs, write_config

from memalpha.cli import main
from memalpha.commands.data import main as data_main
from memalpha.data.loaders import load_instances, save_jsonl
from memalpha.data.locomo import NOT_MENTIONED
from memalpha.data.schema import DataValidationError, question_evidence

FIXTURE = Path(__file__).parent / "fixtures" / "data" / "locomo_small.json"
RECORDS = json.loads(FIXTURE.read_text(encoding="utf-8"))


def write(tmp_path, records, name="locomo.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def changed(edit) -> list[dict]:
    """A copy of the fixture's records with ``edit`` applied to the first conversation."""
    records = copy.deepcopy(RECORDS)
    edit(records[0])
    return records


def test_auto_reads_one_instance_per_conversation_with_its_sessions_in_order():
    instances, report = load_instances(FIXTURE)
    assert report.layout == "locomo" and report.notes == []
    assert [i.instance_id for i in instances] == ["fx-1", "fx-2"]
    first, second = instances
    assert first.data_source == "locomo" and len(first.chunks) == 2
    shared = "[shares a photo of two kittens on a blue blanket]"  # the turn's image caption
    assert first.chunks[0].splitlines() == [
        "[Chat between Ilse and Tomas, session 1, 9:15 am on 3 March, 2024]",
        "Ilse: Morning Tomas! I signed up for the pottery class at the community centre.",
        "Tomas: Nice! I started learning the cello, my teacher is Mr. Okafor.",
        f"Ilse: I adopted two cats yesterday, Miso and Tofu. {shared}",
    ]
    assert first.chunks[1].startswith("[Chat between Ilse and Tomas, session 2, 6:40 pm on 17 March, 2024]\n")
    # a date without its session (session_3_date_time) adds nothing; the summaries are not read
    assert len(second.chunks) == 2 and first.metadata["sessions"] == [1, 2]
    assert "session_summary" not in first.metadata and "event_summary" not in first.metadata


def test_questions_keep_their_category_and_numeric_answers_become_strings():
    first, second = load_instances(FIXTURE)[0]
    assert [q.metadata["category"] for q in first.questions] == [4, 2, 1, 3, 5, 4, 5]
    assert [q.metadata["category_name"] for q in first.questions[:5]] == [
        "single-hop", "temporal", "multi-hop", "open-domain", "adversarial",
    ]
    assert first.questions[5].answer == "2" and second.questions[0].answer == "2019"
    assert first.questions[0].question == "What instrument is Tomas learning?"  # asked as written


def test_an_adversarial_question_offers_not_mentioned_and_the_wrong_answer_in_alternating_order():
    first, second = load_instances(FIXTURE)[0]
    cat, city = first.questions[4], first.questions[6]
    assert cat.answer == city.answer == NOT_MENTIONED
    assert cat.question == (
        "What is the name of Mr. Okafor's cat? Choose one: (a) Not mentioned in the conversation (b) Miso."
    )
    assert cat.metadata["options"] == {"a": NOT_MENTIONED, "b": "Miso"}
    assert cat.metadata["adversarial_answer"] == "Miso"
    assert city.metadata["options"] == {"a": "Rotterdam", "b": NOT_MENTIONED}  # the second one of fx-1
    assert second.questions[3].metadata["options"]["a"] == NOT_MENTIONED  # each conversation starts over


def test_evidence_ids_become_the_chunks_that_hold_their_turns():
    first, second = load_instances(FIXTURE)[0]
    assert first.metadata["evidence_chunks"] == [[0], [0], [1], [0, 1], [0], [0], [1]]
    # "D2:2; D2:4" and "D1:2 D2:2" hold two ids each; "D01:02" is D1:2
    assert first.questions[2].metadata["evidence"] == ["D2:2", "D2:4"]
    assert second.questions[1].metadata["evidence"] == ["D1:2", "D2:2"]
    assert second.questions[0].metadata["evidence"] == ["D1:2"]
    # a question without evidence may draw on any chunk: answerable after the last
    assert second.metadata["evidence_chunks"][2] == [0, 1]
    assert question_evidence(first) == [0, 0, 1, 1, 0, 0, 1]


def test_a_session_over_the_budget_is_split_between_turns_and_the_load_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="memalpha.data"):
        instances, report = load_instances(FIXTURE, chunk_tokens=60)
    first = instances[0]
    # session 1 is 58 words with its line and stays whole; session 2 (13 + 68 words) becomes two
    # parts, each opened by a 15-word line: D2:1-D2:4 (12 + 11 + 8 + 14 words, 60 in all: just
    # fits) and D2:5-D2:6 (14 + 9)
    assert [len(c.split()) for c in first.chunks] == [58, 60, 38]
    for part in (1, 2):
        line = f"[Chat between Ilse and Tomas, session 2 (part {part}), 6:40 pm on 17 March, 2024]"
        assert first.chunks[part].splitlines()[0] == line
    assert first.chunks[1].splitlines()[-1] == (
        "Ilse: A green vase for the kitchen and a mug for my sister Hanna."
    )
    assert first.chunks[2].splitlines()[1].startswith("Tomas: I am moving to Rotterdam")
    assert first.metadata["split_sessions"] == [2] and first.metadata["chunk_tokens"] == 60
    # evidence follows its turn into its part: D2:2 and D2:4 in part 1, D2:5 in part 2
    assert first.metadata["evidence_chunks"] == [[0], [0], [1], [0, 1], [0], [0], [2]]
    message = (
        f"{FIXTURE}: 1 of 4 LoCoMo sessions are over data.load.chunk_tokens=60 white-space words "
        "and were split between turns into parts (sessions fx-1: 2)"
    )
    assert report.notes == [message]
    assert [r.getMessage() for r in caplog.records] == [message]


def test_data_inspect_shows_a_locomo_file(capsys):
    data_main(["inspect", str(FIXTURE), "--tokenizer", "none", "--chunk-tokens", "60"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{FIXTURE}: 2 instances (layout locomo; tokens: white-space words)"
    # chunks of 58, 60, 38 (fx-1, session 2 split) and 32, 35 words; 7 and 5 questions
    cells = ["locomo", "2", "2", "/", "2.5", "/", "3", "32", "/", "38", "/", "60", "5", "/", "6", "/", "7"]
    assert out[3].split() == cells


def test_converting_to_jsonl_keeps_the_question_metadata(tmp_path):
    instances, _ = load_instances(FIXTURE)
    save_jsonl(instances, tmp_path / "locomo.jsonl")
    again, report = load_instances(tmp_path / "locomo.jsonl")
    assert report.layout == "jsonl"
    assert [i.to_dict() for i in again] == [i.to_dict() for i in instances]
    assert again[0].questions[4].metadata["options"]["b"] == "Miso"


def test_an_evidence_id_that_names_no_turn_is_left_out_and_said_when_the_question_has_another(tmp_path):
    def edit(record):
        record["qa"][0]["evidence"] = ["D1:2", "D1:9", "D:1:3"]

    instances, report = load_instances(write(tmp_path, changed(edit)))
    assert instances[0].questions[0].metadata["evidence"] == ["D1:2"]
    assert report.notes == [
        (
            f"{tmp_path / 'locomo.json'}: 2 evidence ids name no turn and were left out (the question "
            "keeps its other ids): fx-1 qa[0].evidence[1]: 'D1:9' names no turn; "
            "fx-1 qa[0].evidence[2]: 'D:1:3' is not a dialogue id D<session>:<turn>"
        )
    ]


def _error(tmp_path, edit, **load) -> str:
    path = write(tmp_path, changed(edit))
    with pytest.raises(DataValidationError) as caught:
        load_instances(path, layout="auto", **load)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: record 0 (instance_id='fx-1'): field ")
    return message.split(": field ", 1)[1]


def test_each_bad_input_is_one_line_naming_the_file_record_and_field(tmp_path):
    def no_answer(record):
        del record["qa"][1]["answer"]

    def no_adversarial_answer(record):
        del record["qa"][4]["adversarial_answer"]

    def only_unknown_evidence(record):
        record["qa"][0]["evidence"] = ["D3:1"]

    def no_date(record):
        del record["conversation"]["session_2_date_time"]

    def bad_category(record):
        record["qa"][2]["category"] = 6

    def no_speaker(record):
        del record["conversation"]["session_1"][1]["speaker"]

    def bad_turn_id(record):
        record["conversation"]["session_1"][0]["dia_id"] = "1:1"

    def repeated_turn_id(record):
        record["conversation"]["session_2"][0]["dia_id"] = "D1:2"

    assert _error(tmp_path, no_answer) == "'qa[1].answer': missing field"
    assert _error(tmp_path, no_adversarial_answer) == "'qa[4].adversarial_answer': missing field"
    assert _error(tmp_path, only_unknown_evidence) == (
        "'qa[0].evidence[0]': 'D3:1' names no turn (and no other evidence id of the question does)"
    )
    assert _error(tmp_path, no_date) == "'conversation.session_2_date_time': missing field"
    assert _error(tmp_path, bad_category) == "'qa[2].category': expected one of [1, 2, 3, 4, 5], got 6"
    assert _error(tmp_path, no_speaker) == "'conversation.session_1[1].speaker': missing field"
    assert _error(tmp_path, bad_turn_id) == (
        "'conversation.session_1[0].dia_id': '1:1' is not a dialogue id D<session>:<turn>"
    )
    assert _error(tmp_path, repeated_turn_id) == "'conversation': two turns have the dialogue id D1:2"
    # a turn that alone is over the budget cannot be split: it names the turn and the setting (15
    # words of the part's line and 14 of the turn)
    assert _error(tmp_path, lambda record: None, chunk_tokens=20) == (
        "'conversation.session_1[0]': this turn is 29 white-space words with its session line, over "
        "data.load.chunk_tokens=20; a session is split between turns, never inside one: raise chunk_tokens"
    )


def test_a_conversation_without_its_id_is_named_by_its_index(tmp_path):
    path = write(tmp_path, changed(lambda record: record.pop("sample_id")))
    missing = r"record 0 \(no instance_id\): field 'sample_id': missing field"
    with pytest.raises(DataValidationError, match=missing):
        load_instances(path, layout="locomo")


@pytest.mark.slow
def test_validate_on_a_locomo_file_prints_the_table_per_category(tmp_path, tiny_model_dir, capsys, caplog):
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, val_path=str(FIXTURE))
    with caplog.at_level(logging.WARNING, logger="memalpha.data"):
        main(["validate", "--config", str(config), "--data.load.chunk_tokens", "120"])
    out = capsys.readouterr().out
    said = [r.getMessage() for r in caplog.records]
    assert any("were split between turns into parts (sessions fx-1: 2)" in message for message in said)
    assert "LoCoMo per category" in out and "adversarial (5)" in out and "all_but_adversarial" in out
    (report,) = (tmp_path / "run" / "tb").glob("version_*/validation.json")
    written = json.loads(report.read_text())
    categories = written["summary"]["per_source"]["locomo"]["per_category"]
    assert categories["all"]["questions"] == 12 and categories["adversarial"]["questions"] == 3
    questions = [q for r in written["records"] for q in r["questions"]]
    assert sorted(q["metadata"]["category"] for q in questions) == [1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5]
    assert all(0.0 <= q["locomo_f1"] <= 1.0 for q in questions)


@pytest.mark.slow
def test_a_fit_with_per_chunk_credit_asks_a_locomo_question_after_its_evidence(tmp_path, tiny_model_dir):
    data = str(FIXTURE)
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, train_path=data, val_path=data)
    raw = yaml.safe_load(config.read_text())
    raw["trainer"].update(limit_val_batches=0)
    raw["data"].update(shuffle=False)
    config.write_text(yaml.safe_dump(raw))
    main(["fit", "--config", str(config), "--model.update.credit", "per_chunk"])
    logged = scalars(version_dirs(tmp_path)[-1])
    # 2 rollouts of each conversation; a question is asked again after every turn from its last
    # evidence chunk on, but the last turn: fx-1 (2 chunks) asks its 4 questions of chunk 0 once more,
    # fx-2 (2 chunks) its 1 question of chunk 0: 2 x (4 + 1)
    assert list(logged["reader/turn_questions"].values()) == [10.0]


def test_without_a_chunk_size_the_sessions_are_split_to_what_fits_the_prompt_budget(tokenizer):
    from memalpha.agent.prompt_budget import chunk_room
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.train.datamodule import RolloutDataModule

    rollout = RolloutSettings(max_prompt_tokens=1240, core_token_limit=32)  # about 100 tokens of room
    room = chunk_room(tokenizer, rollout)
    module = RolloutDataModule(val_path=str(FIXTURE), tokenizer_name="smollm2-135m-instruct")
    module.rollout = rollout
    module._tokenizer = lambda: tokenizer
    assert module.chunk_tokens(tokenizer) == room
    module.setup("validate")
    first = module.val_instances[0]
    assert first.metadata["chunk_tokens"] == room and first.metadata["split_sessions"]  # some did not fit
    assert all(len(tokenizer(c, add_special_tokens=False)["input_ids"]) <= room for c in first.chunks)
    # a number set by hand is kept as set, even one over the room (the budget check then refuses it)
    kept = RolloutDataModule(load={"chunk_tokens": room + 50})
    kept.rollout = rollout
    assert kept.chunk_tokens(tokenizer) == room + 50


def test_a_layout_that_cuts_chunks_refuses_a_missing_size_in_one_line():
    with pytest.raises(ValueError, match=r"^data.load.chunk_tokens: null cuts the locomo layout's chunks"):
        load_instances(FIXTURE, layout="locomo", chunk_tokens=None)


OBSERVATION = {
    "session_1_observation": {"Ilse": [["Ilse started a pottery course.", "D1:2"]]},
    "session_2_observation": {
        "Ilse": [["Ilse bought a green vase for her sister Hanna.", ["D2:9", "D2:4"]]],
        "Tomas": [["Tomas is moving to Rotterdam.", "D2:5"], ["Tomas likes trams.", "D7:1"]],
    },
}


def test_observation_facts_become_dated_notes_in_the_chunk_of_their_turn(tmp_path):
    records = changed(lambda record: record.update(observation=OBSERVATION))
    instances, _ = load_instances(write(tmp_path, records), layout="locomo", chunk_tokens=60)
    # session 2 is split in two parts at 60 words: D2:1-D2:4, then D2:5-D2:6
    notes = instances[0].metadata["observations"]

    def note(fact: str, day: str) -> dict:
        return {"memory_type": "episodic_memory", "fact": fact, "date": day}

    assert notes[0] == [note("Ilse started a pottery course.", "2024-03-03")]
    # D2:9 names no turn, so the first id that does (D2:4); D7:1 none, so the session's first part
    assert notes[1] == [note("Ilse bought a green vase for her sister Hanna.", "2024-03-17"),
                        note("Tomas likes trams.", "2024-03-17")]
    assert notes[2] == [note("Tomas is moving to Rotterdam.", "2024-03-17")]
    assert "observations" not in instances[1].metadata  # the second record has none


def test_data_demos_writes_demonstrations_from_observations_and_refuses_a_record_without(
    tmp_path, tokenizer, capsys
):
    from memalpha.commands.data_demos import main as demos_main

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "tiny_cpu.yaml").read_text())
    config["model"]["rollout"]["max_new_tokens"] = 400  # a session's facts in one reply
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    records = changed(lambda record: record.update(observation=OBSERVATION))[:1]
    out = tmp_path / "demos.jsonl"
    demos_main(["--config", str(config_path), "--out", str(out), "--data", str(write(tmp_path, records))])
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(demos) == 2  # one per chunk: each session fits the prompt budget whole
    assert "Ilse started a pottery course" in demos[0]["response"]
    assert all(fact in demos[1]["response"] for fact in ("green vase", "moving to Rotterdam", "likes trams"))
    with pytest.raises(SystemExit):
        demos_main(["--config", str(config_path), "--out", str(tmp_path / "no.jsonl"),
                    "--data", str(write(tmp_path, RECORDS[:1], "plain.json"))])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"memalpha data demos: error: {tmp_path / 'plain.json'}: record 0 (instance_id='fx-1'): field "
        "'observation': no observation: demonstrations are written from LoCoMo's observation facts"
    )
    assert not (tmp_path / "no.jsonl").exists()
