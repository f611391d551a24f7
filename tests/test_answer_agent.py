"""The answer agent (docs/answer_agent.md): its demonstrations by hand (memalpha/agent/answer_demos.py),
its adapter answering beside the policy's on the same base (memalpha/reader/settings.py,
memalpha/lm/core/modes.py), the one-line refusals, and the whole path on a tiny random model:
memories an agent wrote -> ``memalpha data answers`` -> ``memalpha sft`` -> ``memalpha validate`` with
``model.reader.adapter_path``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import randomise_lora_b
from test_training import nonzero_adapter, write_config

from memalpha.agent.answer_demos import answer_demonstrations, read_memory_records, target_answer
from memalpha.cli import main, run
from memalpha.data.demo_files import load_demonstrations
from memalpha.data.memory_records import parse_memory_record
from memalpha.data.schema import DataValidationError
from memalpha.inference.memory_agent import MemoryAgent
from memalpha.lm.core.adapters import check_adapter_base, export_adapter
from memalpha.lm.core.modes import ANSWER_ADAPTER
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.sampling.generation import generate
from memalpha.memory.store import Memory
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.local import chat_prompt_text
from memalpha.reader.settings import ReaderSettings
from memalpha.train.settings_loader import AgentLoadError


@pytest.mark.parametrize(
    ("gold", "metric", "target"),
    [("Lisbon", "substring", "Lisbon"), (["Lisbon", "Lisboa"], "substring", "Lisbon"),
     (["red", "blue"], "multi_part", "red, blue"), ("3", "boxed", "\\boxed{3}"),
     ("29 January, 2023", "locomo", "29 January, 2023"), ("a rubric", "llm_judge", None)],
)
def test_the_target_is_the_gold_as_short_as_its_metric_wants(gold, metric, target):
    assert target_answer(gold, metric) == target


def memory_record(memory: Memory, questions, source="synth_personal", **extra) -> dict:
    return {"instance_id": "i0", "data_source": source, "memory": memory.to_dict(), "questions": questions,
            **extra}


def test_a_demonstration_is_the_readers_prompt_and_the_gold(tmp_path):
    memory = Memory(seed=3)
    memory.insert("semantic", "Ada lives in Lisbon.")
    memory.insert("episodic", "2024-03-01: Bob moved to Oslo.")
    reader = ExtractiveReader()
    record = memory_record(memory, [{"question": "Where does Ada live?", "gold": ["Lisbon", "Lisboa"]},
                                    {"question": "Who moved?", "gold": "Bob", "stored": True}])
    instance = parse_memory_record(record, "memories.jsonl", 0)
    demos, skipped = answer_demonstrations([instance], reader, len)
    assert skipped == 0 and [d.response for d in demos] == ["Lisbon", "Bob"]
    expected = reader.answer_conversations([(memory, "Where does Ada live?")], ["synth_personal"])[0]
    assert demos[0].messages == expected and demos[1].metadata["instance_id"] == "i0"
    rubric = {"synth_*": "llm_judge"}
    judged, skipped = answer_demonstrations([instance], reader, len, metric_overrides=rubric)
    assert judged == [] and skipped == 2


def test_records_are_read_from_predict_outputs_and_reports_and_bad_ones_named(tmp_path):
    memory = Memory()
    good = memory_record(memory, [{"question": "q?", "gold": "g"}])
    jsonl = tmp_path / "predict.jsonl"
    jsonl.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "instance_id": "i1"}) + "\n")
    report = tmp_path / "validation.json"
    report.write_text(json.dumps({"summary": {}, "records": [good]}))
    assert len(read_memory_records(jsonl)) == 2 and len(read_memory_records(report)) == 1
    cases = [
        ({**good, "memory": {"core": ""}}, "field 'memory'"),
        ({**good, "questions": [{"question": "q?"}]}, "field 'questions[0].gold'"),
        ({**good, "questions": [{"question": "q?", "gold": "  "}]}, "field 'questions[0].gold'"),
        ({**good, "data_source": None}, "field 'data_source'"),
    ]
    for bad, field in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps({**bad, "instance_id": "i1"}) + "\n")
        with pytest.raises(DataValidationError) as error:
            read_memory_records(path)
        assert str(path) in str(error.value) and "record 1" in str(error.value) and field in str(error.value)
        assert "\n" not in str(error.value)


# ------------------------------------------------------------------ the adapter beside the policy's
@pytest.fixture(scope="module")
def answer_adapter(tmp_path_factory, tiny_model_dir) -> Path:
    return nonzero_adapter(tmp_path_factory.mktemp("answer"), tiny_model_dir)


def test_the_reader_answers_with_the_answer_adapter_alone_and_the_policy_stays_as_it_was(
    tiny_model_dir, answer_adapter
):
    policy, tokenizer = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    torch.manual_seed(5)
    randomise_lora_b(policy, 0.5)  # the policy's own adapter differs from the answer agent's
    trains = {n for n, p in policy.named_parameters() if p.requires_grad}
    settings = ReaderSettings(max_new_tokens=6, adapter_path=str(answer_adapter))
    reader = settings.build(policy, tokenizer)
    assert reader.adapter == ANSWER_ADAPTER and reader.model is policy
    memory = Memory()
    memory.insert("semantic", "Ada lives in Lisbon.")
    answers = [a.text for a in reader.answer([(memory, "Where does Ada live?"), (memory, "Who is Ada?")])]
    # the same prompts through a model whose only adapter is the answer agent's
    alone, _ = load_policy(tiny_model_dir, adapter_path=str(answer_adapter))
    alone.eval()
    asked = [(memory, "Where does Ada live?"), (memory, "Who is Ada?")]
    prompts = [tokenizer(chat_prompt_text(tokenizer, c), add_special_tokens=False)["input_ids"]
               for c in reader.answer_conversations(asked)]
    with torch.no_grad():
        out = generate(alone, tokenizer, prompts, max_new_tokens=6, do_sample=False)
    assert answers == [tokenizer.decode(r, skip_special_tokens=True).strip() for r in out.response_ids]
    base = ReaderSettings(max_new_tokens=6).build(policy, tokenizer)
    assert [a.text for a in base.answer([(memory, "Where does Ada live?")])] != answers[:1]
    assert policy.active_adapter == "default"
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trains
    target = export_adapter(policy, tokenizer, Path(answer_adapter).parent / "exported")
    assert not (target / ANSWER_ADAPTER).exists()  # the trained adapter alone


def test_an_answer_adapter_on_another_base_or_reader_is_one_line(tmp_path, tiny_model_dir, answer_adapter):
    with pytest.raises(ValueError, match="reader.adapter_path: the answer agent is an adapter on the policy"):
        ReaderSettings(kind="extractive", adapter_path=str(answer_adapter))
    with pytest.raises(ValueError, match="reader.adapter_path: .* is not a PEFT adapter folder"):
        ReaderSettings(adapter_path=str(tmp_path))
    check_adapter_base(answer_adapter, tiny_model_dir, "reader.adapter_path")  # its own base
    moved = Path(tiny_model_dir).parent.parent / "elsewhere" / Path(tiny_model_dir).name
    check_adapter_base(answer_adapter, str(moved), "reader.adapter_path")  # the same folder name
    with pytest.raises(ValueError) as error:
        check_adapter_base(answer_adapter, "Qwen/Qwen3-4B", "reader.adapter_path")
    assert "was trained on the base" in str(error.value) and "not on model.model 'Qwen/Qwen3-4B'" in str(
        error.value
    )
    with pytest.raises(AgentLoadError, match="was trained on the base"):
        MemoryAgent.baseline("raw_chunks", model="Qwen/Qwen3-4B",
                             reader={"adapter_path": str(answer_adapter)})


# ------------------------------------------------------------------ the whole path through the commands
@pytest.fixture(scope="module")
def path(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """Memories written by the (untrained) tiny agent, their answer demonstrations, an SFT answer agent
    and two validations: with and without it."""
    root = tmp_path_factory.mktemp("answer-path")
    config = write_config(root, tiny_model_dir)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"]["enable_progress_bar"] = False
    config.write_text(yaml.safe_dump(settings))
    from memalpha.data.loaders import save_jsonl
    from memalpha.data.synthetic import generate_synthetic

    save_jsonl(generate_synthetic(3, split="train", seed=4, num_chunks=2, questions_per_instance=2,
                                  chunk_words=30), root / "train.jsonl")
    memories = root / "memories.jsonl"
    main(["predict", "--config", str(config), "--data.predict.path", str(root / "train.jsonl"),
          "--data.predict.output", str(memories)])
    demos = root / "answers.jsonl"
    main(["data", "answers", "--config", str(config), "--memories", str(memories), "--out", str(demos)])
    sft = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "sft_tiny_cpu.yaml").read_text())
    sft["trainer"].update(max_steps=2, val_check_interval=2, enable_progress_bar=False, callbacks=[],
                          enable_checkpointing=False)
    sft["trainer"]["logger"]["init_args"]["save_dir"] = str(root / "runs")
    sft["model"].update(model=tiny_model_dir, export_adapter_dir=str(root / "answer"), micro_batch_size=2)
    sft["data"].update(train_path=str(demos), val_path=str(demos), batch_size=2, val_batch_size=2)
    (root / "sft.yaml").write_text(yaml.safe_dump(sft))
    main(["sft", "--config", str(root / "sft.yaml")])
    answered = ["--model.reader.adapter_path", str(root / "answer")]
    for version, extra in (("plain", []), ("answered", answered)):
        main(["validate", "--config", str(config), "--trainer.logger.init_args.version", version, *extra])
    return {"root": root, "config": config, "memories": memories, "demos": demos, "answer": root / "answer"}


def test_the_commands_train_an_answer_agent_and_validate_with_it(path):
    demos = load_demonstrations(path["demos"])
    assert len(demos) == 6 and all(d.metadata["source"] == "answers" for d in demos)  # 3 instances x 2
    assert (path["answer"] / "adapter_config.json").is_file()
    runs = path["root"] / "run" / "tb"
    plain = json.loads((runs / "plain" / "validation.json").read_text())
    answered = json.loads((runs / "answered" / "validation.json").read_text())
    recorded = answered["summary"]["settings"]["scoring"]["model.reader.adapter"]
    assert recorded[0] == str(path["answer"].resolve()) and len(recorded[1]) == 16
    assert "model.reader.adapter" not in plain["summary"]["settings"]["scoring"]


def test_compare_refuses_reports_answered_by_different_answer_agents(path, capsys):
    runs = path["root"] / "run" / "tb"
    with pytest.raises(SystemExit):
        run(["compare", str(runs / "plain"), str(runs / "answered")])
    assert "scored with other settings: model.reader.adapter" in capsys.readouterr().err


def test_data_answers_refuses_bad_memories_in_one_line(path, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"memory": {}, "data_source": "x", "questions": []}) + "\n")
    with pytest.raises(SystemExit) as stopped:
        main(["data", "answers", "--config", str(path["config"]), "--memories", str(bad), "--out",
              str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "memalpha data answers: error:" in err and "field 'memory'" in err
    assert not (tmp_path / "o.jsonl").exists()


# ------------------------------------------------------------------ GRPO of the answer agent
def test_the_answer_reward_is_token_f1_against_the_best_gold():
    from memalpha.agent.answering import answer_reward

    # "in Lisbon" against "Lisbon": precision 1/2 (the stem "in" is not dropped), recall 1: F1 2/3
    assert answer_reward("in Lisbon", "Lisbon", {}, "synth_personal") == pytest.approx(2 / 3)
    assert answer_reward("Lisbon", ["Porto", "Lisbon"], {}, "synth_personal") == 1.0
    assert answer_reward("Oslo", "Lisbon", {}, "synth_personal") == 0.0
    # LoCoMo's own score by category: an adversarial question scores "not mentioned"
    adversarial = {"category": 5, "options": {"a": "Not mentioned in the conversation", "b": "x"}}
    assert answer_reward("Not mentioned.", "x", adversarial, "locomo") == 1.0


def test_answer_rollouts_group_each_questions_answers_and_reward_them(path, tiny_model_dir):
    from memalpha.agent.answering import AnswerAgent, answer_reward
    from memalpha.agent.reward_settings import RewardSettings
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.loaders import load_instances

    instances, report = load_instances(path["memories"])
    assert report.layout == "memories" and all(i.chunks == [] and "memory" in i.metadata for i in instances)
    policy, tokenizer = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    reader = ReaderSettings(max_new_tokens=5).build(None, tokenizer)
    agent = AnswerAgent(policy, tokenizer, reader, RolloutSettings(group_size=3), RewardSettings(), 5)
    out = agent.rollouts(instances[:2], seed=0)
    questions = sum(len(i.questions) for i in instances[:2])
    assert len(out.samples) == 3 * questions and len(out.records) == 2 * 3
    assert sorted({s.group_id for s in out.samples}) == list(range(questions))
    for sample in out.samples:
        record = out.records[sample.rollout_id]
        (asked,) = [q for q in record.questions if q["question"] ==
                    instances[[i.instance_id for i in instances].index(record.instance_id)]
                    .questions[sample.chunk_index].question]
        assert sample.reward == asked["answer_reward"] == pytest.approx(
            answer_reward(asked["prediction"], asked["gold"], {}, record.data_source))
        assert len(sample.response_ids) <= 5 and sample.num_calls == 0
    for record in out.records:
        rewards = [q["answer_reward"] for q in record.questions]
        assert record.r1 == pytest.approx(sum(rewards) / len(rewards))
        assert record.turns == [] and all(q["score"] in (0.0, 1.0) for q in record.questions)


def answer_fit_config(path: dict, tiny_model_dir: str, root: Path, **rollout) -> Path:
    config = yaml.safe_load(path["config"].read_text())
    config["trainer"].update(max_steps=1, val_check_interval=1, limit_val_batches=1, callbacks=[],
                             enable_checkpointing=False)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(root)
    config["model"]["rollout"].update(trains="answer", group_size=2, **rollout)
    config["model"]["export_adapter_dir"] = str(root / "adapter")
    config["data"].update(train_path=str(path["memories"]), val_path=str(path["memories"]))
    out = root / "answer_fit.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def test_fit_trains_the_answer_agent_on_memories_through_the_grpo_step(path, tiny_model_dir, tmp_path):
    from test_training import scalars

    config = answer_fit_config(path, tiny_model_dir, tmp_path)
    main(["fit", "--config", str(config)])
    (version,) = (tmp_path / "tb").glob("version_*")
    values = scalars(version)
    assert {"train/reward", "train/loss", "rewards/r1_accuracy", "val/accuracy"} <= set(values)
    assert values["train/tool_calls_per_turn"][0] == 0.0
    report = json.loads(next(version.glob("validation_step*.json")).read_text())
    assert report["summary"]["overall"]["tool_success"] is None
    assert all("answer_reward" in q for r in report["records"] for q in r["questions"])
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.reader.kind", "extractive"],
         "model.rollout.trains: answer trains the answer agent on the local reader's prompts"),
        (["--model.reader.adapter_path", "ANSWER"],
         "start it with model.adapter_path, not reader.adapter_path"),
        (["--model.update.credit", "hindsight"], "update.credit must be broadcast, not hindsight"),
        (["--data.train_path", "INSTANCES"],
         "no memory: model.rollout.trains: answer reads memories an agent wrote"),
    ],
)
def test_settings_that_cannot_train_the_answer_agent_are_one_line(
    path, tiny_model_dir, tmp_path, capsys, args, message
):
    config = answer_fit_config(path, tiny_model_dir, tmp_path)
    args = [a.replace("ANSWER", str(path["answer"])).replace("INSTANCES", str(path["root"] / "train.jsonl"))
            for a in args]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), *args])
    said = f"{stopped.value.code}{capsys.readouterr().err}"
    assert message in said and "Traceback" not in said


def test_validate_scores_any_reader_on_memories_already_written(path):
    """A memories file is a held-out set whose memories are fixed: validate answers from each as it is
    (no chunk to read), so readers are compared on the same memories."""
    runs = path["root"] / "run" / "tb"
    main(["validate", "--config", str(path["config"]), "--data.val_path", str(path["memories"]),
          "--trainer.logger.init_args.version", "on_memories", "--trainer.limit_val_batches", "null"])
    report = json.loads((runs / "on_memories" / "validation.json").read_text())
    written = [json.loads(line) for line in path["memories"].read_text().splitlines()]
    assert {r["instance_id"]: r["memory"] for r in report["records"]} == {
        r["instance_id"]: r["memory"] for r in written}
    assert all(r["turns"] == [] and r["chunk_tokens"] == 0 for r in report["records"])
    assert [len(r["questions"]) for r in report["records"]] == [len(r["questions"]) for r in written]


def test_the_memory_agents_grpo_and_predict_answer_with_a_trained_answer_agent(path, tmp_path):
    """fit trains the memory agent's adapter while the frozen answer agent scores it; its export holds
    the memory agent alone; predict answers with the answer agent too."""
    config = yaml.safe_load(path["config"].read_text())
    config["trainer"].update(max_steps=1, limit_val_batches=0, callbacks=[], enable_checkpointing=False)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path)
    config["model"]["reader"]["adapter_path"] = str(path["answer"])
    config["model"]["export_adapter_dir"] = str(tmp_path / "memory_agent")
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(tmp_path / "fit.yaml")])
    exported = tmp_path / "memory_agent"
    assert (exported / "adapter_config.json").is_file() and not (exported / ANSWER_ADAPTER).exists()
    from safetensors.torch import load_file

    names = load_file(str(exported / "adapter_model.safetensors"))
    assert names and not any(f".{ANSWER_ADAPTER}." in name for name in names)
    output = tmp_path / "answered.jsonl"
    main(["predict", "--config", str(path["config"]), "--data.predict.path",
          str(path["root"] / "train.jsonl"), "--data.predict.output", str(output),
          "--model.reader.adapter_path", str(path["answer"]), "--trainer.default_root_dir", str(tmp_path)])
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 3 and all(q["prediction"] is not None for r in records for q in r["questions"])
