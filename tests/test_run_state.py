"""A study's run state carried to a new machine (experiments/lab/memalpha_lab/run_state.py): what is saved
and what is left behind, the recorded adapters counting as trained, an adapter trained again installed only
when it equals the recorded one (a lost start trained again for real on the tiny model), a claim another
process holds, and the product commit a study is pinned to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_sft import _sft_config, demo_file  # noqa: F401  (the fixture)

from memalpha.cli import main
from memalpha_lab.run_state import (
    DIGESTS,
    MAX_FILE_BYTES,
    RunStateError,
    adapter_files,
    check_product,
    claimed,
    exported,
    forget,
    install,
    lost,
    rebuild,
    recorded,
    restore,
    save,
    trained,
)


def adapter(folder: Path, weights: bytes = b"w") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def run_folder(run: Path) -> Path:
    """A study's folder: the start and seed 0's A trained and validated, B's SFT running, a checkpoint."""
    adapter(run / "sft" / "adapter")
    (run / "sft" / "start").mkdir()
    (run / "sft" / "start" / "events.out").write_bytes(b"e")
    adapter(run / "arms" / "seed0_grpo" / "adapter", b"a")
    (run / "arms" / "seed0_grpo" / "events.out").write_bytes(b"e")
    (run / "arms" / "seed0_sft_continued").mkdir(parents=True)
    (run / "arms" / "seed0_sft_continued" / "events.out").write_bytes(b"b")
    (run / "checkpoints" / "seed0_grpo").mkdir(parents=True)
    (run / "checkpoints" / "seed0_grpo" / "last.ckpt").write_bytes(b"c")
    (run / "compute").mkdir()
    (run / "compute" / "fit_seed0_grpo.json").write_text("[]")
    (run / "compute" / "sft_seed0_sft_continued.running").write_text("")
    (run / "compute" / "validate_chunks8_seed0_grpo.running").write_text("")
    (run / "validate_chunks8" / "seed0_grpo").mkdir(parents=True)
    (run / "validate_chunks8" / "seed0_grpo" / "validation.partial.jsonl").write_text("{}\n")
    (run / "validate_chunks8" / "seed0_grpo.lock").write_text("")
    return run


def test_save_keeps_the_text_and_records_the_adapters_instead_of_their_weights(tmp_path):
    run = run_folder(tmp_path / "run")
    assert save(run, tmp_path / "state") == 7
    kept = {
        p.relative_to(tmp_path / "state").as_posix() for p in (tmp_path / "state").rglob("*") if p.is_file()
    }
    assert kept == {
        "sft/start/events.out",
        "arms/seed0_grpo/events.out",
        "compute/fit_seed0_grpo.json",
        "sft/adapter/adapter_config.json",
        "arms/seed0_grpo/adapter/adapter_config.json",
        "compute/validate_chunks8_seed0_grpo.running",
        "validate_chunks8/seed0_grpo/validation.partial.jsonl",
        DIGESTS,
    }  # of an adapter its config alone; no checkpoint or lock; nothing of B's SFT under way (it restarts)
    digests = recorded(tmp_path / "state")
    assert set(digests) == {"sft/adapter", "arms/seed0_grpo/adapter"}
    assert digests["arms/seed0_grpo/adapter"] == adapter_files(run / "arms" / "seed0_grpo" / "adapter")
    (run / "compute" / "fit_seed0_grpo.json").unlink()
    save(run, tmp_path / "state")  # replaced whole: a file gone from the run is gone from the state
    assert not (tmp_path / "state" / "compute" / "fit_seed0_grpo.json").exists()


def test_a_restored_folder_counts_its_recorded_adapters_as_trained_but_lost(tmp_path):
    save(run_folder(tmp_path / "run"), tmp_path / "state")
    new = tmp_path / "new"
    assert restore(tmp_path / "state", new) == 7
    grpo = new / "arms" / "seed0_grpo" / "adapter"
    assert trained(new, grpo) and lost(new, grpo) and not exported(grpo)
    assert not trained(new, new / "arms" / "seed0_sft_continued" / "adapter")
    (new / "compute" / "fit_seed0_grpo.json").write_text("[1]")
    assert restore(tmp_path / "state", new) == 0  # a file the run holds is never overwritten
    assert (new / "compute" / "fit_seed0_grpo.json").read_text() == "[1]"
    forget(new, grpo)
    assert not trained(new, grpo) and "sft/adapter" in recorded(new)


