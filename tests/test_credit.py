"""Credit assignment (``model.update.credit``; docs/metrics_and_rewards.md, "Credit"): the per-chunk
reward and its grouping on hand-computed numbers, the reader asked after every turn (``per_chunk``)
or the final answers credited from their evidence turn (``hindsight``) through the real rollout
(scripted policies, the extractive reader), the evidence check, and a real fit.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from lightning.pytorch import Trainer
from test_nonfinite import grpo
from test_training import write_config

from memalpha.agent.reward_math import per_chunk_totals
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, reader_questions
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.data.schema import QA, DataValidationError, Instance, question_evidence
from memalpha.data.synthetic import generate_synthetic
from memalpha.grpo.advantages import flat_group_share, group_advantages
from memalpha.grpo.credit import CREDIT_SCHEMES, CreditScheme, hindsight_accuracy, register_credit_scheme
from memalpha.grpo.settings import UpdateSettings
from memalpha.memory.store import CORE
from memalpha.reader.extractive import ExtractiveReader
from memalpha.tools.formats import get_call_format
from memalpha.tools.schemas import DELETE, UPDATE
from memalpha_lab.scripted import ScriptedSampler, _NoModel, oracle

# ------------------------------------------------------------------ the math, by hand


def test_hindsight_credits_each_final_answer_from_its_last_evidence_turn_on():
    # four questions answered finally (1, 0, 1, 1), their last evidence in chunks (0, 1, 2, 2)
    assert hindsight_accuracy([1.0, 0.0, 1.0, 1.0], [0, 1, 2, 2], 3) == pytest.approx([0.25, 0.25, 0.75])
    # (the per-chunk worked case's A below: the same turn rewards when no later turn spoils an answer)
    # nothing is answerable before turn 1
    assert hindsight_accuracy([0.5, 1.0], [1, 1], 3) == pytest.approx([0.0, 0.75, 0.75])


def test_the_per_chunk_reward_pays_each_turn_the_accuracy_it_added():
    weights = RewardSettings(accuracy_weight=1.0, beta=0.05, gamma=0.1)
    # A_k: 1 of 4 questions answered after turn 0, still 1 after turn 1, 3 after turn 2 (r1 = 0.75)
    got = per_chunk_totals([0.25, 0.25, 0.75], [1.0, 0.5, 0.0], 0.1, [1.0, 0.0, 1.0], weights)
    # gains 0.25, 0, 0.5 times K = 3; + r2_k + 0.05 * 0.1 + 0.1 * r4_k
    assert got == pytest.approx([0.75 + 1.0 + 0.005 + 0.1, 0.0 + 0.5 + 0.005 + 0.0, 1.5 + 0.0 + 0.005 + 0.1])
    # the accuracy credits sum to the broadcast's K * r1
    non_accuracy = [1.0 + 0.005 + 0.1, 0.5 + 0.005, 0.005 + 0.1]
    assert sum(got) - sum(non_accuracy) == pytest.approx(3 * 0.75)
    # a turn that overwrote an answer already stored loses what it cost
    lost = per_chunk_totals([0.5, 0.25], [0.0, 0.0], 0.0, [0.0, 0.0], RewardSettings(beta=0.0, gamma=0.0))
    assert lost == pytest.approx([1.0, -0.5])


def test_per_chunk_credit_compares_a_turn_with_the_same_turn_of_the_other_rollouts():
    # one instance, two rollouts of two turns: rows (rollout, turn) = (0,0) (0,1) (1,0) (1,1)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # broadcast: rollout 0 answered, rollout 1 did not
    turn_rewards = torch.tensor([2.0, 0.0, 0.0, 0.0])  # rollout 0's first turn stored the answer
    group_ids, turn_index = torch.tensor([0, 0, 0, 0]), torch.tensor([0, 1, 0, 1])
    broadcast = CREDIT_SCHEMES["broadcast"].advantages(rewards, turn_rewards, group_ids, turn_index)
    assert torch.allclose(broadcast, group_advantages(rewards, group_ids))
    assert broadcast[1] > 0  # the broadcast credits rollout 0's second turn too
    per_chunk = CREDIT_SCHEMES["per_chunk"].advantages(rewards, turn_rewards, group_ids, turn_index)
    # turn 0's group {2, 0}: mean 1, std 1 -> +1, -1; turn 1's group {0, 0}: all equal -> 0
    assert per_chunk.tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="turn rewards"):
        CREDIT_SCHEMES["per_chunk"].advantages(rewards, None, group_ids, turn_index)
    # what teaches nothing: broadcast's one group has a spread; per_chunk's turn-1 group is flat
    rows = (rewards, turn_rewards, group_ids, turn_index)
    assert flat_group_share(*CREDIT_SCHEMES["broadcast"].compared(*rows)) == 0.0
    assert flat_group_share(*CREDIT_SCHEMES["per_chunk"].compared(*rows)) == 0.5


def test_the_setting_names_the_scheme_and_refuses_others():
    broadcast, per_chunk = UpdateSettings().credit_scheme, UpdateSettings(credit="per_chunk").credit_scheme
    hindsight = UpdateSettings(credit="hindsight").credit_scheme
    assert UpdateSettings().credit == "broadcast" and broadcast.name == "broadcast"
    assert broadcast.turn_accuracy([1.0], [], [], 2) is None and not broadcast.needs_evidence
    assert per_chunk.asks_after_turns and per_chunk.needs_evidence
    assert not hindsight.asks_after_turns and hindsight.needs_evidence
    # per_chunk's A_k: the scores asked after each earlier turn, then the final ones, over all questions
    assert per_chunk.turn_accuracy([1.0, 0.0, 1.0, 1.0], [1.0, 1.0], [0, 1, 2, 2], 3) == pytest.approx(
        [0.25, 0.25, 0.75]
    )
    hindsight_a = hindsight.turn_accuracy([1.0, 0.0, 1.0, 1.0], [], [0, 1, 2, 2], 3)
    assert hindsight_a == pytest.approx([0.25, 0.25, 0.75])
    with pytest.raises(ValueError, match="update.credit must be one of"):
        UpdateSettings(credit="tree")


# ------------------------------------------------------------------ evidence in the data


def instance(evidence, chunks=3) -> Instance:
    questions = [QA(f"q{i}?", "a") for i in range(2)]
    return Instance("i-1", "synth_personal", [f"c{i}" for i in range(chunks)], questions,
                    {} if evidence is None else {"evidence_chunks": evidence})


def test_each_question_is_answerable_after_its_last_evidence_chunk():
    assert question_evidence(instance([[0], [2, 1]])) == [0, 2]
    assert question_evidence(instance([1, 0])) == [1, 0]
    assert reader_questions(instance([[0], [2, 1]]), asked=True) == 2 + (2 - 0) + (2 - 2)
    assert reader_questions(instance([[0], [2, 1]]), asked=False) == 2


@pytest.mark.parametrize(
    ("evidence", "reason"),
    [(None, "got null"), ([[0]], "one entry per question (2), got list of 1"),
     ([[0], [3]], "question 1: [3]"), ([[0], []], "question 1: []"), ([[0], ["1"]], "question 1: ['1']")],
)
def test_missing_or_wrong_evidence_names_the_record_and_the_field(evidence, reason):
    with pytest.raises(DataValidationError) as error:
        question_evidence(instance(evidence), file="train.jsonl", index=4)
    message = str(error.value)
    assert message.startswith("train.jsonl: record 4 (instance_id='i-1'): field 'metadata.evidence_chunks': ")
    assert reason in message and "\n" not in message


# ------------------------------------------------------------------ through the real rollout


@pytest.fixture(scope="module")
def synthetic():
    return generate_synthetic(4, split="validation", num_chunks=3, facts_per_chunk=2, distractors_per_chunk=0,
                              questions_per_instance=3, chunk_words=50, families=("synth_personal",))


def scripted(policy, instances, tokenizer, *, credit: str):
    settings = RolloutSettings(group_size=1, max_new_tokens=112, max_prompt_tokens=1536, call_format="hermes",
                               prompt_profile="compact", core_token_limit=128)
    weights = RewardSettings()
    sampler = ScriptedSampler(policy, instances, tokenizer, get_call_format("hermes"), 0)
    reader = ExtractiveReader()
    judge = weights.build_content_judge(reader)
    agent = Agent(_NoModel(), tokenizer, reader, settings, weights, judge, sampler=sampler)
    return agent.rollouts(instances, seed=0, do_sample=False, group_size=1, credit=CREDIT_SCHEMES[credit])


def test_the_oracle_earns_each_question_at_the_turn_that_stored_its_fact(synthetic, tokenizer):
    out = scripted(oracle, synthetic, tokenizer, credit="per_chunk")
    broadcast = scripted(oracle, synthetic, tokenizer, credit="broadcast")
    assert [s.reward for s in out.samples] == [s.reward for s in broadcast.samples]  # broadcast unchanged
    for record, instance_ in zip(out.records, synthetic):
        assert record.r1 == 1.0  # the extractive reader finds every fact the oracle stored
        last = question_evidence(instance_)
        questions = len(instance_.questions)
        assert len(record.questions) + len(record.turn_questions) == reader_questions(instance_, True)
        assert all(q["score"] == 1.0 for q in record.turn_questions)  # answerable ones are answered
        for k, turn in enumerate(record.turns):
            assert turn["turn_accuracy"] == pytest.approx(sum(e <= k for e in last) / questions)
    samples = {(s.group_id, s.chunk_index): s for s in out.samples}
    for g, instance_ in enumerate(synthetic):
        last = question_evidence(instance_)
        for k in range(3):
            sample = samples[(g, k)]
            gain = sum(e == k for e in last) / len(last)
            assert sample.turn_reward - sample.reward == pytest.approx(3 * gain - 1.0)  # K * gain - w * r1


def stores_the_first_chunk_only(instance_, chunk_index, rng):
    """The oracle's first turn, then turns that store nothing."""
    if chunk_index == 0:
        return oracle(instance_, chunk_index, rng)
    return []


