"""MemoryAgent.load and .served on tiny random models: from an adapter folder, from a fit
checkpoint (the same weights as the checkpoint holds), and from a vLLM server's LoRA module;
every folder, file or setting that cannot give an agent is one line before any weight loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_training import nonzero_adapter
from test_vllm_client import fake_venv

from memalpha.cli import main
from memalpha.inference.memory_agent import MemoryAgent
from memalpha.lm.sampling.vllm_engine import VllmEngine
from memalpha.lm.sampling.vllm_server import VllmServer
from memalpha.train.settings_loader import AgentLoadError


@pytest.fixture(scope="module")
def run(tiny_fit_run) -> dict[str, Path]:
    """A one-step fit of the tiny model: its config and checkpoint (shared with other test files)."""
    return tiny_fit_run


def lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}


def test_an_adapter_folder_loads_with_its_config_or_its_own_base_model(tmp_path, tiny_model_dir, run):
    adapter = nonzero_adapter(tmp_path, tiny_model_dir)
    agent = MemoryAgent.load(adapter, config=run["config"], reader={"kind": "extractive"})
    assert agent.settings.rollout.call_format == "hermes" and agent.settings.reader.kind == "extractive"
    plain = MemoryAgent.load(adapter)  # the base model of adapter_config.json, memalpha's defaults
    assert plain.settings.model == tiny_model_dir and plain.settings.rollout.call_format == "qwen"
    weights, same = lora_weights(agent.policy), lora_weights(plain.policy)
    assert weights and all(torch.equal(weights[name], same[name]) for name in weights)
    assert any(w.abs().sum() > 0 for name, w in weights.items() if "lora_B" in name)
    turn = agent.remember("Ada lives in Lisbon.")
    assert turn.response == agent.remember("Ada lives in Lisbon.").response  # greedy


def test_a_checkpoint_loads_the_adapter_it_holds_and_its_settings(run):
    agent = MemoryAgent.load(run["ckpt"])
    state = torch.load(run["ckpt"], map_location="cpu", weights_only=True)["state_dict"]
    weights = lora_weights(agent.policy)
    assert len(weights) == len(state)
    assert all(torch.equal(weights[name.removeprefix("policy.")], value) for name, value in state.items())
    assert agent.settings.rollout.max_new_tokens == 12 and agent.settings.lora.r == 8  # the run's own
    assert MemoryAgent.load(run["ckpt"], rollout={"max_new_tokens": 3}).settings.rollout.max_new_tokens == 3


def test_memalpha_predict_takes_a_checkpoint(run, tmp_path):
    text = tmp_path / "note.txt"
    text.write_text("Ada lives in Lisbon.", encoding="utf-8")
    main(["predict", "--config", str(run["config"]), "--ckpt_path", str(run["ckpt"]),
          "--data.predict.path", str(text)])
    (record,) = [json.loads(line) for line in (tmp_path / "note.predictions.jsonl").read_text().splitlines()]
    assert record["instance_id"] == "note.txt" and len(record["turns"]) == 1


def adapter_like(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "bad_json":
        (folder / "adapter_config.json").write_text("{nope")
    elif kind == "prefix":
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    elif kind == "no_weights":
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    return folder


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "is not a PEFT adapter folder (no adapter_config.json)"),
        ("bad_json", "is not a PEFT adapter folder (adapter_config.json is not valid JSON: "),
        ("prefix", "is not a LoRA adapter folder (adapter_config.json has peft_type 'PREFIX_TUNING'"),
        ("no_weights", "is not a PEFT adapter folder (no adapter_model.safetensors or adapter_model.bin)"),
    ],
)
def test_a_folder_that_is_not_an_adapter_is_one_line_for_the_api_and_the_cli(tmp_path, run, kind, message):
    folder = adapter_like(tmp_path, kind)
    with pytest.raises(AgentLoadError) as error:
        MemoryAgent.load(folder)
    assert message in str(error.value) and str(folder) in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--config", str(run["config"]), "--model.adapter_path", str(folder)])
    text = str(exit_info.value.code)
    assert text.startswith(f"memalpha predict: error: model.adapter_path: {str(folder)!r} ")
    assert message in text


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: p.write_text("not a checkpoint"), "is not a readable checkpoint"),
        (lambda p: torch.save({"state_dict": {}}, p), "is not one of memalpha fit or sft"),
        (None, "no such adapter folder or checkpoint file"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path, write, message):
    path = tmp_path / "x.ckpt"
    if write is not None:
        write(path)
    with pytest.raises(AgentLoadError, match=message):
        MemoryAgent.load(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rollout": {"grup_size": 2}}, "rollout: unknown setting 'grup_size' .its settings: group_size, "),
        ({"rollout": {"group_size": 0}}, "rollout.group_size must be >= 1, got 0"),
        ({"rollout": {"backend": "vllm"}}, "use MemoryAgent.served"),
        ({"reader": {"kind": "engine"}}, "reader.kind: engine answers from the vLLM server of a run"),
    ],
)
def test_a_bad_setting_is_one_line_before_any_weight_loads(tmp_path, tiny_model_dir, overrides, message):
    adapter = nonzero_adapter(tmp_path, tiny_model_dir)
    with pytest.raises(AgentLoadError, match=message):
        MemoryAgent.load(adapter, **overrides)


def test_a_config_that_is_not_yaml_is_one_line(tmp_path, tiny_model_dir):
    config = tmp_path / "c.yaml"
    config.write_text("model: [unclosed")
    with pytest.raises(AgentLoadError, match=f"config: {config}, line 1, column 17: not valid YAML"):
        MemoryAgent.load(nonzero_adapter(tmp_path, tiny_model_dir), config=config)


def test_a_served_policy_samples_on_the_lora_module_and_memalpha_keeps_the_memory(
    tmp_path, tiny_model_dir, monkeypatch
):
    server = VllmServer.launch(
        "base", venv=fake_venv(tmp_path / "venv"), log_file=tmp_path / "server.log", start_timeout_s=30,
        poll_s=0.1,
    )  # fmt: skip
    try:
        adapter = nonzero_adapter(tmp_path, tiny_model_dir)
        VllmEngine(server).sync(1, adapter)  # the module `vllm serve --lora-modules memagent=...` would list
        name = "memalpha-v1"
        sent = []
        post = VllmEngine._post
        monkeypatch.setattr(
            VllmEngine, "_post", lambda self, path, body: sent.append(body) or post(self, path, body)
        )
        unknown = r"no LoRA module 'nope' on the vLLM server .* serves \['base', 'memalpha-v1'\]\)"
        with pytest.raises(AgentLoadError, match=unknown):
            MemoryAgent.served(server.base_url, "nope", tokenizer=tiny_model_dir, reader={"kind": "openai"})
        with pytest.raises(AgentLoadError, match="reader.kind: local answers with weights in this process"):
            MemoryAgent.served(server.base_url, name, tokenizer=tiny_model_dir)
        agent = MemoryAgent.served(
            server.base_url + "/v1", name, tokenizer=tiny_model_dir, reader={"kind": "extractive"},
            rollout={"call_format": "hermes", "max_new_tokens": 5},
        )  # fmt: skip
        turn = agent.remember("Ada lives in Lisbon.")
        assert [body["model"] for body in sent] == [name] and sent[0]["max_tokens"] == 5
        assert turn.response == agent.tokenizer.decode(
            [t for t in turn_tokens(sent[0]) if t != 2], skip_special_tokens=True
        )
        assert agent.policy is None and turn.memory.to_dict()["format"] == "memalpha.memory/1"
    finally:
        server.close()


def turn_tokens(body: dict) -> list[int]:
    """The fake server's reply to ``body`` (tests/vllm_fake_server.py) for an adapter."""
    from vllm_fake_server import fake_response

    return fake_response(body["prompt"], body["seed"], body["max_tokens"], 1)
