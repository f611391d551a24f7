"""The record every GPU result carries (experiments/lab/memalpha_lab/gpu_record.py and its parts), checked on
the CPU:
the commit and the refusal of a dirty tree (with git, and from a stamp where the copy has no .git),
the phase peaks sampled while a phase runs, the backend probe, and the CUDA/bitsandbytes line."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from memalpha_lab import backend_probe, cuda_match, gpu_record, phase_clock, tree_state

GIB = 2**30


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with two committed files (and no shared state file in the environment)."""
    monkeypatch.delenv(tree_state.STATE_ENV, raising=False)
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    (root / "a.py").write_text("x = 1\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_text("b\n")
    git(root, "add", "a.py", "sub/b.txt")
    git(root, "commit", "-q", "-m", "start")
    return root


# ----------------------------------------------------------------- tree


def test_a_clean_checkout_gives_its_commit(repo):
    state = tree_state.tree_state(repo)
    assert state["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert state["dirty"] is False and state["source"] == "git"
    assert tree_state.checked_state(repo=repo)["allow_dirty"] is False


def test_a_dirty_tree_is_refused_in_one_line_unless_allowed(repo):
    (repo / "a.py").write_text("x = 2\n")
    (repo / "untracked.txt").write_text("new\n")  # untracked: counted, not dirty by itself
    state = tree_state.tree_state(repo)
    assert state["dirty"] is True and state["changed"] == ["a.py"] and state["untracked"] == 1
    with pytest.raises(tree_state.DirtyTree) as refused:
        tree_state.checked_state(repo=repo)
    line = str(refused.value)
    assert "\n" not in line and "uncommitted changes" in line and "a.py" in line and "--allow-dirty" in line
    allowed = tree_state.checked_state(allow_dirty=True, repo=repo)
    assert allowed["allow_dirty"] is True and allowed["dirty"] is True


def test_the_check_command_exits_3_with_one_line_and_writes_the_state(repo, tmp_path, capsys):
    (repo / "sub" / "b.txt").write_text("changed\n")
    out = tmp_path / "state.json"
    assert tree_state.main(["--repo", str(repo), "check", "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sub/b.txt" in err
    assert json.loads(out.read_text())["dirty"] is True
    assert tree_state.main(["--repo", str(repo), "check", "--allow-dirty", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["allow_dirty"] is True


def test_runs_of_a_sequence_read_the_state_checked_at_its_start(repo, tmp_path, monkeypatch):
    out = tmp_path / "state.json"
    assert tree_state.main(["--repo", str(repo), "check", "--out", str(out)]) == 0
    (repo / "a.py").write_text("a result file written by an earlier stage\n")
    monkeypatch.setenv(tree_state.STATE_ENV, str(out))
    assert tree_state.checked_state(repo=repo)["dirty"] is False


def test_a_copy_without_git_is_checked_against_the_stamp(repo, tmp_path):
    stamp = tmp_path / "tree.json"
    assert tree_state.main(["--repo", str(repo), "stamp", "--out", str(stamp)]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    state = tree_state.tree_state(copy, stamp_path=stamp)
    assert state == {
        **state,
        "commit": git(repo, "rev-parse", "HEAD").strip(),
        "dirty": False,
        "source": "stamp",
    }
    (copy / "a.py").write_text("x = 3\n")
    (copy / "sub" / "b.txt").unlink()
    state = tree_state.tree_state(copy, stamp_path=stamp)
    assert state["dirty"] is True and state["changed"] == ["a.py", "sub/b.txt"]
    assert "uncommitted changes to 2 file(s)" in tree_state.refusal(state)


def test_a_tree_without_git_or_stamp_has_no_commit_and_is_refused(tmp_path):
    state = tree_state.tree_state(tmp_path, stamp_path=tmp_path / "missing.json")
    assert state["commit"] is None and state["source"] is None
    assert "commit of this tree is unknown" in tree_state.refusal(state)


def test_blob_hash_is_gits(repo):
    assert tree_state.blob_hash(repo / "a.py") == git(repo, "hash-object", "a.py").strip()


# --------------------------------------------------------------- phases


class FakeDevice:
    """A ``mem_get_info`` stand-in whose free memory the test sets; counts its readings."""

    def __init__(self, free_gib: float, total_gib: float = 80.0) -> None:
        self.free, self.total = int(free_gib * GIB), int(total_gib * GIB)
        self.reads = 0

    def __call__(self) -> tuple[int, int]:
        self.reads += 1
        return self.free, self.total

    def wait_reads(self, more: int, timeout_s: float = 5.0) -> None:
        target, deadline = self.reads + more, time.monotonic() + timeout_s
        while self.reads < target and time.monotonic() < deadline:
            time.sleep(0.001)
        assert self.reads >= target, "the poller did not read during the phase"


def test_the_poller_keeps_a_peak_reached_in_the_middle_of_a_phase():
    device = FakeDevice(free_gib=70)
    clock = phase_clock.PhaseClock(phase_clock.CudaView(read=device), interval_s=0.001)
    with clock.phase("reader"):
        device.wait_reads(2)
        device.free = int(20 * GIB)  # 60 GiB in use for a moment ...
        device.wait_reads(3)
        device.free = int(70 * GIB)  # ... and released before the phase ends
        device.wait_reads(2)
    entry = clock.entries[0]
    assert entry["phase"] == "reader" and entry["device_used_peak_gib"] == pytest.approx(60.0)
    assert entry["device_total_gib"] == pytest.approx(80.0) and entry["polls"] >= 5
    assert device() == (int(70 * GIB), int(80 * GIB))  # the end-of-phase reading alone would say 10 GiB


def test_each_phase_starts_its_peak_afresh_and_totals_add_up_per_name():
    device = FakeDevice(free_gib=50)
    clock = phase_clock.PhaseClock(phase_clock.CudaView(read=device), interval_s=0.001)
    clock.set_step(1)
    clock.enter("sampling")
    device.wait_reads(2)
    device.free = int(75 * GIB)
    clock.enter("reader")  # ends sampling
    device.wait_reads(2)
    clock.set_step(2)
    clock.enter("sampling")
    time.sleep(0.01)
    clock.end()
    assert [e["phase"] for e in clock.entries] == ["sampling", "reader", "sampling"]
    assert clock.entries[0]["device_used_peak_gib"] == pytest.approx(30.0)
    assert clock.entries[1]["device_used_peak_gib"] == pytest.approx(5.0)
    totals = clock.by_name()
    assert totals["sampling"]["runs"] == 2 and totals["sampling"]["device_used_peak_gib"] == pytest.approx(
        30.0
    )
    assert totals["sampling"]["seconds"] == pytest.approx(
        clock.entries[0]["seconds"] + clock.entries[2]["seconds"]
    )
    assert list(clock.by_name(step=2)) == ["sampling"]


def test_a_failed_phase_is_recorded_with_its_error():
    clock = phase_clock.PhaseClock(phase_clock.CudaView(read=None))
    with pytest.raises(RuntimeError), clock.phase("update"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore")
    entry = clock.entries[0]
    assert entry["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"
    assert entry["device_used_peak_gib"] is None and entry["peak_reserved_gib"] is None  # no GPU, no poller


# -------------------------------------------------------------- backends


def test_the_probe_records_announced_choices_and_captures_per_phase(monkeypatch):
    from memalpha.lm.sampling import graph_decode
    from memalpha.lm.sampling.backend import BackendChoice, announce

    def fake_decode(*args, stats=None, **kwargs):
        stats["captured"] = kwargs.get("capture", True)
        return [[1]], [False]

    monkeypatch.setattr(graph_decode, "decode_in_graph", fake_decode)
    phase = {"now": None}
    with backend_probe.BackendProbe(lambda: phase["now"]) as probe:
        announce(object(), BackendChoice("cuda-graph", "auto on cuda"), who="sampling")
        announce(object(), BackendChoice("hf-generate", "fold off"), who="reader")
        phase["now"] = "generate"  # a bench names its phase so: still the policy's sampling
        graph_decode.decode_in_graph("decoder", capture=True)
        graph_decode.decode_in_graph("decoder", capture=False)  # one batch fell back to eager
    assert graph_decode.decode_in_graph is fake_decode  # uninstalled
    summary = probe.summary()
    assert summary["sampling"] == {
        **summary["sampling"],
        "backend": "cuda-graph",
        "captured": False,
        "decode_calls": 2,
        "source": "announced",
    }
    assert summary["reader"] == {**summary["reader"], "backend": "hf-generate", "captured": False}
    assert logging.getLogger(backend_probe.LOGGER).handlers == []


def test_the_reader_backend_is_read_from_its_phase_when_not_announced(monkeypatch):
    from memalpha.lm.sampling import graph_decode

    def fake_decode(*args, stats=None, **kwargs):
        stats["captured"] = True

    monkeypatch.setattr(graph_decode, "decode_in_graph", fake_decode)
    with backend_probe.BackendProbe(lambda: "reader") as probe:
        graph_decode.decode_in_graph()
    reader = probe.summary()["reader"]
    assert reader["backend"] == "cuda-graph" and reader["captured"] is True and reader["source"] == "observed"
    assert probe.summary()["sampling"]["backend"] is None


# ---------------------------------------------------------------- record


def test_the_record_holds_every_field_with_cuda_fields_null_on_a_cpu(monkeypatch):
    monkeypatch.delenv(tree_state.STATE_ENV, raising=False)
    device = FakeDevice(free_gib=60)
    record = gpu_record.GpuRecord.start(allow_dirty=True, read=device, interval_s=0.001)
    from memalpha.lm.sampling.backend import BackendChoice

    with record:
        record.note_backend("sampling", BackendChoice("hf-generate", "named by rollout.backend"))
        with record.clock.phase("load"):
            device.wait_reads(2)
    data = json.loads(json.dumps(record.as_dict()))  # it is plain JSON
    for key in (
        "gpu",
        "commit",
        "dirty",
        "allow_dirty",
        "tree",
        "environment",
        "backends",
        "phases",
        "phase_totals",
    ):
        assert key in data
    assert data["allow_dirty"] is True and data["commit"] and len(data["commit"]) == 40
    env = data["environment"]
    for key in ("torch", "torch_cuda", "gpu", "gpu_memory_gib", "bitsandbytes", "transformers"):
        assert key in env
    import torch

    if not torch.cuda.is_available():
        assert data["gpu"] is None and env["torch_cuda"] is None
        assert data["phases"][0]["peak_allocated_gib"] is None
    assert data["phases"][0]["device_used_peak_gib"] == pytest.approx(20.0)
    assert data["backends"]["sampling"]["backend"] == "hf-generate"
    assert data["backends"]["sampling"]["captured"] is False and "reader" in data["backends"]


def test_a_record_refuses_to_start_on_a_dirty_tree(repo, monkeypatch):
    (repo / "a.py").write_text("changed\n")
    with pytest.raises(tree_state.DirtyTree):
        gpu_record.GpuRecord.start(repo=repo)
    assert gpu_record.GpuRecord.start(allow_dirty=True, repo=repo).as_dict()["dirty"] is True


# ----------------------------------------------------------- cuda check


@pytest.mark.parametrize(
    ("torch_cuda", "override", "code", "words"),
    [
        ("13.0", None, 0, "match: torch CUDA 13.0 -> libbitsandbytes_cuda130.so"),
        ("12.8", None, 1, "MISMATCH: torch CUDA 12.8 needs libbitsandbytes_cuda128.so"),
        ("12.8", "132", 0, "match: BNB_CUDA_VERSION=132"),
        (None, None, 2, "no CUDA build"),
    ],
)
def test_the_cuda_line_matches_torch_against_the_packed_libraries(
    tmp_path, torch_cuda, override, code, words
):
    for name in ("libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so", "libbitsandbytes_cpu.so"):
        (tmp_path / name).write_bytes(b"")
    got, line = cuda_match.verdict(torch_cuda, tmp_path, override)
    assert got == code and words in line and "\n" not in line
    if code == 1:
        assert "has only cuda130, cuda132" in line


def test_the_cuda_line_without_bitsandbytes():
    code, line = cuda_match.verdict("13.0", None)
    assert code == 2 and "not installed" in line


def test_threads_are_left_behind_by_no_phase():
    before = {t.name for t in threading.enumerate()}
    clock = phase_clock.PhaseClock(phase_clock.CudaView(read=FakeDevice(10)), interval_s=0.001)
    with clock.phase("x"):
        pass
    assert "mem-get-info-poller" not in {t.name for t in threading.enumerate()} - before


def test_the_check_command_reads_a_stamp_before_git_when_given_one(repo, tmp_path, capsys):
    stamp = tmp_path / "tree.json"
    assert tree_state.main(["--repo", str(repo), "stamp", "--out", str(stamp)]) == 0
    stamped = json.loads(stamp.read_text())["commit"]
    (repo / "a.py").write_text("x = 2\n")
    git(repo, "commit", "-q", "-am", "later")  # git now names another commit than the stamp
    out = tmp_path / "state.json"
    assert tree_state.main(["--repo", str(repo), "check", "--stamp", str(stamp), "--out", str(out)]) == 3
    assert "a.py" in capsys.readouterr().err  # the file differs from the stamped commit's
    git(repo, "checkout", "-q", "HEAD~1", "--", "a.py")
    assert tree_state.main(["--repo", str(repo), "check", "--stamp", str(stamp), "--out", str(out)]) == 0
    state = json.loads(out.read_text())
    assert state["commit"] == stamped and state["source"] == "stamp" and state["dirty"] is False