def test_turns_that_store_nothing_earn_no_accuracy(synthetic, tokenizer):
    out = scripted(stores_the_first_chunk_only, synthetic, tokenizer, credit="per_chunk")
    for sample in out.samples:
        if sample.chunk_index > 0:
            assert sample.turn_reward == pytest.approx(sample.reward - out.records[sample.group_id].r1 * 1.0)


def test_hindsight_credits_the_final_answers_to_their_evidence_turn_and_asks_no_more(synthetic, tokenizer):
    asked = scripted(oracle, synthetic, tokenizer, credit="per_chunk")
    hindsight = scripted(oracle, synthetic, tokenizer, credit="hindsight")
    # the oracle keeps every answer it stored, so both schemes credit the same turns
    assert [s.turn_reward for s in hindsight.samples] == pytest.approx([s.turn_reward for s in asked.samples])
    for record, instance_ in zip(hindsight.records, synthetic):
        assert record.turn_questions == [] and len(record.questions) == reader_questions(instance_, False)


def stores_the_first_chunk_then_forgets_it(instance_, chunk_index, rng):
    """The first chunk's facts into the core, nothing at the second turn, the core emptied at the last."""
    if chunk_index == 0:
        facts = " ".join(arguments["content"] for _, arguments in oracle(instance_, 0, rng))
        return [(UPDATE, {"memory_type": CORE, "new_content": facts})]
    return [(DELETE, {"memory_type": CORE})] if chunk_index == len(instance_.chunks) - 1 else []


