"""Demonstrations from recorded trajectories (``memalpha data distill``).

The strongest check: recording the oracle's own turns as a validation report and distilling it
must give back the oracle demonstrations exactly (same prompts, same replies) and rebuild the
recorded memory, which is what a rollout of that policy would have seen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memalpha.agent.oracle_demos import oracle_demonstrations
from memalpha.agent.rollout import make_token_counter
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.agent.trajectory_replay import RecordedTurn, replay_trajectory
from memalpha.data.demo_files import load_demonstrations
from memalpha.data.loaders import save_jsonl
from memalpha.data.schema import QA, Instance
from memalpha.data.synthetic import generate_synthetic
from memalpha.memory.store import Memory
from memalpha.seeding import stable_seed
from memalpha.tools.executor import execute_response
from memalpha.tools.formats import get_call_format

REPO = Path(__file__).resolve().parent.parent
OFFICIAL = Path(__file__).parent / "fixtures" / "memalpha4b_pubmed" / "responses.jsonl"
SETTINGS = RolloutSettings(
    call_format="hermes", max_new_tokens=160, max_prompt_tokens=2048, prompt_profile="compact"
)


def _instances():
    return generate_synthetic(
        3,
        split="val",
        seed=0,
        num_chunks=3,
        facts_per_chunk=2,
        questions_per_instance=2,
        chunk_words=40,
        families=("synth_personal", "synth_timeline"),
    )


def _oracle_record(instance, demos, tokenizer, *, score: float, broken_chunk: int | None = None) -> dict:
    """What a validation report holds for one rollout that wrote the oracle's replies (chunk
    ``broken_chunk`` replaced by a failing call)."""
    fmt = get_call_format(SETTINGS.call_format)
    memory = Memory(token_counter=make_token_counter(tokenizer), core_token_limit=SETTINGS.core_token_limit,
                    seed=stable_seed(0, instance.instance_id, 0))
    turns = []
    for demo in demos:
        response = demo.response
        if demo.metadata["chunk_index"] == broken_chunk:
            response = fmt.render_call(
                "memory_delete", {"memory_type": "semantic_memory", "memory_id": "zzzz"}
            )
        outcome = execute_response(memory, response, fmt)
        turns.append({"chunk_index": demo.metadata["chunk_index"], "response": response, "truncated": False,
                      "results": [{"status": r.status} for r in outcome.results]})
    return {"instance_id": instance.instance_id, "data_source": instance.data_source, "rollout_index": 0,
            "turns": turns, "memory": memory.to_dict(), "memory_tokens": memory.total_tokens(),
            "chunk_tokens": 0, "questions": [{"score": score}], "r1": score, "r3": 0.0, "reader_failures": 0}


def _by_instance(demos):
    out: dict[str, list] = {}
    for demo in demos:
        out.setdefault(demo.metadata["instance_id"], []).append(demo)
    return out


def test_replaying_recorded_oracle_turns_gives_back_the_oracle_demonstrations(tokenizer):
    instances = _instances()
    oracle = _by_instance(oracle_demonstrations(instances, tokenizer, SETTINGS, seed=0))
    for instance in instances:
        record = _oracle_record(instance, oracle[instance.instance_id], tokenizer, score=1.0)
        turns = [RecordedTurn(t["chunk_index"], t["response"]) for t in record["turns"]]
        demos, memory, stats = replay_trajectory(
            instance, turns, tokenizer, SETTINGS, memory_seed=record["memory"]["seed"], source="teacher"
        )
        assert memory.to_dict() == record["memory"]
        assert (stats.turns, stats.kept) == (len(instance.chunks), len(instance.chunks))
        assert [d.messages for d in demos] == [d.messages for d in oracle[instance.instance_id]]
        assert [d.response for d in demos] == [d.response for d in oracle[instance.instance_id]]
        assert all(d.metadata["source"] == "teacher" for d in demos)


def test_turns_without_calls_with_a_failed_call_cut_or_over_budget_are_dropped(tokenizer):
    instance = _instances()[0]
    fmt = get_call_format("hermes")
    good = fmt.render_call(
        "new_memory_insert", {"memory_type": "semantic_memory", "content": "Ada likes tea."}
    )
    bad = fmt.render_call("memory_delete", {"memory_type": "semantic_memory", "memory_id": "nope"})
    other = fmt.render_call(
        "new_memory_insert", {"memory_type": "semantic_memory", "content": "Bo likes jam."}
    )
    long = fmt.render_call("new_memory_insert", {"memory_type": "semantic_memory", "content": "word " * 300})
    turns = [
        RecordedTurn(0, "I have nothing to store."),
        RecordedTurn(1, good + "\n" + bad),
        RecordedTurn(2, other, truncated=True),
    ]
    demos, memory, stats = replay_trajectory(
        instance, turns, tokenizer, SETTINGS, memory_seed=1, source="teacher"
    )
    assert demos == [] and stats.kept == 0
    assert dict(stats.dropped) == {"no_call": 1, "failed_call": 1, "truncated": 1}
    assert [e.content for e in memory.semantic] == ["Ada likes tea.", "Bo likes jam."]  # every turn still ran
    demos, _, stats = replay_trajectory(
        instance, [RecordedTurn(0, long)], tokenizer, SETTINGS, memory_seed=1, source="t"
    )
    assert demos == [] and dict(stats.dropped) == {"over_budget": 1}
    assert "kept 0 of 1 recorded turns (dropped: 1 over budget)" == stats.describe()
    with pytest.raises(ValueError, match="increasing order"):
        replay_trajectory(instance, [RecordedTurn(1, good), RecordedTurn(0, good)], tokenizer, SETTINGS,
                          memory_seed=1, source="t")


def _fit_config(tmp_path: Path, model_dir: str) -> Path:
    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    config["model"]["model"] = model_dir
    config["model"]["rollout"].update(max_new_tokens=SETTINGS.max_new_tokens, max_prompt_tokens=2048)
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_distill_command_keeps_successful_turns_of_accurate_rollouts(
    tmp_path, tiny_model_dir, tokenizer, capsys
):
    from memalpha.cli import main

    instances = _instances()
    oracle = _by_instance(oracle_demonstrations(instances, tokenizer, SETTINGS, seed=0))
    records = [
        _oracle_record(instances[0], oracle[instances[0].instance_id], tokenizer, score=1.0),
        _oracle_record(instances[1], oracle[instances[1].instance_id], tokenizer, score=1.0, broken_chunk=1),
        _oracle_record(instances[2], oracle[instances[2].instance_id], tokenizer, score=0.0),
    ]
    report = tmp_path / "validation.json"
    report.write_text(json.dumps({"summary": {}, "records": records}))
    save_jsonl(instances, tmp_path / "instances.jsonl")
    config = _fit_config(tmp_path, tiny_model_dir)
    out = tmp_path / "distilled.jsonl"
    main(["data", "distill", "--config", str(config), "--records", str(report), "--instances",
          str(tmp_path / "instances.jsonl"), "--out", str(out), "--min-accuracy", "0.5"])
    demos = load_demonstrations(out)
    assert "kept 5 of 6 recorded turns (dropped: 1 failed call)" in capsys.readouterr().out
    assert [(d.metadata["instance_id"], d.metadata["chunk_index"]) for d in demos] == [
        (instances[0].instance_id, 0), (instances[0].instance_id, 1), (instances[0].instance_id, 2),
        (instances[1].instance_id, 0), (instances[1].instance_id, 2),
    ]
    # the failed turn stored nothing, so chunk 2's prompt shows less memory than the oracle's did
    assert demos[3].messages == oracle[instances[1].instance_id][0].messages
    assert demos[4].messages != oracle[instances[1].instance_id][2].messages

    records[0]["memory"].pop("seed")
    report.write_text(json.dumps({"summary": {}, "records": records}))
    with pytest.raises(SystemExit) as info:
        main(["data", "distill", "--config", str(config), "--records", str(report), "--instances",
              str(tmp_path / "instances.jsonl"), "--out", str(out)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert str(report) in err and "record 0" in err and "memory.seed" in err
    assert len(load_demonstrations(out)) == 5  # the failed run left the previous file intact


def test_distill_command_reads_the_official_recorded_layout(tmp_path, tiny_model_dir, capsys):
    """The official Mem-α-4B turns (✿FUNCTION✿ calls) become hermes demonstrations; turns with a
    call cut off mid-argument are dropped. The fixture has no instances, so the test writes
    stand-in chunks under the recorded instance ids (the prompts show them; the calls do not
    depend on them)."""
    from memalpha.cli import main

    turns = [json.loads(line) for line in OFFICIAL.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = sorted({t["instance_id"] for t in turns})
    chunks = 1 + max(t["chunk_idx"] for t in turns)
    instances = [
        Instance(i, "pubmed-rct", [f"Stand-in chunk {c} of {i}." for c in range(chunks)],
                 [QA("Which label?", "1")], {})
        for i in ids
    ]
    save_jsonl(instances, tmp_path / "instances.jsonl")
    config = yaml.safe_load(_fit_config(tmp_path, tiny_model_dir).read_text())
    config["model"]["rollout"].update(max_new_tokens=8192, max_prompt_tokens=32768, memory_view_k=2)
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "official.jsonl"
    main(["data", "distill", "--config", str(tmp_path / "fit.yaml"), "--official-responses", str(OFFICIAL),
          "--instances", str(tmp_path / "instances.jsonl"), "--out", str(out)])
    complete = [t for t in turns if t["calls"] and all(c["arguments_complete_json"] for c in t["calls"])]
    demos = load_demonstrations(out)
    assert len(demos) == len(complete) > 0
    assert f"kept {len(complete)} of {len(turns)} recorded turns" in capsys.readouterr().out
    hermes = get_call_format("hermes")
    for demo in demos:
        assert "✿FUNCTION✿" not in demo.response
        parsed = hermes.parse(demo.response)
        assert parsed.calls and not parsed.errors
        assert demo.metadata["source"] == "official"

    with pytest.raises(SystemExit) as info:
        main(
            [
                "data", "distill", "--config", str(tmp_path / "fit.yaml"), "--official-responses",
                str(OFFICIAL), "--out", str(out),
            ]
        )
    assert info.value.code == 2
    assert "needs --instances" in capsys.readouterr().err
