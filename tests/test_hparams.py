"""``model.seed`` and ``data.seed`` are separate settings: a run whose two seeds differ trains,
validates and logs (Lightning refuses to log module and data hyperparameters whose shared keys
differ, so the data modules keep theirs out of the loggers)."""

from __future__ import annotations

import yaml
from test_sft import _sft_config, demo_file  # noqa: F401  (the fixture)
from test_training import scalars, version_dirs, write_config

from memalpha.cli import main


def test_fit_and_validate_with_a_model_seed_other_than_the_data_seed(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, seed=0)
    main(["fit", "--config", str(config), "--model.seed", "1"])
    main(["validate", "--config", str(config), "--model.seed", "1"])
    logs = version_dirs(tmp_path)
    assert "train/reward" in scalars(logs[0])
    logged = yaml.safe_load((logs[0] / "hparams.yaml").read_text())
    assert logged["seed"] == 1  # the module's


def test_sft_with_a_model_seed_other_than_the_data_seed(tmp_path, tiny_model_dir, demo_file):  # noqa: F811
    config = _sft_config(tmp_path, tiny_model_dir, demo_file, max_steps=1)
    main(["sft", "--config", str(config), "--model.seed", "1", "--data.seed", "2"])
    assert "train/loss" in scalars(version_dirs(tmp_path)[0])
