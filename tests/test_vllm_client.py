"""The vLLM engine's client side without vLLM: request and reply handling, the server process
(started, health-checked, killed, stopped), adapter versions and the stale-sample checks, and a
whole `fit` wired to a server. The server here is tests/vllm_fake_server.py, a stand-in for
vLLM's HTTP surface whose made-up tokens and log-probs follow a formula; the same paths against
a real vLLM server are tests/test_vllm_engine.py (`make test-vllm`)."""

from __future__ import annotations

import os
import re
import signal
import stat
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_training import scalars, version_dirs, write_config
from vllm_fake_server import EOS, fake_response, served_models

from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.lm.sampling.vllm_engine import (
    SampledGeneration,
    VllmEngine,
    VllmEngineError,
    completion_body,
    parse_completion,
)
from memalpha.lm.sampling.vllm_server import (
    VllmServer,
    VllmServerError,
    free_port,
    health_ok,
    log_tail,
    server_command,
)
from memalpha.lm.sampling.vllm_settings import VllmSettings, lora_rank_for_server
from memalpha.train.engine_sync import (
    EngineSync,
    SamplerDriftError,
    StaleSamplesError,
    check_versions,
    sampler_logprob_gap,
)

FAKE_SERVER = Path(__file__).with_name("vllm_fake_server.py")


def fake_venv(root: Path, script: str | None = None) -> Path:
    """A folder shaped like a venv whose ``bin/python -m <module> ARGS`` runs the stand-in server
    with ARGS (or ``script``, a shell body, instead)."""
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    body = script or f'shift 2\nexec "{sys.executable}" "{FAKE_SERVER}" "$@"\n'
    probe = 'if [ "$1" = "-c" ]; then exit 0; fi  # the trainer asks whether vllm is installed\n'
    python.write_text("#!/bin/sh\n" + probe + body)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return root


@pytest.fixture
def server(tmp_path):
    started = VllmServer.launch(
        "some-model", venv=fake_venv(tmp_path / "venv"), log_file=tmp_path / "server.log", start_timeout_s=30,
        poll_s=0.1,
    )  # fmt: skip
    yield started
    started.close()


# ---------------------------------------------------------------- requests and replies
def test_completion_body_sends_token_ids_and_asks_for_sampled_logprobs():
    sampled = completion_body([5, 6], model="m", max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=4,
                              do_sample=True, seed=3, eos_ids=[2])  # fmt: skip
    assert sampled["prompt"] == [5, 6] and sampled["stop_token_ids"] == [2] and sampled["seed"] == 3
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (0.7, 0.9, 4)
    assert sampled["logprobs"] == 0 and sampled["return_token_ids"] and sampled["return_tokens_as_token_ids"]
    greedy = completion_body([5], model="m", max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=4,
                             do_sample=False, seed=3, eos_ids=[2])  # fmt: skip
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, 0)


def reply(tokens, logprobs=None, prompt=(1, 2), names=None, finish="stop"):
    logprobs = logprobs if logprobs is not None else [-0.5] * len(tokens)
    return {"choices": [{
        "token_ids": tokens, "prompt_token_ids": list(prompt), "finish_reason": finish,
        "logprobs": {"token_logprobs": logprobs, "tokens": names or [f"token_id:{t}" for t in tokens]},
    }]}  # fmt: skip


def test_parse_completion_cuts_after_the_first_eos_and_keeps_its_logprobs():
    kept, logprobs, truncated = parse_completion(reply([7, 2, 9], [-1.0, -2.0, -3.0]), [1, 2], [2], 8)
    assert (kept, logprobs, truncated) == ([7, 2], [-1.0, -2.0], False)
    kept, logprobs, truncated = parse_completion(reply([7, 8], finish="length"), [1, 2], [2], 2)
    assert (kept, truncated) == ([7, 8], True)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (reply([7, 2], prompt=(0, 1, 2)), "another prompt"),
        (reply([7, 2], names=["token_id:7", "token_id:3"]), "do not name"),
        (reply([7, 2], logprobs=[-1.0]), "do not name"),
        (reply([7, 8], finish="abort"), "without an end-of-sequence token"),
        ({"choices": []}, "malformed completion reply"),
    ],
)
def test_parse_completion_refuses_replies_training_could_not_trust(data, message):
    with pytest.raises(VllmEngineError, match=message):
        parse_completion(data, [1, 2], [2], 8)


