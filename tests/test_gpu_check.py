"""experiments/gpu/gpu_check.sh on the CPU: its stage limits fit one device call with room to rerun, its
stage logic (the CUDA line first, the tree check, each stage's limit, the summary, the packing into
$OUT) runs in a dry run and with a stage that outlives its limit, and it runs a real stage (the fit's
``--tiny`` form) as the device machine starts it: from a copy of the tracked files, no ``PYTHON``, the
``python3`` on the path, the copy and its ``experiments/lab/`` first on ``PYTHONPATH`` (what
``.device/env.sh`` sets
there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "gpu" / "gpu_check.sh"
CALL_S = 600  # one device call's limit
DEVICE_S = 15 * 60  # a session's device time
START_MACHINE_S = 120  # a machine's start, or a failed one, as the device notes give it (1 to 2 minutes)
TRANSFER_S = 60  # sending the tree and .device, bringing $OUT back


def run_check(root: Path, environment: dict[str, str], *args: str, timeout: int = 120):
    """``root``'s copy of the script, run from ``root`` with ``environment``."""
    return subprocess.run(
        ["bash", str(root / SCRIPT.relative_to(ROOT)), *args], cwd=root, env=environment,
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def check(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script run from this checkout with this interpreter as ``PYTHON``."""
    environment = {key: value for key, value in os.environ.items() if key != "OUT"}
    environment.update(PYTHON=sys.executable, **env)
    return run_check(ROOT, environment, *args)


def budget(**env: str) -> dict[str, list[int]]:
    """``--print-budget``'s rows (``env``: e.g. ``GPU_CHECK_STAGES``), each name's seconds in order."""
    rows: dict[str, list[int]] = {}
    for line in check("--print-budget", **env).stdout.splitlines():
        name, seconds = line.split("\t")
        rows.setdefault(name, []).append(int(seconds))
    return rows


ISSUE_57_CALLS = ("decode_compiled decode_hf_6144", "real_step")
"""Issue 57's run, one lease each, in its order, as docs/real_model.md gives it: both do not fit one
lease of 15 device-minutes (their limits, two starts and transfers add up to more)."""


@pytest.mark.parametrize("stages", [None, *ISSUE_57_CALLS])
def test_the_stage_limits_sum_under_the_budget_with_room_to_rerun(stages):
    """The default stages, and each lease of issue 57's run: one call after a failed start."""
    rows = budget(**({"GPU_CHECK_STAGES": stages} if stages else {}))
    names = [name for name in rows if name not in ("start", "pack", "total", "budget")]
    if stages is None:
        assert names[:2] == ["fit", "decode"]  # the decision-relevant stages first
    else:
        assert names == stages.split()
    total = rows["start"][0] + sum(rows[s][0] for s in names) + sum(rows["pack"])
    assert total == rows["total"][0] <= rows["budget"][0] <= 8 * 60
    assert total <= 0.8 * CALL_S  # well inside one call
    assert 2 * START_MACHINE_S + TRANSFER_S + total <= DEVICE_S  # a failed start, then a start and the run


def test_a_dry_run_goes_through_every_stage_and_packs_the_results(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    done = check("--dry-run", "--allow-dirty", OUT=str(out), GPU_CHECK_RESULTS=str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("cuda check: ")
    rows = [line.split("\t") for line in (results / "stages.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("fit", "0"), ("decode", "0"), ("nf4_gradients", "0")]
    assert "allow_dirty" in (results / "tree.json").read_text()
    named = check("--dry-run", "--allow-dirty", GPU_CHECK_RESULTS=str(tmp_path / "named"),
                  GPU_CHECK_STAGES=" ".join(ISSUE_57_CALLS))
    assert named.returncode == 0, named.stdout + named.stderr
    assert "--paths graph,hf-static --repeats 3" in named.stdout
    assert "--instances 4 --chunks 1 --chunk-tokens 2048" in named.stdout
    with tarfile.open(out / "gpu_results.tgz") as packed:
        assert "./stages.tsv" in packed.getnames()


def test_a_stage_past_its_limit_is_stopped_and_the_next_one_runs(tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    results = tmp_path / "results"
    done = check(
        "--allow-dirty",
        GPU_CHECK_RESULTS=str(results),
        GPU_CHECK_STAGES="decode decode",
        GPU_CHECK_DECODE_CMD=str(sleeper),
        GPU_CHECK_LIMITS="decode=1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in (results / "stages.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[1], r[3]) for r in rows] == [("decode", "124", "1"), ("decode", "124", "1")]
    assert all(int(r[2]) < 15 for r in rows)


def test_an_unknown_argument_or_stage_is_refused():
    assert check("--fast").returncode == 2
    assert check("--print-budget", GPU_CHECK_STAGES="fit nope").returncode != 0


def test_from_a_fresh_copy_the_check_runs_its_stages_from_the_repository_root(tmp_path):
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "repo"
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if key not in ("OUT", "PYTHON")}
    environment.update(
        PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=f"{copy}{os.pathsep}{copy / 'experiments' / 'lab'}",
        GPU_CHECK_STAGES="fit",
    )
    done = run_check(copy, environment, "--allow-dirty", "--tiny", timeout=600)  # a copy has no commit
    results = copy / "experiments" / "results" / "gpu"
    log = (results / "fit.log").read_text() if (results / "fit.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in (results / "stages.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("fit", "0")], done.stdout + log
    report = json.loads((results / "gpu_fit_check.json").read_text())
    assert report["status"] == "ok" and report["tiny"] is True and report["global_step"] == 2
    assert report["record"]["allow_dirty"] is True