def test_a_turn_that_spoils_a_stored_answer_is_blamed_per_chunk_and_not_in_hindsight(synthetic, tokenizer):
    asked = scripted(stores_the_first_chunk_then_forgets_it, synthetic, tokenizer, credit="per_chunk")
    hindsight = scripted(stores_the_first_chunk_then_forgets_it, synthetic, tokenizer, credit="hindsight")
    accuracy = {(s.group_id, s.chunk_index): s.turn_reward - s.reward for s in asked.samples}
    for g, instance_ in enumerate(synthetic):
        first = sum(e == 0 for e in question_evidence(instance_)) / len(instance_.questions)
        assert asked.records[g].r1 == 0.0 and first > 0  # the first chunk's answers were stored, then lost
        assert accuracy[(g, 0)] == pytest.approx(3 * first)  # per_chunk: the storing turn earns them ...
        assert accuracy[(g, 2)] == pytest.approx(-3 * first)  # ... and the forgetting turn pays them back
    assert all(s.turn_reward == pytest.approx(s.reward) for s in hindsight.samples)  # r1 = 0: no turn earns


# ------------------------------------------------------------------ a real fit


@pytest.mark.parametrize("credit", ["per_chunk", "hindsight"])
def test_a_fit_with_per_turn_credit_trains_on_turn_rewards(tiny_model_dir, tmp_path, credit):
    module, data = grpo(tiny_model_dir, tmp_path, update={"credit": credit, "kl_coef": 0.0})
    data.synthetic = dataclasses.replace(data.synthetic, chunks=2)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    random.seed(0)
    trainer.fit(module, datamodule=data, weights_only=False)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}  # the one step's
    assert "train/turn_reward" in metrics
    if credit == "per_chunk":  # the reader asked after every turn too
        assert metrics["reader/turn_questions"] > 0
        assert metrics["reader/questions"] > metrics["reader/turn_questions"]
    else:  # hindsight asks nothing more
        assert metrics["reader/turn_questions"] == 0 and metrics["reader/questions"] > 0


