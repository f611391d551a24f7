"""A remote reader's transport failures fail only their questions: the ``openai`` reader against the
loopback server (serving the tiny random model) with faults injected: HTTP 5xx, timeouts, malformed
replies, refused connections, a server that dies mid-round and comes back. Each failed question
scores 0 and is counted; retries back off; the API key never reaches a file of the run. A request
the server refuses itself (a 4xx) stops with one line instead. Whether a round with failed answers
is trained on, or a validation valid, is ``reader.max_failed_share``'s (tests/test_step_faults.py)."""

from __future__ import annotations

import json
import random
import secrets
import time

import pytest
from faulty_server import FaultyServer
from test_training import scalars, version_dirs, write_config

from memalpha.agent.content_judges import LLMContentJudge
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, RolloutRecord, answer_questions, start_rollouts
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.data.schema import QA, Instance
from memalpha.lm.core.http_post import backoff_delay
from memalpha.memory.store import SEMANTIC, Memory
from memalpha.reader.local import LocalReader
from memalpha.reader.openai_compat import OpenAIReader, ReaderRequestRefused
from memalpha.reader.options import OpenAISettings
from memalpha.reader.settings import ReaderSettings
from memalpha.tools.formats import ToolCall
from memalpha.tools.schemas import INSERT
from memalpha.train.step import round_metrics
from memalpha.train.validation_report import format_table, summarise_records

KEY_ENV = "MEMALPHA_FAULT_TEST_KEY"


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.fixture
def server(tiny_model, tokenizer):
    """A fresh loopback server over the tiny model, so no test inherits another's fault."""
    srv = FaultyServer(
        LocalReader(tiny_model, tokenizer, max_new_tokens=4), model_name="tiny"
    ).start()
    yield srv
    srv.stop()


def client(server: FaultyServer, **options) -> OpenAIReader:
    endpoint = {"max_retries": 0, "timeout_s": 10.0, "max_concurrency": 1, "api_key_env": KEY_ENV}
    settings = {"max_tokens": 4, "temperature": 0.0, "sleep": lambda _s: None}
    for key, value in options.items():
        (endpoint if key in OpenAISettings.__dataclass_fields__ else settings)[key] = value
    return OpenAIReader(OpenAISettings(server.base_url, "tiny", **endpoint), **settings)


