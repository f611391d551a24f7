"""``memalpha predict`` end to end on a tiny random model: one record per instance in input order,
resumed after a kill without a duplicate or a torn record, refusing files it did not write, two
DDP ranks merged into the one-process file, and the embedded model storing what it read."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_training import write_config

from memalpha.cli import main
from memalpha.data.loaders import save_jsonl
from memalpha.data.synthetic import SyntheticSettings
from memalpha.inference.memory_file import load_memory, save_memory
from memalpha.memory.store import Memory
from memalpha.train.predict_file import RECORD_FORMAT

REPO = Path(__file__).resolve().parents[1]
TEXTS = {
    "a.txt": "Ada lives in Lisbon.\n\nShe adopted a cat named Pixel in March.\n",
    "b.md": "# Grace\n\nGrace teaches mathematics in Coimbra.",
    "sub/c.txt": "Bo sings in a choir every Sunday.",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict")
    texts = root / "notes"
    for name, text in TEXTS.items():
        (texts / name).parent.mkdir(parents=True, exist_ok=True)
        (texts / name).write_text(text, encoding="utf-8")
    config = write_config(root / "cfg", tiny_model_dir)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"]["enable_progress_bar"] = False
    settings["model"]["rollout"].update(max_new_tokens=6)
    config.write_text(yaml.safe_dump(settings))
    return {"root": root, "texts": texts, "config": config}


def predict(inputs, output: Path, *args: str) -> None:
    main(["predict", "--config", str(inputs["config"]), "--data.predict.path", str(inputs["texts"]),
          "--data.predict.output", str(output), "--data.predict.split", "blank_lines", *args])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def first_run(inputs) -> bytes:
    output = inputs["root"] / "first.jsonl"
    predict(inputs, output)
    return output.read_bytes()


def test_one_record_per_text_in_input_order(first_run, inputs):
    written = [json.loads(line) for line in first_run.decode().splitlines()]
    assert [r["instance_id"] for r in written] == ["a.txt", "b.md", "sub/c.txt"]
    assert [r["chunks"] for r in written] == [2, 2, 1]  # blank-line blocks
    assert {r["format"] for r in written} == {RECORD_FORMAT} and len({r["agent"] for r in written}) == 1
    for record in written:
        assert len(record["turns"]) == record["chunks"] and record["questions"] == []
        assert {"response", "truncated", "results"} <= set(record["turns"][0])
        memory = Memory.from_dict(record["memory"])
        assert memory.to_dict() == record["memory"] and record["accuracy"] is None


def test_the_progress_bar_counts_chunks(inputs, capsys):
    predict(inputs, inputs["root"] / "bar.jsonl", "--trainer.enable_progress_bar", "true")
    assert "5/5 chunks" in capsys.readouterr().out


def test_a_killed_run_resumes_with_no_duplicate_and_no_torn_record(first_run, inputs):
    lines = first_run.splitlines(keepends=True)
    left_behind = {"torn.jsonl": lines[0] + lines[1][:50], "out_of_order.jsonl": lines[2] + lines[0][:20]}
    for name, left in left_behind.items():
        output = inputs["root"] / name
        output.write_bytes(left)
        predict(inputs, output)
        assert output.read_bytes() == first_run, name
    again = inputs["root"] / "torn.jsonl"
    predict(inputs, again)  # every instance written: nothing to do, nothing changes
    assert again.read_bytes() == first_run


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (b"hello world\n", (), "line 1 is not a memalpha prediction record"),
        (b"\x00\x01binary without a newline", (), "line 1 is not a memalpha prediction record"),
        (None, ("--model.seed", "5"), "line 1 was written by another agent or with other settings"),
        (None, ("--data.predict.split", "tokens"), "line 1 was written by another agent or with other"),
        (b'{"format": "memalpha.prediction/1", "agent": "AGENT", "instance_id": "zz.txt"}\n', (),
         "line 1 holds instance 'zz.txt', which data.predict.path does not"),
    ],
)
def test_an_output_it_cannot_resume_is_refused_in_one_line_and_left_as_it_was(
    first_run, inputs, capsys, content, args, message
):
    output = inputs["root"] / "other.jsonl"
    agent = json.loads(first_run.splitlines()[0])["agent"]
    output.write_bytes(first_run if content is None else content.replace(b"AGENT", agent.encode()))
    before = output.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        predict(inputs, output, *args)
    text = str(exit_info.value.code)
    assert text.startswith("memalpha predict: error: ") and message in text and "nothing was changed" in text
    assert "\n" not in text and output.read_bytes() == before


def test_questions_of_a_data_file_are_answered_and_scored(inputs):
    data = inputs["root"] / "val.jsonl"
    instances = SyntheticSettings(val=2, chunks=2, questions=2, chunk_words=20).generate("val", 0)
    save_jsonl(instances, data)
    output = inputs["root"] / "val.predictions.jsonl"
    main(["predict", "--config", str(inputs["config"]), "--data.predict.path", str(data),
          "--model.reader.kind", "extractive"])
    written = records(output)  # the default output: beside the input
    assert [r["instance_id"] for r in written] == [i.instance_id for i in instances]
    for record, instance in zip(written, instances):
        assert [q["question"] for q in record["questions"]] == [qa.question for qa in instance.questions]
        assert all(q["score"] in (0.0, 1.0) and q["gold"] and "prediction" in q for q in record["questions"])
        assert record["accuracy"] == sum(q["score"] for q in record["questions"]) / 2
        assert record["fact_recall"] is not None


def test_a_chunk_that_could_overflow_the_prompt_stops_before_the_model_loads(inputs, capsys):
    long = inputs["root"] / "long.txt"
    long.write_text(" ".join(f"Item {i} sits in box {i}." for i in range(600)), encoding="utf-8")
    output = inputs["root"] / "long.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--config", str(inputs["config"]), "--data.predict.path", str(long),
              "--data.predict.output", str(output), "--data.load.chunk_tokens", "900",
              "--model.rollout.max_prompt_tokens", "1200"])
    text = str(exit_info.value.code)
    assert f"data.predict.path={long}: instance 'long.txt', chunk 0 (900 tokens)" in text
    assert "data.load.chunk_tokens=900, with the core memory at model.rollout.core_token_limit=128" in text
    assert "over model.rollout.max_prompt_tokens=1200" in text
    assert not output.exists() and "Loading weights" not in capsys.readouterr().err


def test_without_a_chunk_flag_a_long_text_is_cut_to_what_fits_and_read_whole(inputs, tokenizer, caplog):
    from memalpha.agent.prompt_budget import chunk_room
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.plain_text import text_chunks

    text = " ".join(f"Item {i} sits in box {i}." for i in range(300))
    long = inputs["root"] / "long_default.txt"
    long.write_text(text, encoding="utf-8")
    output = inputs["root"] / "long_default.jsonl"
    with caplog.at_level(logging.INFO):
        main(["predict", "--config", str(inputs["config"]), "--data.predict.path", str(long),
              "--data.predict.output", str(output), "--model.rollout.max_prompt_tokens", "1200"])
    rollout = yaml.safe_load(inputs["config"].read_text())["model"]["rollout"]
    room = chunk_room(tokenizer, RolloutSettings(**{**rollout, "max_prompt_tokens": 1200}))
    (record,) = records(output)
    assert record["chunks"] == len(text_chunks(text, tokenizer, room, "tokens", "long_default.txt")) > 1
    assert len(record["turns"]) == record["chunks"]
    # the last line counts the replies cut at the cap (6 tokens here: every one of them)
    cut = sum(turn["truncated"] for turn in record["turns"])
    said = f"{cut} of {record['chunks']} replies cut at model.rollout.max_new_tokens=6"
    assert cut and any(said in r.getMessage() for r in caplog.records)


def test_two_ddp_ranks_write_their_shares_and_the_merge_is_the_one_process_file(first_run, inputs):
    output = inputs["root"] / "ddp.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), HF_HUB_OFFLINE="1")
    cmd = [
        str(Path(sys.executable).with_name("memalpha")), "predict", "--config", str(inputs["config"]),
        "--data.predict.path", str(inputs["texts"]), "--data.predict.output", str(output),
        "--data.predict.split", "blank_lines", "--trainer.devices", "2", "--trainer.strategy", "ddp",
    ]
    proc = subprocess.run(
        cmd, env=env, cwd=inputs["root"], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert output.read_bytes() == first_run
    assert not list(inputs["root"].glob("ddp.jsonl.rank*.part"))


@pytest.mark.embedded
@pytest.mark.slow
def test_the_embedded_model_reads_a_text_file_and_its_saved_memory_holds_what_its_calls_stored(
    tmp_path, embedded_model_dir
):
    """SmolLM2-135M, given five supervised steps on one demonstration (the base model writes no
    call), reads a short text file through ``memalpha predict``; every call that succeeded left
    its content in the recorded memory, and that memory saved to a file loads back the same."""
    from memalpha.agent.memorise_prompts import memorise_messages, render_memorise, stated_response_limit
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.demo_files import Demonstration, save_demonstrations
    from memalpha.tools.formats import get_call_format

    chunk = "Ada Lovelace lives in Lisbon. Her cat is called Pixel."
    text = tmp_path / "ada.txt"
    text.write_text(chunk, encoding="utf-8")
    tiny = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    settings = RolloutSettings(**{**tiny["model"]["rollout"], "group_size": 1})
    call_format = get_call_format(settings.call_format)
    messages = memorise_messages(
        render_memorise(Memory(core_token_limit=settings.core_token_limit), settings.memory_view_k,
                        settings.templates),
        chunk, call_format, response_token_limit=stated_response_limit(settings.max_new_tokens, 1.0),
        detail=settings.prompt_profile, templates=settings.templates,
    )  # fmt: skip
    reply = call_format.render_calls([("new_memory_insert", {"memory_type": "semantic_memory",
                                                             "content": "Ada Lovelace lives in Lisbon."})])
    demos = tmp_path / "demos.jsonl"
    save_demonstrations(demos, [Demonstration(messages, reply)])
    adapter = tmp_path / "adapter"
    main(["sft", "--config", str(REPO / "configs" / "sft_tiny_cpu.yaml"), "--data.train_path", str(demos),
          "--data.val_path", "null", "--data.batch_size", "1", "--model.micro_batch_size", "1",
          "--model.lora.target_modules", r".*\.2[6-9]\..*_proj",  # the last 4 layers: a short backward
          "--trainer.default_root_dir", str(tmp_path), "--trainer.max_steps", "5",
          "--model.optimizer.learning_rate", "5e-3", "--trainer.logger", "false",
          "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false",
          "--model.export_adapter_dir", str(adapter), "--model.optimizer.warmup_ratio", "0"])
    output = tmp_path / "ada.predictions.jsonl"
    main(["predict", "--config", str(REPO / "configs" / "tiny_cpu.yaml"), "--model.adapter_path",
          str(adapter), "--data.predict.path", str(text), "--trainer.logger", "false",
          "--trainer.default_root_dir", str(tmp_path),
          "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false"])
    (record,) = records(output)
    stored = [
        result["arguments"]["content"] for turn in record["turns"] for result in turn["results"]
        if result["status"] == "ok" and result["tool"] == "new_memory_insert"
    ]  # fmt: skip
    assert stored, f"the trained agent stored nothing: {record['turns']}"
    memory = Memory.from_dict(record["memory"])
    kept = [e.content for e in memory.semantic + memory.episodic]
    assert all(content in kept for content in stored)
    saved = save_memory(memory, tmp_path / "ada.memory.json")
    assert load_memory(saved).to_dict() == record["memory"]
    assert record["memory_tokens"] > 0


def test_the_bar_moves_with_each_chunk_of_a_batch():
    from types import SimpleNamespace

    from memalpha.agent.progress import Phase
    from memalpha.data.schema import Instance
    from memalpha.train.progress_bar import StepProgressBar

    class Bar:
        disable, n = False, 0

        def set_description_str(self, text, refresh=True):
            self.text = text

        def set_postfix(self, values, refresh=True):
            self.postfix = values

    callback, bar = StepProgressBar(), Bar()
    callback._trainer = SimpleNamespace(
        predicting=True, validating=False, sanity_checking=False, training=False
    )
    callback._predict_progress_bar = bar
    batch = [Instance("a", "text", ["x"] * 3, []), Instance("b", "text", ["y"], [])]
    callback.on_predict_batch_start(None, None, batch, 0)
    callback.show_phase(Phase("sampling", 2, 3))
    assert bar.n == 2 and "sampling chunk 2/3" in bar.text  # chunk 1 of both done
    callback.show_phase(Phase("sampling", 3, 3))
    assert bar.n == 3
    callback.on_predict_batch_end(None, None, None, batch, 0)
    assert bar.n == 4 and bar.postfix == {"instances": 2}