def test_server_command_enables_runtime_lora_and_processed_logprobs():
    command = server_command("py", "/m", port=5, served_name="base", dtype="float32", max_model_len=64,
                             max_lora_rank=8)  # fmt: skip
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    for flag, value in (
        ("--host", "127.0.0.1"),
        ("--max-lora-rank", "8"),
        ("--logprobs-mode", "processed_logprobs"),
    ):
        assert command[command.index(flag) + 1] == value
    assert "--enable-lora" in command


def test_lora_rank_rounds_up_to_a_rank_vllm_serves():
    assert [lora_rank_for_server(r) for r in (1, 2, 8, 9, 33)] == [1, 8, 8, 16, 64]
    with pytest.raises(ValueError, match="over the largest"):
        lora_rank_for_server(1000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "localhost:8000"}, "rollout.vllm.url"),
        ({"max_lora_rank": 12}, "rollout.vllm.max_lora_rank"),
        ({"max_logprob_gap": 0}, "rollout.vllm.max_logprob_gap"),
        ({"dtype": "fp8"}, "rollout.vllm.dtype"),
    ],
)
def test_vllm_settings_name_the_bad_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VllmSettings(**kwargs)


def test_rollout_backend_is_checked_and_its_settings_typed():
    with pytest.raises(ValueError, match="rollout.backend must be one of"):
        RolloutSettings(backend="sglang")
    assert RolloutSettings(backend="vllm", vllm={"url": "http://h:1"}).vllm.url == "http://h:1"


# ---------------------------------------------------------------- the server process
def test_launch_generate_sync_and_close(server, tmp_path):
    assert server.process is not None and health_ok(server.base_url)
    engine = VllmEngine(server, adapter_prefix="run")
    prompts = [[3, 4, 5], [1, 1]]
    base = engine.generate(prompts, max_new_tokens=6, eos_token_id=EOS, seed=11)
    assert isinstance(base, SampledGeneration) and base.adapter_version is None
    from memalpha.seeding import stable_seed

    for i, prompt in enumerate(prompts):
        expected = fake_response(prompt, stable_seed(11, i), 6, 0)
        assert base.response_ids[i] == expected and base.prompt_ids[i] == prompt
        assert base.response_logprobs[i] == [-(k + 1) / 10 for k in range(len(expected))]
    assert base.truncated == [True, True]
    # the stand-in stops at token 4
    even = engine.generate([[4, 1]], max_new_tokens=6, eos_token_id=EOS, seed=0)
    assert even.response_ids[0][-1] == EOS and even.truncated == [False]

    for version in (0, 1):
        folder = tmp_path / f"v{version}"
        folder.mkdir()
        assert engine.sync(version, folder) == f"run-v{version}"
    assert served_models(server.base_url) == ["base", "run-v1"]  # version 0 unloaded
    tuned = engine.generate(prompts, max_new_tokens=6, eos_token_id=EOS, seed=11)
    assert tuned.adapter_version == 1
    assert tuned.response_ids[0] == [t + 1 for t in base.response_ids[0]]
    with pytest.raises(ValueError, match="not newer"):
        engine.sync(1, tmp_path / "v1")
    with pytest.raises(VllmEngineError, match="HTTP 404"):
        engine.sync(2, tmp_path / "missing")  # a folder the server cannot load
    assert engine.adapter_version == 1

    pid = server.process.pid
    server.close()
    assert server.process.poll() is not None and not health_ok(server.base_url, timeout_s=1)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone
    assert "memalpha starts" in (tmp_path / "server.log").read_text()


def test_a_server_that_dies_mid_round_stops_the_round_with_its_log(server):
    engine = VllmEngine(server, max_retries=3, sleep=lambda s: None)
    engine.generate([[1, 2]], max_new_tokens=4, eos_token_id=EOS)
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()
    with pytest.raises(VllmEngineError, match=r"exited with code -9; its log ends: .*fake vLLM server"):
        engine.generate([[1, 2], [3, 4]], max_new_tokens=4, eos_token_id=EOS)