def memory_items(n: int) -> list[tuple[Memory, str]]:
    memory = Memory()
    memory.core = "The user lives in Oslo."
    memory.insert(SEMANTIC, "The user's locker is number 7.")
    return [(memory, f"Question {i}: which locker is the user's?") for i in range(n)]


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------
# backoff
# ---------------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_up_to_its_cap():
    rng = random.Random(0)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5), (5000, 0.5)]:
        draws = [backoff_delay(retry, 0.1, 0.5, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in draws), (retry, min(draws), max(draws))
        assert max(draws) - min(draws) > 0.3 * ceiling  # jittered, not one fixed wait
    with pytest.raises(ValueError, match="backoff_s"):
        OpenAISettings("http://127.0.0.1:1/v1", "m", backoff_s=2.0, backoff_max_s=1.0)


def test_a_500_storm_is_retried_with_growing_backoff_then_fails_one_question(server):
    waits: list[float] = []
    reader = client(server, max_retries=4, backoff_s=0.1, backoff_max_s=0.3, sleep=waits.append)
    server.inject_fault(status=500, count=100)
    answers = reader.answer(memory_items(1))
    assert not answers[0].ok and answers[0].text == ""
    assert "HTTP 500" in answers[0].error and "5 attempts" in answers[0].error
    assert server.requests_seen == 5 and reader.failures == 1
    assert len(waits) == 4
    for wait, ceiling in zip(waits, [0.1, 0.2, 0.3, 0.3]):
        assert ceiling / 2 <= wait <= ceiling
    assert waits[1] > waits[0]  # the second ceiling's lower bound is the first one's upper bound


def test_the_real_sleep_waits_the_backoff(server):
    """Without an injected sleep the reader really waits: two retries at ceilings 0.2 s and 0.4 s."""
    reader = client(server, max_retries=2, backoff_s=0.2, backoff_max_s=0.4, sleep=time.sleep)
    server.inject_fault(status=503, count=2)
    start = time.monotonic()
    assert reader.answer(memory_items(1))[0].ok
    assert time.monotonic() - start >= 0.1 + 0.2


def test_settings_retry_count_and_timeout_are_honoured(server):
    reader = ReaderSettings(
        kind="openai",
        max_new_tokens=4,
        openai=OpenAISettings(
            base_url=server.base_url, model="tiny", timeout_s=0.3, max_retries=2, max_concurrency=1
        ),
    ).build(None, None)
    waits: list[float] = []
    reader.sleep = waits.append
    server.inject_fault(delay_s=2.0, status=503, count=3)  # every attempt outlasts the timeout
    start = time.monotonic()
    answer = reader.answer(memory_items(1))[0]
    elapsed = time.monotonic() - start
    assert not answer.ok and "timed out after 0.3s" in answer.error and "3 attempts" in answer.error
    assert server.requests_seen == 3 and len(waits) == 2
    assert 3 * 0.3 <= elapsed < 3 * 2.0  # each attempt was cut at the timeout, not at the reply


# ---------------------------------------------------------------------------------------
# each fault fails its question only; answers come back
# ---------------------------------------------------------------------------------------

FAULTS = {
    "http_500": ({"status": 500}, "HTTP 500"),
    "http_429": ({"status": 429}, "HTTP 429"),
    "timeout": ({"delay_s": 2.5, "status": 503}, "timed out"),
    "not_json": ({"body": b"{not json"}, "malformed reply"),
    "no_choices": ({"body": b'{"id": "x", "object": "chat.completion"}'}, "malformed reply"),
    "null_content": (
        {"body": b'{"choices": [{"message": {"role": "assistant", "content": null}}]}'}, "malformed reply"
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_fails_only_its_question_and_a_retry_recovers(server, fault):
    options, message = FAULTS[fault]
    items = memory_items(3)

    clean = [a.text for a in client(server).answer(items)]
    server.inject_fault(after=1, **options)  # the second question's request misbehaves
    reader = client(server, timeout_s=1.0)
    answers = reader.answer(items)
    assert [a.ok for a in answers] == [True, False, True]
    assert message in answers[1].error and answers[1].text == ""
    assert [answers[0].text, answers[2].text] == [clean[0], clean[2]]
    assert reader.failures == 1

    server.inject_fault(after=1, **options)
    retrying = client(server, timeout_s=1.0, max_retries=1)
    recovered = retrying.answer(items)
    assert all(a.ok for a in recovered) and retrying.failures == 0
    assert [a.text for a in recovered] == clean  # greedy: the retried question got its own reply


def test_a_client_error_is_not_retried_and_stops_with_one_line(server):
    reader = client(server, max_retries=3, extra_body={"n": 2})
    with pytest.raises(ReaderRequestRefused, match="refused a request: HTTP 400") as refused:
        reader.answer(memory_items(1))
    assert "\n" not in str(refused.value) and "model.reader.openai" in str(refused.value)
    assert server.requests_seen == 1 and reader.failures == 0


def test_nobody_listening_fails_every_question_without_raising():
    waits: list[float] = []
    reader = OpenAIReader(
        OpenAISettings(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=2, max_concurrency=4),
        sleep=waits.append,
    )
    answers = reader.answer(memory_items(5))
    assert not any(a.ok for a in answers) and all("refused" in a.error for a in answers)
    assert reader.failures == 5 and len(waits) == 5 * 2


def test_a_server_that_dies_mid_round_and_comes_back_on_the_same_port(server):
    url = server.base_url
    restarts: list[int] = []

    def wait(_seconds: float) -> None:
        """The third backoff of the round is when the operator brings the server back."""
        restarts.append(len(restarts) + 1)
        if len(restarts) == 3:
            server.start()

    server.inject_fault(die=True, after=2)  # the third request finds the server crashing
    reader = client(server, max_retries=1, sleep=wait)
    answers = reader.answer(memory_items(6))
    # 1, 2 answered; 3 hung up on, then refused; 4 refused twice; 5 refused, then answered after the restart
    assert [a.ok for a in answers] == [True, True, False, False, True, True]
    assert "refused" in answers[2].error and "refused" in answers[3].error
    assert reader.failures == 2
    assert server.base_url == url
    assert len(restarts) == 3


def test_the_server_refuses_a_request_without_its_api_key(tiny_model, tokenizer, monkeypatch):
    key = "sk-test-" + secrets.token_hex(8)
    with FaultyServer(LocalReader(tiny_model, tokenizer, max_new_tokens=4), api_key=key) as srv:
        monkeypatch.delenv(KEY_ENV, raising=False)
        without = client(srv, max_retries=2)
        with pytest.raises(ReaderRequestRefused, match="HTTP 401"):  # not retried: a missing key stays so
            without.answer(memory_items(1))
        monkeypatch.setenv(KEY_ENV, key)
        assert client(srv).answer(memory_items(1))[0].ok


# ---------------------------------------------------------------------------------------
# judges, and the counts a round reports
# ---------------------------------------------------------------------------------------


def test_a_failed_answer_judgement_scores_zero_and_counts_as_a_failure(server, tokenizer):
    instance = Instance(
        instance_id="lme-1",
        data_source="lme_train",  # scored by the LLM judge
        chunks=["The user drinks green tea."],
        questions=[QA("What does the user drink?", "green tea"), QA("Where does the user live?", "Oslo")],
    )
    rollouts = start_rollouts([instance], 2, RolloutSettings(), lambda text: len(text.split()), seed=0)
    dead_judge = OpenAIReader(OpenAISettings(f"http://127.0.0.1:{free_port()}/v1", "judge", max_retries=0))
    answered = answer_questions(rollouts, client(server), judge=dead_judge)
    for result in answered:
        assert result.scores == [0.0, 0.0] and result.failures == 2
        assert all(q["error"].startswith("judge: ") and "refused" in q["error"] for q in result.questions)
    assert dead_judge.failures == 4

    # the judge back up: no failures, whatever the tiny model's verdicts
    answered = answer_questions(rollouts, client(server), judge=client(server))
    assert all(r.failures == 0 and all(q["error"] is None for q in r.questions) for r in answered)


def test_the_content_judge_scores_zero_when_its_reader_fails():
    dead = OpenAIReader(
        OpenAISettings(f"http://127.0.0.1:{free_port()}/v1", "judge", max_retries=1), sleep=lambda _s: None
    )
    judge = LLMContentJudge(dead)
    calls = [
        ToolCall(
            INSERT,
            {"memory_type": "semantic_memory", "content": f"Fact {i}: the user owns {i} bikes."},
            raw="",
        )
        for i in range(3)
    ]
    assert judge.judge(calls) == [0.0, 0.0, 0.0]
    assert dead.failures == 3 and judge.malformed == 3


def test_a_round_against_a_dead_reader_completes_and_counts_every_question(tiny_model, tokenizer):
    instances = [
        Instance(f"inst-{i}", "synth_personal", ["Anna lives in Oslo.", "Anna owns a red bike."],
                 [QA("Where does Anna live?", "Oslo"), QA("What does Anna own?", "a red bike")])
        for i in range(2)
    ]
    dead = OpenAIReader(
        OpenAISettings(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=1), sleep=lambda _s: None
    )
    settings = RolloutSettings(group_size=2, max_new_tokens=8, max_prompt_tokens=2048)
    out = Agent(tiny_model, tokenizer, dead, settings, RewardSettings()).rollouts(instances, seed=0)
    assert len(out.records) == 4 and all(r.r1 == 0.0 and r.reader_failures == 2 for r in out.records)
    assert all(q["score"] == 0.0 and "refused" in q["error"] for r in out.records for q in r.questions)
    import torch

    rewards = torch.tensor([s.reward for s in out.samples])
    metrics = round_metrics(out, rewards, (rewards, torch.tensor([s.group_id for s in out.samples])))
    assert metrics["reader/failures"] == 8.0 and metrics["reader/failed_calls"] == 8.0


def test_the_validation_summary_counts_reader_failures_and_the_table_says_so():
    def record(source: str, errors: list[str | None]) -> RolloutRecord:
        questions = [{"score": 0.0 if e else 1.0, "error": e} for e in errors]
        return RolloutRecord(
            "i", source, 0, [], {}, 0, 10, questions, reader_failures=sum(e is not None for e in errors)
        )

    summary = summarise_records(
        [record("synth_personal", ["refused", None]), record("synth_timeline", [None])]
    )
    assert summary["overall"]["reader_failures"] == 1
    assert summary["per_source"]["synth_personal"]["reader_failures"] == 1
    assert summary["per_source"]["synth_timeline"]["reader_failures"] == 0
    assert format_table(summary).endswith("1 of 3 questions scored 0 because the reader failed")
    assert "reader failed" not in format_table(summarise_records([record("synth_timeline", [None])]))


# ---------------------------------------------------------------------------------------
# a real fit: faults in the first round, answers back in the second, the key in no file
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fit_survives_reader_faults_logs_them_and_never_writes_the_api_key(
    tmp_path, tiny_model_dir, tiny_model, tokenizer, monkeypatch, capsys, caplog
):
    key = "sk-memalpha-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    reader = LocalReader(tiny_model, tokenizer, max_new_tokens=6)
    with FaultyServer(reader, model_name="tiny", api_key=key) as srv:
        srv.inject_fault(status=500, count=3)  # three questions of the first round fail
        config = write_config(tmp_path, tiny_model_dir, max_steps=2)
        main([
            "fit", "--config", str(config),
            "--model.reader.kind", "openai",
            "--model.reader.openai.base_url", srv.base_url,
            "--model.reader.openai.model", "tiny",
            "--model.reader.openai.api_key_env", KEY_ENV,
            "--model.reader.openai.max_retries", "0",
            "--model.reader.max_failed_share", "0.5",  # 3 of 8: train on (the default 0.1 would stop)
        ])
        seen = srv.requests_seen

    log_dir = version_dirs(tmp_path)[0]
    values = scalars(log_dir)
    # round 0: 2 instances x 2 rollouts x 2 questions = 8 requests, 3 of them failed
    assert values["reader/failures"] == {0: 3.0, 1: 0.0}
    assert values["reader/failed_calls"] == {0: 3.0, 1: 0.0}
    report = json.loads((log_dir / "validation_step2.json").read_text())
    assert report["summary"]["overall"]["reader_failures"] == 0
    assert report["summary"]["overall"]["questions"] == 4
    # every request carried the key: a request without it would have been refused (HTTP 401)
    # and counted above; 8 + 8 training questions and 4 validation questions reached the server
    assert seen == 20

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"config.yaml", "hparams.yaml", "last.ckpt", "validation_step2.json"} <= names, names
    assert any(name.startswith("events.out.tfevents") for name in names)
    assert KEY_ENV in (log_dir / "config.yaml").read_text()  # the variable's name is recorded, not its value
    leaked = [str(p) for p in written if key.encode() in p.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
    captured = capsys.readouterr()
    assert key not in captured.out and key not in captured.err and key not in caplog.text