@pytest.mark.parametrize("credit", ["per_chunk", "hindsight"])
def test_per_turn_credit_without_evidence_stops_before_the_model_loads(tmp_path, tiny_model_dir, credit):
    records = [{"instance_id": f"x{i}", "data_source": "squad", "chunks": ["Tom lives in Oslo.", "Ann is 3."],
                "questions": [{"question": "Where does Tom live?", "answer": "Oslo"}]} for i in range(4)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = write_config(tmp_path, tiny_model_dir, train_path=str(train), val_path=str(train))
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--model.update.credit", credit])
    message = str(stopped.value.code)
    assert "field 'metadata.evidence_chunks'" in message and f"data.train_path={train}" in message, message
    assert "\n" not in message


# ------------------------------------------------------------------ a scheme from outside the package


class EvenRamp(CreditScheme):
    """A scheme of this test file, not of memalpha: ``A_k = (k + 1) / K`` whatever was answered, so
    every turn earns ``w`` (``w * K * 1/K``) instead of the broadcast ``w * r1``; each turn reward
    is compared with every turn of its instance's rollouts."""

    name = "test_even_ramp"

    def turn_accuracy(self, scores, asked, evidence, turns):
        return [(k + 1) / turns for k in range(turns)]

    def compared(self, rewards, turn_rewards, group_ids, turn_index):
        return torch.as_tensor(turn_rewards), torch.as_tensor(group_ids).tolist()


@pytest.fixture
def even_ramp():
    scheme = register_credit_scheme(EvenRamp())
    yield scheme
    del CREDIT_SCHEMES[scheme.name]


def test_a_scheme_registered_outside_the_package_trains_a_real_step(
    even_ramp, tiny_model_dir, tmp_path, monkeypatch
):
    from memalpha.agent import rollout
    from memalpha.train import step

    with pytest.raises(ValueError, match="update.credit must be one of"):
        UpdateSettings(credit="test_unregistered")
    module, data = grpo(tiny_model_dir, tmp_path, update={"credit": even_ramp.name, "kl_coef": 0.0})
    data.synthetic = dataclasses.replace(data.synthetic, chunks=2)
    scored, records = [], []
    score_samples, assign_rewards = step.score_samples, rollout.assign_rewards

    def keep_scored(policy, samples, update, *args, **kwargs):
        out = score_samples(policy, samples, update, *args, **kwargs)
        scored.append((samples, list(out.batches)))  # the module pops the batches it trains
        return out

    def keep_records(*args, **kwargs):
        samples, records_ = assign_rewards(*args, **kwargs)
        records.extend(records_)
        return samples, records_

    monkeypatch.setattr(step, "score_samples", keep_scored)
    monkeypatch.setattr(rollout, "assign_rewards", keep_records)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=data, weights_only=False)
    assert trainer.global_step == 1 and len(scored) == 1
    samples, batches = scored[0]
    # rows come rollout by rollout, two turns each; every turn earns w instead of w * r1
    w = module.reward_settings.accuracy_weight
    assert torch.equal(samples.turn_index, torch.tensor([0, 1] * len(records)))
    r1 = torch.tensor([record.r1 for record in records]).repeat_interleave(2)
    assert torch.allclose(samples.turn_rewards - samples.rewards, w * (1.0 - r1))
    # the advantages compare each turn reward with every turn of its instance's rollouts
    expected = group_advantages(samples.turn_rewards, samples.group_ids)
    trained = torch.cat([batch.advantages for batch in batches])
    assert torch.allclose(trained.sort().values, expected.sort().values)