def test_an_unreachable_server_given_by_url_is_retried_then_named(server):
    waits: list[float] = []
    remote = VllmServer.connect(server.base_url + "/v1")
    assert remote.served_name == "base" and remote.process is None
    engine = VllmEngine(remote, max_retries=2, sleep=waits.append)
    server.close()
    with pytest.raises(VllmEngineError, match=r"failed 3 attempts: cannot reach"):
        engine.generate([[1, 2]], max_new_tokens=4, eos_token_id=EOS)
    assert len(waits) == 2 and 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0
    with pytest.raises(VllmServerError, match="no healthy vLLM server"):
        VllmServer.connect(server.base_url, timeout_s=1)


def test_launch_errors_name_the_venv_or_the_server_log(tmp_path):
    with pytest.raises(VllmServerError, match="make vllm-env"):
        VllmServer.launch("m", venv=tmp_path / "nowhere", log_file=tmp_path / "a.log")
    broken = fake_venv(tmp_path / "broken", script='echo "ImportError: no module named vllm"\nexit 3\n')
    with pytest.raises(VllmServerError, match=r"exited with code 3 while starting; .*ImportError: no module"):
        VllmServer.launch("m", venv=broken, log_file=tmp_path / "b.log", poll_s=0.1)
    silent = fake_venv(tmp_path / "silent", script="exec sleep 60\n")
    with pytest.raises(VllmServerError, match="did not answer /health within 1s"):
        VllmServer.launch("m", venv=silent, log_file=tmp_path / "c.log", start_timeout_s=1, poll_s=0.2)
    assert log_tail(tmp_path / "b.log").endswith("ImportError: no module named vllm")


# ---------------------------------------------------------------- stale samples
def test_check_versions_refuses_samples_of_another_version():
    check_versions([3, 3], 3, "round 1")
    with pytest.raises(
        StaleSamplesError, match=r"round 1 was sampled with adapter version base model, 2 .* version 3"
    ):
        check_versions([3, 2, None], 3, "round 1")


def test_sampler_logprob_gap_is_the_mean_absolute_difference_per_token():
    gap = sampler_logprob_gap([[-1.0, -2.0], [-0.5]], [torch.tensor([-1.5, -2.0]), torch.tensor([0.0])])
    assert gap == pytest.approx((0.5 + 0.0 + 0.5) / 3, abs=1e-12)
    assert sampler_logprob_gap([], []) == 0.0
    with pytest.raises(ValueError, match="response 0: 1 sampled log-probs but 2"):
        sampler_logprob_gap([[-1.0]], [torch.tensor([-1.0, -2.0])])


def test_check_gap_stops_the_run_above_the_threshold(tmp_path):
    sync = EngineSync(RolloutSettings(backend="vllm", vllm={"max_logprob_gap": 0.1}), "m", 8, tmp_path)
    sync.check_gap(0.1, "round 0")
    with pytest.raises(SamplerDriftError, match=r"round 0: rollout/sampler_logprob_gap 0.2 is over .* 0.1"):
        sync.check_gap(0.2, "round 0")


# ---------------------------------------------------------------- an engine that cannot start
def stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, **vllm) -> str:
    """The one-line error of ``memalpha fit`` with ``rollout.backend: vllm`` and ``vllm`` settings,
    checked to come before any weight loads."""
    from memalpha.train import policy_module

    def no_loading(*args, **kwargs):
        raise AssertionError("the policy loaded before the engine's settings were checked")

    monkeypatch.setattr(policy_module, "load_policy", no_loading)
    config = engine_config(tmp_path, tiny_model_dir, **vllm)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    message = str(stopped.value.code)
    assert message.startswith("memalpha fit: error: model.rollout.vllm.") and "\n" not in message, message
    return message


def test_a_missing_venv_stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch):
    message = stops_before_the_model_loads(
        tmp_path, tiny_model_dir, monkeypatch, url=None, venv=str(tmp_path / "no-such-venv")
    )
    assert f"model.rollout.vllm.venv: no folder {tmp_path / 'no-such-venv'}" in message
    assert "make vllm-env" in message


def test_a_venv_without_its_server_stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch):
    empty = tmp_path / "empty-venv"
    empty.mkdir()
    message = stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, url=None, venv=str(empty))
    assert f"model.rollout.vllm.venv: no python at {empty / 'bin' / 'python'}" in message
    no_vllm = tmp_path / "no-vllm"
    python = no_vllm / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")  # a python that finds no vllm package
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    message = stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, url=None, venv=str(no_vllm))
    assert "model.rollout.vllm.venv: " in message and "has no vllm package" in message


def test_a_taken_port_stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        message = stops_before_the_model_loads(
            tmp_path, tiny_model_dir, monkeypatch, url=None, venv=str(fake_venv(tmp_path / "venv")), port=port
        )
    assert f"model.rollout.vllm.port: 127.0.0.1:{port} is taken" in message


def test_a_server_url_that_does_not_answer_stops_before_the_model_loads(
    tmp_path, tiny_model_dir, monkeypatch
):
    url = f"http://127.0.0.1:{free_port()}"
    message = stops_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, url=url)
    assert f"model.rollout.vllm.url: no healthy vLLM server at {url}" in message


def test_vllm_port_is_a_port():
    assert VllmSettings(port=8000).port == 8000
    with pytest.raises(ValueError, match=r"rollout.vllm.port must be in \[1, 65535\] or null, got 0"):
        VllmSettings(port=0)


# ---------------------------------------------------------------- a whole fit
def engine_config(tmp_path: Path, model_dir: str, url: str, **vllm) -> Path:
    path = write_config(tmp_path, model_dir, max_steps=2)
    config = yaml.safe_load(path.read_text())
    config["model"]["rollout"].update(backend="vllm", vllm={"url": url, **vllm})
    path.write_text(yaml.safe_dump(config))
    return path


def test_fit_samples_from_the_server_and_syncs_a_new_adapter_every_step(server, tmp_path, tiny_model_dir):
    # The stand-in's log-probs are made up, so the gap check is loosened here to see the rest run.
    config = engine_config(tmp_path, tiny_model_dir, server.base_url, max_logprob_gap=1e6)
    main(["fit", "--config", str(config)])
    logged = scalars(version_dirs(tmp_path)[-1])
    gaps = logged["rollout/sampler_logprob_gap"]
    assert len(gaps) == 2 and all(5.0 < g < 1e6 for g in gaps.values())  # made-up vs the model's log-probs
    assert all(torch.isfinite(torch.tensor(v)) for v in logged["train/loss"].values())
    served = served_models(server.base_url)
    adapters = [name for name in served if name != "base"]
    assert len(adapters) == 1 and adapters[0].endswith("-v2")  # two trained steps, older versions unloaded


def test_fit_stops_when_the_server_does_not_sample_the_policy_and_stops_the_server(
    tmp_path, tiny_model_dir, monkeypatch
):
    log = tmp_path / "server.log"  # memalpha starts the stand-in itself here (no url)
    config = engine_config(
        tmp_path, tiny_model_dir, None, venv=str(fake_venv(tmp_path / "venv")), log_file=str(log)
    )
    monkeypatch.setenv("MEMALPHA_DEBUG", "1")  # the error itself, not its one-line exit
    with pytest.raises(SamplerDriftError, match="not sampling from the policy being trained"):
        main(["fit", "--config", str(config)])
    pid = int(re.search(r"fake vLLM server pid (\d+)", log.read_text()).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the failed run stopped the server it started


def test_bench_rollout_runs_both_engines_alternating(server, tmp_path, tiny_model_dir):
    import json
    import subprocess

    out = tmp_path / "bench.json"
    script = Path(__file__).resolve().parents[1] / "experiments" / "bench" / "bench_rollout.py"
    subprocess.run(
        [sys.executable, str(script), "--smoke", "--model", tiny_model_dir, "--engine", "hf,vllm",
         "--vllm-url", server.base_url, "--vllm-dir", str(tmp_path / "server"), "--max-logprob-gap", "inf",
         "--out", str(out)],
        check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [r["engine"] for r in rows] == ["hf", "vllm"]
    # the stand-in's made-up log-probs
    assert rows[0]["sampler_logprob_gap"] is None and rows[1]["sampler_logprob_gap"] > 1.0
    assert (tmp_path / "server" / "vllm_adapters").is_dir()
    assert rows[1]["sync_s"] > 0 and rows[1]["step_s"] == pytest.approx(
        rows[1]["sync_s"] + rows[1]["rollout_s"] + rows[1]["reader_s"] + rows[1]["train_s"]
    )
