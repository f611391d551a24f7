"""A killed ``memalpha validate`` resumes from its journal (memalpha/train/validation_journal.py):
the batches it finished are not run again and the report is the uninterrupted run's; a torn last
line is cut; a journal of other settings, other data or another format is refused in one line and
left as it was; a batch with a failed reader answer is not journaled; an adapter trained again in
the same folder is another agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_training import write_config

from memalpha.agent.rollout import RolloutOutput, RolloutRecord
from memalpha.cli import main
from memalpha.data.schema import QA, Instance
from memalpha.train.agent_digest import identified
from memalpha.train.module import GRPOModule
from memalpha.train.validation_journal import JOURNAL_FORMAT, ValidationJournal

BATCHES = 3
REPO = Path(__file__).resolve().parents[1]


class Killed(Exception):
    """Stands for the kill: raised as the batch after the finished ones starts."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir) -> dict:
    root = tmp_path_factory.mktemp("journal")
    config = write_config(root, tiny_model_dir)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"].update(limit_val_batches=None, enable_progress_bar=False)
    settings["data"]["synthetic"].update(val=BATCHES)
    settings["data"].update(val_batch_size=1)
    config.write_text(yaml.safe_dump(settings))
    return {"config": config, "logs": root / "run" / "tb"}


def validate(setup, version: str, *args: str) -> Path:
    main(["validate", "--config", str(setup["config"]), "--trainer.logger.init_args.version", version, *args])
    return setup["logs"] / version


def report(folder: Path) -> dict:
    """The report without its timings, which differ from run to run."""
    written = json.loads((folder / "validation.json").read_text())
    written["summary"].pop("seconds")
    return written


@pytest.fixture(scope="module")
def uninterrupted(setup) -> dict:
    folder = validate(setup, "whole")
    assert not (folder / "validation.partial.jsonl").exists()  # removed once the report is written
    return report(folder)


def run_killed_at(setup, monkeypatch, version: str, kill_at: int) -> Path:
    run = GRPOModule.validation_step

    def step(self, batch, batch_idx):
        if batch_idx == kill_at:
            raise Killed(f"killed as batch {batch_idx} starts")
        return run(self, batch, batch_idx)

    with monkeypatch.context() as patch:
        patch.setattr(GRPOModule, "validation_step", step)
        with pytest.raises(Killed):
            validate(setup, version)
    folder = setup["logs"] / version
    assert not (folder / "validation.json").exists()
    return folder / "validation.partial.jsonl"


def count_rollouts(monkeypatch) -> list[int]:
    from memalpha.agent.rollout import Agent

    calls: list[int] = []
    rollouts = Agent.rollouts

    def counted(self, batch, **kwargs):
        calls.append(len(batch))
        return rollouts(self, batch, **kwargs)

    monkeypatch.setattr(Agent, "rollouts", counted)
    return calls


def test_a_killed_validation_runs_only_the_batches_it_had_not_finished(setup, uninterrupted, monkeypatch):
    journal = run_killed_at(setup, monkeypatch, "killed", kill_at=2)
    lines = journal.read_text().splitlines()
    assert [json.loads(line)["batch"] for line in lines] == [0, 1]
    assert {json.loads(line)["format"] for line in lines} == {JOURNAL_FORMAT}

    calls = count_rollouts(monkeypatch)
    folder = validate(setup, "killed")
    assert calls == [1]  # batch 2 alone ran again
    assert report(folder) == uninterrupted  # every record and score as the run that was not killed
    assert not journal.exists()


def test_a_torn_last_line_is_cut_and_its_batch_runs_again(setup, uninterrupted, monkeypatch, caplog):
    journal = run_killed_at(setup, monkeypatch, "torn", kill_at=2)
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + lines[1][:40])  # killed while the second batch was appended

    calls = count_rollouts(monkeypatch)
    folder = validate(setup, "torn")
    assert calls == [1, 1]
    assert "dropped a torn last line" in caplog.text
    assert report(folder) == uninterrupted


