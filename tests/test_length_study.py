"""The pre-registered length study (experiments/studies/length_study.py,
experiments/lab/memalpha_lab/length_report.py):
the per-instance values it reads off a validation (the extractive reader from the final memory, stored
answers, scores by where the evidence sits), the primary comparison at the longest length against a
hand-computed t interval, each arm's change with length, and the script run as its command line over a
run folder whose every stage of one seed is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_decisive import T4, study

from memalpha.reader.options import RetrievalSettings
from memalpha_lab.length_report import drops, length_values, rebuild, third
from memalpha_lab.length_report import main as report_main
from memalpha_lab.run_state import claimed, lost, restore, save

REPO = Path(__file__).resolve().parent.parent


def record(
    instance: str, memory: list[str], questions: list[dict], chunks: int, source: str = "synth_personal"
):
    """A validation record of one rollout: ``memory`` its semantic entries."""
    return {
        "data_source": source,
        "instance_id": instance,
        "memory_tokens": 10,
        "chunk_tokens": 100,
        "r3": 0.0,
        "turns": [{"results": [{"status": "success"}], "reward": 0.0} for _ in range(chunks)],
        "questions": questions,
        "fact_recall": 0.5,
        "memory": {"core": "", "semantic": [{"id": "x", "content": c} for c in memory], "episodic": []},
    }


def test_thirds_of_an_input():
    assert [third(c, 2) for c in range(2)] == ["first", "last"]
    assert [third(c, 32) for c in (0, 10, 11, 20, 21, 31)] == [
        "first",
        "first",
        "middle",
        "middle",
        "last",
        "last",
    ]


def test_length_values_read_the_memory_with_the_extractive_reader_and_split_by_evidence():
    questions = [
        {
            "question": "Which city did Ada Lind move to?",
            "gold": "Lisbon",
            "score": 0.0,
            "stored": True,
            "evidence_chunk": 0,
        },
        {
            "question": "What is Ada Lind's favourite dish?",
            "gold": "laksa",
            "score": 1.0,
            "stored": True,
            "evidence_chunk": 5,
        },
        {
            "question": "Which instrument is Bo Park learning?",
            "gold": "cello",
            "score": 0.0,
            "stored": False,
            "evidence_chunk": 7,
        },
    ]
    memory = [
        "Ada Lind told me they moved to Lisbon.",
        "Ada Lind says their favourite dish is laksa.",
        "Bo Park has started taking drum lessons.",
    ]
    values = length_values([record("a", memory, questions, chunks=8)], RetrievalSettings(top_k_entries=1))
    mine = values["synth_personal"]["a"]
    assert mine["accuracy"] == pytest.approx(1 / 3)
    assert mine["extractive_accuracy"] == pytest.approx(2 / 3)  # the two stored answers are retrieved first
    assert mine["stored"] == pytest.approx(2 / 3) and mine["stored_accuracy"] == 0.5
    assert mine["accuracy_first"] == 0.0 and mine["stored_first"] == 1.0  # chunk 0 of 8
    assert "accuracy_middle" not in mine  # no question's evidence is in chunks 3-4
    assert mine["accuracy_last"] == 0.5 and mine["stored_last"] == 0.5  # chunks 5 and 7
    assert mine["memory_share"] == 0.1


def run(recall: list[float], accuracy: float = 0.5, share: float = 0.3) -> dict:
    return {
        "synth_personal": {
            f"i{k}": {
                "fact_recall": v,
                "accuracy": accuracy,
                "extractive_accuracy": accuracy,
                "tool_success": 1.0,
                "memory_share": share,
            }
            for k, v in enumerate(recall)
        }
    }


def scores(changes: list[float], short_recall: float = 0.8) -> dict:
    """Seed s: at 32 chunks A holds ``changes[s]`` more fact recall than B on both instances; at 2 chunks
    both arms hold ``short_recall``."""
    base = [0.25, 0.5]
    long = {
        "start": run(base),
        "seeds": {
            str(s): {"grpo": run([b + c for b in base]), "sft_continued": run(base)}
            for s, c in enumerate(changes)
        },
    }
    short = {
        "start": run([short_recall] * 2),
        "seeds": {
            str(s): {"grpo": run([short_recall] * 2), "sft_continued": run([short_recall] * 2)}
            for s in range(len(changes))
        },
    }
    return {"lengths": {"2": short, "8": short, "32": long}}


def test_the_verdict_reads_fact_recall_at_the_longest_length():
    changes = [0.1, 0.2, 0.05, 0.15, 0.1]
    rebuilt = rebuild(scores(changes), [0, 1, 2, 3, 4])
    decision = rebuilt["decision"]
    mean = sum(changes) / 5
    sd = (sum((c - mean) ** 2 for c in changes) / 4) ** 0.5
    assert decision["metric"] == "fact_recall" and decision["length"] == 32
    assert decision["t_over_seeds"]["mean"] == pytest.approx(mean)
    assert decision["t_over_seeds"]["high"] - mean == pytest.approx(T4 * sd / 5**0.5)
    assert decision["verdict"] == "GRPO beats"
    assert rebuild(scores(changes[:4]), [0, 1, 2, 3, 4])["decision"]["verdict"] == "pending"
    copying = scores(changes)
    for arms in copying["lengths"]["32"]["seeds"].values():
        arms["grpo"] = run([0.9, 0.9], share=0.7)  # a policy that copies its input fails the guard
    assert rebuild(copying, [0, 1, 2, 3, 4])["decision"]["verdict"] == "not shown"


def test_each_arms_change_with_length_is_taken_per_seed_then_over_seeds():
    changes = [0.1, 0.2, 0.05, 0.15, 0.1]
    found = drops(scores(changes)["lengths"])
    assert found["lengths"] == [2, 32] and found["seeds"] == [0, 1, 2, 3, 4]
    # B at 32: mean of 0.25 and 0.5; at 2: 0.8. A: the same plus each seed's change
    assert found["fact_recall"]["sft_continued"]["mean"] == pytest.approx(0.375 - 0.8)
    assert found["fact_recall"]["grpo"]["mean"] == pytest.approx(0.375 - 0.8 + sum(changes) / 5)
    assert found["fact_recall"]["grpo - sft_continued"]["mean"] == pytest.approx(sum(changes) / 5)
    assert found["fact_recall"]["start"] == pytest.approx(0.375 - 0.8)
    assert found["accuracy"]["grpo - sft_continued"]["mean"] == pytest.approx(0.0)


def done_folder(run: Path, lengths: tuple[int, ...], runs: tuple[str, ...]) -> None:
    """A length study's run folder whose start and ``runs`` are trained and validated at ``lengths``."""
    questions = [
        {
            "question": "Which city did Ada Lind move to?",
            "gold": "Lisbon",
            "score": 1.0,
            "stored": True,
            "evidence_chunk": 0,
        }
    ]
    (run / "demos").mkdir(parents=True)
    (run / "demos" / "val.jsonl").write_text("")
    (run / "sft" / "start").mkdir(parents=True)
    for name in ("sft/adapter", *(f"arms/{r}/adapter" for r in runs)):
        (run / name).mkdir(parents=True)
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            (run / name / file).write_text("")
    for n in lengths:
        for name in ("start", *runs):
            folder = run / f"validate_chunks{n}" / name
            folder.mkdir(parents=True)
            report = {"records": [record("a", ["Ada Lind moved to Lisbon."], questions, chunks=n)]}
            (folder / "validation.json").write_text(json.dumps(report))