def test_install_takes_only_the_recorded_adapter(tmp_path):
    run = tmp_path / "run"
    original = adapter(run / "arms" / "seed0_grpo" / "adapter", b"a")
    save(run, tmp_path / "state")
    new = tmp_path / "new"
    restore(tmp_path / "state", new)
    target = new / "arms" / "seed0_grpo" / "adapter"
    with pytest.raises(RunStateError, match=r"differs from the recorded one in adapter_model.safetensors"):
        install(new, target, adapter(tmp_path / "other", b"b"))
    assert not exported(target)  # nothing installed
    install(new, target, original)
    assert exported(target) and adapter_files(target) == adapter_files(original)


def test_a_file_too_large_for_a_run_state_stops_the_save_naming_it(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    with open(run / "logs" / "big.log", "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(RunStateError, match=r"logs/big.log is 8 MiB, too large .* nothing was saved"):
        save(run, tmp_path / "state")
    assert not (tmp_path / "state").exists()


def test_a_claim_is_refused_while_another_open_file_holds_it(tmp_path):
    with claimed(tmp_path / "v" / "start.lock") as mine:
        assert mine
        with claimed(tmp_path / "v" / "start.lock") as again:
            assert not again  # flock: a second open file is refused while the first holds it
    with claimed(tmp_path / "v" / "start.lock") as after:
        assert after  # released with the block


def test_a_lost_start_is_trained_again_and_installed_bit_for_bit(tmp_path, tiny_model_dir, demo_file):  # noqa: F811
    """The real SFT of the tiny model, saved, its folder gone as on a new machine, restored, and trained
    again from its own config: the adapter equals the recorded one file for file and is put back."""
    run = tmp_path.resolve() / "run"
    config = yaml.safe_load(_sft_config(tmp_path, tiny_model_dir, demo_file, max_steps=2).read_text())
    config["model"]["export_adapter_dir"] = str(run / "sft" / "adapter")
    config["trainer"]["logger"]["init_args"].update(save_dir=str(run), name="sft", version="start")
    config["trainer"]["enable_checkpointing"] = False
    config["trainer"]["callbacks"] = []
    (run / "logs").mkdir(parents=True)
    (run / "sft.yaml").write_text(yaml.safe_dump(config))
    main(["sft", "--config", str(run / "sft.yaml")])  # in this process; trained again in another
    want = adapter_files(run / "sft" / "adapter")
    save(run, tmp_path / "state")
    for path in sorted(run.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    restore(tmp_path / "state", run)
    assert lost(run, run / "sft" / "adapter")
    trained_again = []

    def sft(config: Path, log: Path) -> None:  # the study runs `memalpha sft` in a child process
        trained_again.append(log)
        subprocess.run([sys.executable, "-m", "memalpha.cli", "sft", "--config", str(config)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    rebuild(run, run / "sft" / "adapter", run / "sft.yaml", sft)
    assert trained_again == [run / "logs" / "rebuild_sft.log"]
    assert exported(run / "sft" / "adapter") and adapter_files(run / "sft" / "adapter") == want
    assert not (run / "rebuild" / "sft").exists()  # the scratch training is gone
    assert json.loads((run / "compute" / "rebuild_sft.json").read_text())[0]["finished"]


def test_a_product_commit_is_refused_unless_the_checkout_holds_it(tmp_path):
    """--product-commit: memalpha/ and configs/ on disk must be that commit's, edits and new files
    included; what lies elsewhere does not matter."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    for path in ("memalpha/a.py", "configs/c.yaml", "docs/d.md"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("x\n")
    git("add", "-A")
    git("commit", "-q", "-m", "product")
    commit = git("rev-parse", "HEAD")
    (tmp_path / "docs" / "d.md").write_text("changed\n")
    check_product(commit, "study", tmp_path)
    (tmp_path / "configs" / "new.yaml").write_text("y\n")
    with pytest.raises(RunStateError, match=rf"^study: --product-commit {commit}: .* \(untracked files\)"):
        check_product(commit, "study", tmp_path)
    (tmp_path / "configs" / "new.yaml").unlink()
    (tmp_path / "memalpha" / "a.py").write_text("changed\n")
    with pytest.raises(RunStateError, match=r"memalpha/ and configs/ are not that commit's \(they differ\)"):
        check_product(commit, "study", tmp_path)
