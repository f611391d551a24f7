"""experiments/bench/bench_length.py run as a script on a tiny random model: every length validated by
`memalpha validate` in a process of its own (peak RSS, CPU seconds, prompt tokens, answers by evidence
third), the memories answered again under a reader variant, and its bad command lines refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def bench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "experiments" / "bench" / "bench_length.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("bench_length")
    adapter = folder / "adapter"
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"),
    )
    model.save_pretrained(adapter)
    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    config["model"]["model"] = tiny_model_dir
    config["model"]["rollout"]["max_new_tokens"] = 8
    config["model"]["reader"]["max_new_tokens"] = 4
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(folder / "runs")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder, adapter


def test_each_length_is_validated_in_its_own_process_and_answered_again(tiny_setup):
    """Started from the run's own folder with relative paths: the validations run in the repository
    root, and their reports must still land in ``--run-dir`` as given."""
    folder, adapter = tiny_setup
    out = folder / "bench_length.json"
    sizes = ("--adapter", adapter.name, "--config", "config.yaml", "--lengths", "1,3",
             "--instances", "2", "--questions", "2", "--run-dir", "run")
    done = bench(
        *sizes,
        "--out",
        out.name,
        "--reader-variant",
        "unit=sentence,top_k_entries=3",
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [row["chunks"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["instances"] == 2 and row["turns"] == 2 * row["chunks"] and row["questions"] == 4
        assert row["peak_rss_bytes"] > 0 and row["cpu_s"] > 0 and row["policy_cpu_s"] > 0
        assert 0 < row["prompt_tokens_max"] <= row["prompt_budget"] and row["prompts_over_budget"] == 0
        assert sum(part["questions"] for part in row["by_third"].values()) == 4
    assert result["rows"][0]["by_third"]["middle"]["questions"] == 4  # one chunk: its middle is the middle
    assert set(result["reader_variants"]) == {"unit=sentence,top_k_entries=3"}
    assert set(result["reader_variants"]["unit=sentence,top_k_entries=3"]) == {"1", "3"}
    assert out.with_suffix(".png").is_file() and (folder / "run" / "validate" / "chunks3").is_dir()
    # --reuse keeps both reports and measures nothing again
    again = bench(*sizes, "--out", "again.json", "--reuse", cwd=folder)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((folder / "again.json").read_text())["rows"][1]["cpu_s"] == result["rows"][1]["cpu_s"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "2,x"], "--lengths must be comma-separated integers"),
        (["--adapter", "configs"], "--adapter configs is not an adapter folder"),
        (["--reader-variant", "unit=word"], "--reader-variant: "),
        (["--reader-variant", "top_k"], "is not FIELD=VALUE"),
    ],
)
def test_a_bad_command_line_is_one_line(args, message):
    done = bench(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr

