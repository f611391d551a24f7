"""``memalpha data synth|inspect|convert``: through the installed command and through ``main()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memalpha.commands.data import main
from memalpha.data.loaders import load_instances, save_jsonl
from memalpha.data.synthetic import generate_synthetic
from memalpha.data.wrapping import parse_wrapped_chunk

FIXTURES = Path(__file__).parent / "fixtures" / "data"
MEMALPHA_BIN = Path(sys.executable).parent / "memalpha"


def _start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [str(MEMALPHA_BIN), "data", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_installed_command_synth_and_inspect(tmp_path):
    """The console script end to end (both commands run side by side to save start-up time)."""
    synth = _start(
        "synth", "--out", str(tmp_path / "synth"), "--num-train", "8", "--num-val", "4", "--seed", "3"
    )
    inspect = _start("inspect", str(FIXTURES / "memalpha_pubmed.parquet"))
    synth_out, synth_err = synth.communicate(timeout=120)
    inspect_out, inspect_err = inspect.communicate(timeout=120)

    assert synth.returncode == 0, synth_err
    assert "wrote 8 train instances" in synth_out and "wrote 4 validation instances" in synth_out
    for split, count in (("train", 8), ("validation", 4)):
        save_jsonl(generate_synthetic(count, split=split, seed=3), tmp_path / f"{split}.jsonl")
        assert (tmp_path / "synth" / f"{split}.jsonl").read_bytes() == (
            tmp_path / f"{split}.jsonl"
        ).read_bytes()

    assert inspect.returncode == 0, inspect_err
    lines = inspect_out.splitlines()
    assert "3 instances (layout memalpha; tokens: smollm2-135m-instruct)" in lines[0]
    assert lines[1].split() == [
        "data_source",
        "instances",
        "chunks/instance",
        "tokens/chunk",
        "questions/instance",
    ]
    row = lines[3].split()
    assert row[:2] == ["pubmed-rct", "3"] and " ".join(row[2:7]) == "10 / 10 / 10"
    assert " ".join(row[-5:]) == "100 / 100 / 100"
    low, median, high = int(row[7]), float(row[9]), int(row[11])
    assert 1000 < low <= median <= high < 2600  # the README: ~1.6k-token chunks


def test_inspect_a_synth_folder_prints_each_file(tmp_path, capsys):
    main(["synth", "--out", str(tmp_path), "--num-train", "4", "--num-val", "2", "--num-chunks", "3"])
    capsys.readouterr()
    main(["inspect", str(tmp_path), "--tokenizer", "none"])
    out = capsys.readouterr().out
    assert (
        f"{tmp_path / 'train.jsonl'}: 4 instances" in out
        and f"{tmp_path / 'validation.jsonl'}: 2 instances" in out
    )
    for family in ("synth_icl", "synth_personal", "synth_summary", "synth_timeline"):
        assert family in out
    assert out.count("\nall ") == 2 and "3 / 3 / 3" in out and "tokens: white-space words" in out


def test_convert_memoryagentbench_to_our_jsonl(tmp_path, embedded_model_dir, capsys):
    context = " ".join(f"On day {i} the lighthouse keeper logged {i * 7} ships." for i in range(200))
    record = {"context": context, "questions": ["How many ships on day 3?"], "answers": [["21"]],
              "metadata": {"source": "eventqa"}}
    source = tmp_path / "mab.jsonl"
    source.write_text(json.dumps(record) + "\n")
    out = tmp_path / "out" / "mab_ours.jsonl"
    main(["convert", str(source), str(out), "--tokenizer", str(embedded_model_dir), "--chunk-tokens", "512",
          "--wrap", "dialogue"])
    assert "wrote 1 instances (memoryagentbench layout)" in capsys.readouterr().out
    (instance,), _ = load_instances(out, layout="jsonl")
    assert instance.instance_id == "eventqa-0" and len(instance.chunks) > 1
    assert "".join(parse_wrapped_chunk(c).text for c in instance.chunks) == context


def test_convert_official_parquet(tmp_path):
    out = tmp_path / "pubmed.jsonl"
    main(["convert", str(FIXTURES / "memalpha_pubmed.parquet"), str(out), "--limit", "2"])
    assert load_instances(out)[0] == load_instances(FIXTURES / "memalpha_pubmed.parquet", limit=2)[0]


def test_bad_input_exits_2_with_file_record_field(tmp_path, capsys):
    bad = FIXTURES / "malformed" / "missing_field.jsonl"
    with pytest.raises(SystemExit) as info:
        main(["convert", str(bad), str(tmp_path / "x.jsonl")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{bad}: record 1 (instance_id='inst-1'): field 'data_source': missing field" in err
    assert not (tmp_path / "x.jsonl").exists()
    main(["convert", str(bad), str(tmp_path / "x.jsonl"), "--skip-bad"])
    out = capsys.readouterr().out
    assert "wrote 2 instances" in out and "skipped 1 bad records" in out and "field 'data_source'" in out
    with pytest.raises(SystemExit) as info:
        main(["synth", "--out", str(tmp_path), "--families", "synth_poetry"])
    assert info.value.code == 2


def test_every_data_command_goes_through_one_module_and_synth_starts_without_lightning(tmp_path, capsys):
    """``memalpha data`` is :mod:`memalpha.commands.data` for all five commands; ``demos`` and
    ``distill`` (and with them Lightning) are imported only when they run."""
    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys; from memalpha.cli import main; "
        "main(['data', 'synth', '--out', sys.argv[1], '--num-train', '1', '--num-val', '1']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'memalpha') "
        "and m.split('.')[:2] in (['lightning'], ['memalpha', 'train'], ['memalpha', 'agent'])))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "{synth,inspect,convert,demos,distill,answers}" in capsys.readouterr().out
    for command in ("demos", "answers"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0 and f"memalpha data {command}" in capsys.readouterr().out


def test_data_demos_reads_the_config_as_fit_does_its_profile_first(tmp_path, tiny_model_dir):
    """``memalpha_official.yaml`` names the official profile, which states 80 % of the reply cap to the
    agent (``rollout.stated_limit_share: 0.8``): its demonstrations must state what training will."""
    import yaml

    official = Path(__file__).resolve().parents[1] / "configs" / "memalpha_official.yaml"
    config = yaml.safe_load(official.read_text())
    config["model"]["model"] = tiny_model_dir
    config["model"]["rollout"]["max_new_tokens"] = 1000
    config["data"]["synthetic"] = {"chunks": 1, "questions": 1, "chunk_words": 20}
    path = tmp_path / "official.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "demos.jsonl"
    main(["demos", "--config", str(path), "--out", str(out), "--count", "1"])
    (demo,) = [json.loads(line) for line in out.read_text().splitlines()]
    stated = demo["messages"][-1]["content"]
    assert "at most 800 tokens" in stated and "at most 1000 tokens" not in stated
