"""``--ckpt_path`` and the settings a user names (memalpha/train/lightning_cli.py, ``_parse_ckpt_path``).

A checkpoint holds the ``model.*`` settings of the run that wrote it. A setting the command line, a
``--config`` file or an explicitly chosen profile names wins over the saved one; every other setting
is the checkpoint's. The settings that decide what the saved weights are (the base model, the adapter
the run started from, the LoRA shape and scale; for a resumed ``fit`` the optimiser too) cannot be
changed: naming another value stops the run in one line, naming both values, before any model loads.
All on the tiny fit of tests/conftest.py (LoRA r 8, ``rollout.max_new_tokens`` 12, call format
hermes, local reader).
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from memalpha.cli import run
from memalpha.lm.core.embedded import load_tokenizer


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Lightning writes its logs and the resolved config into the working folder."""
    monkeypatch.chdir(tmp_path)


def note(tmp_path):
    path = tmp_path / "note.txt"
    path.write_text("Ada lives in Lisbon. Her cat is called Pixel.", encoding="utf-8")
    return path


def test_predict_runs_the_settings_named_on_the_command_line_and_in_a_config(tiny_fit_run, tiny_model_dir,
                                                                             tmp_path):
    config = tmp_path / "reader.yaml"
    config.write_text(yaml.safe_dump({"model": {"reader": {"kind": "extractive"}}}))
    text = note(tmp_path)
    cli = run(["predict", "--ckpt_path", str(tiny_fit_run["ckpt"]), "--config", str(config),
               "--model.rollout.max_new_tokens", "3", "--data.predict.path", str(text)])
    module = cli.model
    assert module.reader_settings.kind == "extractive"  # the config's, over the checkpoint's local reader
    assert module.rollout_settings.max_new_tokens == 3  # the command line's, over the checkpoint's 12
    # what neither names is the checkpoint's, not the default
    assert module.hparams.model == tiny_model_dir
    assert module.rollout_settings.call_format == "hermes" and module.reader_settings.max_new_tokens == 6
    (record,) = [json.loads(line) for line in (tmp_path / "note.predictions.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(module.hparams.model)
    (turn,) = record["turns"]
    assert len(tokenizer(turn["response"], add_special_tokens=False)["input_ids"]) <= 3


def test_validate_runs_the_named_settings_and_a_named_profile(tiny_fit_run):
    cli = run(["validate", "--ckpt_path", str(tiny_fit_run["ckpt"]), "--profile", "official",
               "--model.reader.kind", "extractive", "--trainer.enable_progress_bar", "false",
               "--trainer.logger", "false", "--data.synthetic.val", "1", "--data.synthetic.chunks", "1",
               "--data.synthetic.questions", "1", "--data.synthetic.chunk_words", "20"])
    module = cli.model
    assert module.reader_settings.kind == "extractive"
    assert module.reward_settings.metric_style == "official"  # the named profile's, over the checkpoint's
    assert module.rollout_settings.max_new_tokens == 12 and module.update_settings.micro_batch_size == 3


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("memalpha.train.policy_module.load_policy", refuse)


@pytest.mark.parametrize(
    ("command", "option", "value", "saved"),
    [
        ("predict", "model.lora.r", "4", "8"),
        ("validate", "model.model", "smollm2-135m-instruct", None),
        ("predict", "model.adapter_path", "some/adapter", "None"),
        ("fit", "model.optimizer.name", "paged_adamw_8bit", "'adamw'"),
    ],
)
def test_a_setting_the_checkpoint_decides_stops_the_run_naming_both_values(
    tiny_fit_run, tiny_model_dir, tmp_path, no_model_loads, command, option, value, saved
):
    args = [command, "--ckpt_path", str(tiny_fit_run["ckpt"]), f"--{option}", value]
    if command == "predict":
        args += ["--data.predict.path", str(note(tmp_path))]
    with pytest.raises(SystemExit) as exit_info:
        run(args)
    message = str(exit_info.value.code)
    saved = saved or repr(tiny_model_dir)
    assert message.startswith(f"memalpha {command}: error: {option}: the checkpoint {tiny_fit_run['ckpt']} ")
    assert f"was trained with {saved} but the config or command line names " in message
    assert f"leave {option} out or set it to {saved}" in message and "\n" not in message


def test_naming_the_checkpoints_own_value_is_no_change(tiny_fit_run, tmp_path):
    out = tmp_path / "out.jsonl"
    cli = run(["predict", "--ckpt_path", str(tiny_fit_run["ckpt"]), "--model.lora.r", "8",
               "--data.predict.path", str(note(tmp_path)), "--data.predict.output", str(out)])
    assert cli.model.lora_settings.r == 8 and out.is_file()


def test_a_saved_setting_this_memalpha_lacks_is_one_line(tiny_fit_run, tmp_path, no_model_loads):
    checkpoint = torch.load(tiny_fit_run["ckpt"], weights_only=True)
    checkpoint["hyper_parameters"]["rollout"]["retired_knob"] = 1
    path = tmp_path / "old.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(SystemExit) as exit_info:
        run(["predict", "--ckpt_path", str(path), "--data.predict.path", str(note(tmp_path))])
    assert str(exit_info.value.code) == (
        f"memalpha predict: error: ckpt_path: {path} holds the setting model.rollout.retired_knob, "
        "which this memalpha does not have"
    )
