"""One settings loader (memalpha/train/settings_loader.py): every path reads a config with its profile,
and the rules between settings groups stop every path with the same line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_training import nonzero_adapter

from memalpha.agent.reward_settings import RewardSettings
from memalpha.inference.memory_agent import MemoryAgent
from memalpha.reader.settings import ReaderSettings
from memalpha.train.profiles import PROFILES
from memalpha.train.settings_loader import AgentLoadError, AgentSettings, load_config

OFFICIAL = Path(__file__).resolve().parents[1] / "configs" / "memalpha_official.yaml"
ARRIVE = {  # what the official profile sets and memalpha_official.yaml leaves to it
    "model.rollout.call_repair": "json_repair",
    "model.rollout.stated_limit_share": 0.8,
    "model.reader.temperature": 0.7,
    "model.update.loss_agg": "seq-mean-token-mean",
    "data.epochs": 5,
}


@pytest.fixture
def official(tmp_path, tiny_model_dir) -> Path:
    """memalpha_official.yaml on the tiny model, a local-free reader and this machine's CPU."""
    config = yaml.safe_load(OFFICIAL.read_text())
    config["model"]["model"] = tiny_model_dir
    config["model"]["reader"] = {"kind": "extractive"}
    config["model"]["reward"]["content_judge"] = "rule"
    config["trainer"].update(accelerator="cpu", devices=1, strategy="auto")
    path = tmp_path / "official.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def option(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def test_the_official_profile_sets_what_arrive_checks_and_its_config_leaves_it_so():
    config = yaml.safe_load(OFFICIAL.read_text())
    for key, value in ARRIVE.items():
        assert PROFILES["official"][key] == value
        with pytest.raises(KeyError):
            option(config, key)


@pytest.mark.parametrize("command", ["fit", "validate", "predict"])
def test_every_cli_command_gets_the_profiles_values(command, official, capsys):
    from memalpha.cli import main

    with pytest.raises(SystemExit) as info:
        main([command, "--config", str(official), "--print_config"])
    assert info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    for key, value in ARRIVE.items():
        assert option(printed, key) == value, key


def test_load_config_lays_profile_file_and_overrides_in_that_order(official):
    loaded = load_config(official)
    assert loaded.profile == "official"
    for key, value in ARRIVE.items():
        assert option(loaded.sections, key) == value, key
    agent = loaded.agent()
    assert agent.rollout.call_repair == "json_repair" and agent.rollout.stated_limit_share == 0.8
    assert agent.rollout.max_new_tokens == 2048  # the file's own value
    over = load_config(official, {"model.rollout.call_repair": "strict", "data.epochs": 2})
    assert over.agent().rollout.call_repair == "strict" and over.section("data")["epochs"] == 2
    plain = load_config(official, profile="memalpha")
    assert plain.agent().rollout.call_repair != "json_repair" and "epochs" not in plain.section("data")


def test_the_api_gets_the_profiles_values(official, tmp_path, tiny_model_dir):
    raw = MemoryAgent.baseline("raw_chunks", config=official)
    assert raw.settings.rollout.call_repair == "json_repair" and raw.settings.reader.kind == "extractive"
    agent = MemoryAgent.load(nonzero_adapter(tmp_path, tiny_model_dir), config=official)
    assert agent.settings.rollout.stated_limit_share == 0.8 and agent.settings.reward.content_judge == "rule"


def test_data_answers_reads_the_config_through_the_loader(official, tmp_path):
    from memalpha.commands.data import main

    with pytest.raises(SystemExit) as info:  # the official profile leaves the reader the file's: extractive
        main(["answers", "--config", str(official), "--memories", str(tmp_path / "none.jsonl"),
              "--out", str(tmp_path / "out.jsonl")])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: [1\n", "line 2, column 1: not valid YAML"),
        ("- a list\n", "expected a YAML mapping, got list"),
        ("profile: offical\n", "profile must be one of ['memalpha', 'official'], got 'offical'"),
        ("model: 3\n", "'model' must be a mapping"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(AgentLoadError) as info:
        load_config(path).agent()
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_an_override_must_be_an_option_key(tmp_path):
    with pytest.raises(AgentLoadError, match="override 'epochs': name an option key"):
        load_config(None, {"epochs": 2})


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"reader": {"kind": "engine"}}, "reader.kind: engine answers from the vLLM server of a run"),
        ({"reader": {"kind": "extractive"}, "reward": {"content_judge": "llm"}},
         "reward.content_judge: llm asks the reader"),
    ],
)
def test_the_rules_between_groups_live_on_the_settings_and_stop_every_path(layer, message, tmp_path,
                                                                           tiny_model_dir):
    from test_training import write_config

    from memalpha.cli import main

    kinds = {"reader": ReaderSettings, "reward": RewardSettings}
    with pytest.raises(ValueError, match=message):
        AgentSettings(tiny_model_dir, **{name: kinds[name](**values) for name, values in layer.items()})
    with pytest.raises(AgentLoadError, match=message):  # the API
        MemoryAgent.baseline("raw_chunks", model=tiny_model_dir, **layer)
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, instances_per_step=1)
    flags = [f"--model.{name}.{key}={v}" for name, values in layer.items() for key, v in values.items()]
    with pytest.raises(SystemExit) as info:  # the CLI, before any model loads
        main(["validate", "--config", str(config), *flags])
    line = str(info.value.code)
    assert line.startswith("memalpha validate: error: model.") and message in line