def test_a_run_whose_stages_are_done_writes_the_plans_configs_and_a_pending_verdict(tmp_path):
    run = tmp_path.resolve() / "run"
    done_folder(run, (2, 8, 32), ("seed3_grpo", "seed3_sft_continued"))
    (run / "compute").mkdir()
    (run / "compute" / "fit_seed3_grpo.json").write_text(
        json.dumps([{"wall_s": 900.0, "cpu_s": 1200.5, "finished": True, "ended": "t"}])
    )
    out = tmp_path / "results" / "length_study.json"
    done = study("length_study.py", "--reuse", "--seeds", "3", "--run-dir", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not (run / "logs").exists()  # no memalpha command ran
    for n in (2, 8, 32):
        held_out = yaml.safe_load((run / f"validate_chunks{n}.yaml").read_text())
        assert held_out["data"]["seed"] == 5900 and held_out["data"]["synthetic"]["val"] == 64
        assert (
            held_out["data"]["synthetic"]["chunks"] == n
            and held_out["data"]["synthetic"]["evidence"] == "spread"
        )
        assert held_out["trainer"]["logger"]["init_args"]["name"] == f"validate_chunks{n}"
    arm_a = yaml.safe_load((run / "seed3_grpo.yaml").read_text())
    assert arm_a["data"]["seed"] == 5913 and arm_a["data"]["synthetic"]["chunks"] == 2  # trained short
    arm_b = yaml.safe_load((run / "seed3_sft_continued.yaml").read_text())
    assert arm_b["trainer"]["callbacks"][-1]["init_args"] == {"seconds": 1200.5}
    summary = json.loads(out.read_text())
    assert summary["decision"]["verdict"] == "pending" and summary["decision"]["length"] == 32
    assert summary["settings"]["lengths"] == [2, 8, 32] and summary["settings"]["val_data_seed"] == 5900
    scores = json.loads((out.parent / "length_study" / "instance_scores.json").read_text())
    assert set(scores["lengths"]) == {"2", "8", "32"}
    assert scores["lengths"]["32"]["seeds"]["3"]["grpo"]["synth_personal"]["a"]["extractive_accuracy"] == 1.0
    assert "verdict" in done.stdout


def test_a_restored_run_trains_nothing_it_holds_and_leaves_a_claimed_validation_to_its_holder(tmp_path):
    """Laid back on a new machine (memalpha_lab.run_state, the arms' weights left behind; the start's
    trained again, as the study does first), a run whose stages are done but the start's 8-chunk
    validation counts its arms as trained and trains nothing; that validation, held by another
    process, is left to it."""
    run = tmp_path.resolve() / "run"
    done_folder(run, (2, 8, 32), ("seed3_grpo", "seed3_sft_continued"))
    (run / "compute").mkdir()
    (run / "compute" / "fit_seed3_grpo.json").write_text(
        json.dumps([{"wall_s": 900.0, "cpu_s": 1200.5, "finished": True, "ended": "t"}])
    )
    (run / "validate_chunks8" / "start" / "validation.json").unlink()
    (run / "sft" / "start" / "hparams.yaml").write_text("{}\n")  # a training's folder is never empty
    save(run, tmp_path / "state")
    new = tmp_path.resolve() / "new"
    restore(tmp_path / "state", new)
    assert lost(new, new / "arms" / "seed3_grpo" / "adapter")
    (new / "sft" / "adapter" / "adapter_model.safetensors").write_text("")  # the start trained again
    out = tmp_path / "results" / "length_study.json"
    with claimed(new / "validate_chunks8" / "start.lock"):
        done = study("length_study.py", "--reuse", "--seeds", "3", "--run-dir", str(new), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "validate_chunks8/start: another process is validating it; going on" in done.stdout
    assert not (new / "logs").exists()  # no memalpha command ran: nothing trained or validated
    assert {"seed3_grpo", "seed3_sft_continued"} <= set(json.loads(out.read_text())["runs"])


def test_the_committed_summary_is_rebuilt_from_the_committed_scores(capsys):
    """experiments/results/length_study.json (the verdict) from .../length_study/instance_scores.json."""
    assert report_main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt numbers match" in out and "optimiser steps" in out
    verdict = json.loads((REPO / "experiments/results/length_study.json").read_text())["decision"]["verdict"]
    line = next(x for x in out.splitlines() if x.startswith("verdict ("))
    assert line.startswith(
        "verdict (grpo - sft_continued, fact_recall at 32 chunks, t over seeds [0, 1, 2, 3, 4] of"
    )
    assert line.endswith(f"): {verdict}") and verdict != "pending"