def test_two_ddp_ranks_journal_apart_and_resume_to_the_uninterrupted_report(setup, tmp_path):
    """Each rank journals its own batches; a killed two-rank run resumes to the report of one that
    was not killed, and every rank's journal is removed."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")

    def ddp_validate(version: str, *extra: str) -> subprocess.CompletedProcess:
        cmd = [str(Path(sys.executable).with_name("memalpha")), "validate", "--config", str(setup["config"]),
               "--data.synthetic.val", "4", "--trainer.devices", "2", "--trainer.strategy", "ddp",
               "--trainer.logger.init_args.version", version, *extra]
        return subprocess.run(
            cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
        )

    whole = ddp_validate("ddp_whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    kill = ("--trainer.callbacks+=ddp_probe.KillAtBatch", "--trainer.callbacks.batch=1")
    killed = ddp_validate("ddp_killed", *kill)
    assert killed.returncode != 0 and "killed as validation batch 1 starts" in killed.stderr
    folder = setup["logs"] / "ddp_killed"
    journals = sorted(p.name for p in folder.glob("validation.partial*.jsonl"))
    assert journals == ["validation.partial.rank0.jsonl", "validation.partial.rank1.jsonl"]
    for name in journals:
        assert [json.loads(line)["batch"] for line in (folder / name).read_text().splitlines()] == [0]

    resumed = ddp_validate("ddp_killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 finished batches taken from" in resumed.stdout + resumed.stderr
    assert report(folder) == report(setup["logs"] / "ddp_whole")
    assert not list(folder.glob("validation.partial*"))


REFUSED = {
    "other_settings": (None, ("--model.seed", "5"), "line 1 was written by another adapter or with other"),
    "other_data": (None, ("--data.seed", "5"), "batch 0 was journaled with other instances than this run's"),
    "not_json": (b"hello\n", (), "line 1 is not a memalpha validation journal line"),
    "no_batch": (b'{"format": "memalpha.validation-batch/1", "agent": "AGENT"}\n', (),
                 "line 1 is not a memalpha validation journal line"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_journal_it_cannot_resume_is_refused_in_one_line_and_left_as_it_was(setup, monkeypatch, case):
    change, args, message = REFUSED[case]
    journal = run_killed_at(setup, monkeypatch, f"refused_{case}", kill_at=1)
    if change is not None:
        agent = json.loads(journal.read_text().splitlines()[0])["agent"]
        journal.write_bytes(change.replace(b"AGENT", agent.encode()))
    before = journal.read_bytes()
    calls = count_rollouts(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        validate(setup, f"refused_{case}", *args)
    text = str(stopped.value.code)
    assert text.startswith("memalpha validate: error: ") and message in text, text
    assert str(journal) in text and "nothing was changed" in text and "\n" not in text
    assert journal.read_bytes() == before
    if "other instances" not in message:
        assert calls == []  # refused before any batch ran


def record(instance_id: str, failures: int) -> RolloutRecord:
    return RolloutRecord(instance_id, "synth", 0, [], {}, 3, 10, [{"score": 1.0}], reader_failures=failures)


def test_a_batch_with_a_failed_reader_answer_is_not_journaled(tmp_path):
    batch = [Instance("a", "synth", ["x"], [QA("q", "a")]), Instance("b", "synth", ["y"], [QA("q", "b")])]
    journal = ValidationJournal(tmp_path / "validation.partial.jsonl", "agent")
    for index, failures in enumerate([0, 1]):
        journal.append(index, batch, RolloutOutput([], [record("a", 0), record("b", failures)], 1.0, 2.0, 0))
    journal.close()
    again = ValidationJournal(tmp_path / "validation.partial.jsonl", "agent")
    assert sorted(again.batches) == [0]
    assert again.resumed(1, batch) is None
    resumed = again.resumed(0, batch)
    assert [r.instance_id for r in resumed.records] == ["a", "b"]
    assert (resumed.rollout_s, resumed.reader_s) == (1.0, 2.0)


def test_an_adapter_trained_again_in_the_same_folder_is_another_agent(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    first = identified(str(adapter))
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")
    assert identified(str(adapter))[0] == first[0] and identified(str(adapter)) != first
    assert identified(str(tmp_path / "missing")) == [str(tmp_path / "missing")]
