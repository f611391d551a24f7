"""Profiles (`--profile`, `profile:` in a config): defaults that config files and flags override."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from memalpha.train.profiles import PROFILES
from memalpha.train.settings_loader import profile_named

REPO = Path(__file__).resolve().parents[1]


def resolved(args: list[str], capsys) -> dict:
    """The config `memalpha fit ... --print_config` prints."""
    from memalpha.cli import main

    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(REPO / "configs" / "tiny_cpu.yaml"), *args, "--print_config"])
    assert info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def option(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def test_official_profile_sets_its_options_and_explicit_flags_win(capsys):
    official = resolved(["--profile", "official"], capsys)
    assert official["profile"] == "official"
    assert option(official, "model.update.loss_agg") == "seq-mean-token-mean"
    assert option(official, "model.reader.temperature") == 0.7
    # tiny_cpu.yaml names reader.max_new_tokens itself: the config wins over the profile
    assert option(official, "model.reader.max_new_tokens") == 24
    overridden = resolved(["--profile", "official", "--model.update.loss_agg", "token-mean"], capsys)
    assert option(overridden, "model.update.loss_agg") == "token-mean"
    default = resolved([], capsys)
    assert default["profile"] == "memalpha" and option(default, "model.update.loss_agg") == "token-mean"


def test_profile_key_in_a_config_file_and_the_last_choice_wins(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("profile: official\n")
    assert profile_named(["fit", "--config", str(config)]) == "official"
    assert profile_named(["fit", "--config", str(config), "--profile", "memalpha"]) == "memalpha"
    assert profile_named(["fit", "--profile=official", f"--config={tmp_path / 'missing.yaml'}"]) == "official"
    with pytest.raises(ValueError, match="profile must be one of"):
        profile_named(["fit", "--profile", "offical"])


def test_the_official_config_uses_the_profile_without_overriding_it():
    config = yaml.safe_load((REPO / "configs" / "memalpha_official.yaml").read_text())
    assert config["profile"] == "official"
    for key in PROFILES["official"]:
        section = config
        for part in key.split(".")[:-1]:
            section = section.get(part, {})
        assert key.split(".")[-1] not in section, f"memalpha_official.yaml overrides the profile's {key}"


def test_the_docs_table_lists_exactly_what_the_profile_sets():
    page = (REPO / "docs" / "official_compatibility.md").read_text(encoding="utf-8")
    section = page.split("What `official` sets:", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \| `([^`]*)` \|$", section, flags=re.MULTILINE)
    assert {key: yaml.safe_load(value) for key, value, _ in rows} == PROFILES["official"]
    import inspect

    from memalpha.agent.reward_settings import RewardSettings
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
    from memalpha.reader.settings import ReaderSettings
    from memalpha.train.datamodule import RolloutDataModule

    groups = {  # the "memalpha default" column
        "update": UpdateSettings(),
        "reader": ReaderSettings(),
        "rollout": RolloutSettings(),
        "reward": RewardSettings(),
        "optimizer": OptimizerSettings(),
    }
    data_defaults = {
        name: p.default for name, p in inspect.signature(RolloutDataModule.__init__).parameters.items()
    }
    for key, _, default in rows:
        if key.startswith("data."):
            assert data_defaults[key.split(".", 1)[1]] == yaml.safe_load(default), key
            continue
        _, group, *path = key.split(".")  # model.<group>.<field> or model.<group>.<nested group>.<field>
        value = groups[group]
        for name in path:
            value = getattr(value, name)
        assert value == yaml.safe_load(default), key


def test_the_documented_one_step_command_of_the_official_config_resolves(capsys):
    """The shrunk `memalpha_official.yaml` command of docs/official_compatibility.md parses, keeps
    the profile's values and takes the flags' sizes (the command itself, read from the page)."""
    from memalpha.cli import main

    page = (REPO / "docs" / "official_compatibility.md").read_text(encoding="utf-8")
    block = page.split("### One step of `configs/memalpha_official.yaml`", 1)[1].split("```bash\n", 1)[1]
    args = block.split("```", 1)[0].replace("\\\n", " ").split()
    assert args[:4] == ["memalpha", "fit", "--config", "configs/memalpha_official.yaml"]
    args[3] = str(REPO / args[3])
    with pytest.raises(SystemExit) as info:
        main([*args[1:], "--print_config"])
    assert info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["profile"] == "official"
    named = {arg[2:] for arg in args if arg.startswith("--")}
    assert named & set(PROFILES["official"]) == {"model.reader.max_new_tokens"}  # the one size it shrinks
    for key, value in PROFILES["official"].items():
        assert option(config, key) == (32 if key in named else value), key
    assert option(config, "trainer.max_steps") == 1 and option(config, "trainer.accelerator") == "cpu"
    assert option(config, "model.model") == "smollm2-135m-instruct"
    assert option(config, "model.reader.kind") == "local" and option(config, "model.rollout.group_size") == 2
