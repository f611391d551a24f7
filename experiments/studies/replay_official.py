"""Replay the official Mem-α-4B run under both profiles and compute every reward term.

    HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/replay_official.py [--out FILE]

The recording (tests/fixtures/memalpha4b_pubmed, its README says what each file holds): the
published Mem-α-4B checkpoint, run by the official code on three PubMed-RCT validation
instances of 10 chunks each, with its raw reply of every chunk turn and the Qwen3-32B reader's
answers to the 300 questions over the memory it built. No model runs here: each profile
(memalpha/train/profiles.py) reads the recorded replies with its own call policy
(``rollout.call_repair``), executes them on a fresh memory, counts r2 by its own rule
(``reward.call_success``) and scores the recorded answers with its own metric
(``reward.metric_style``); r3 and r4 follow from the memory and the calls.

What this cannot replay: the reader is not run again, so r1 is the recorded answers' score over
the memory the official run built, under both profiles (under the default profile's memory, 11
cut-off entries are missing, which would change some answers); r4 uses the rule judge
(``reward.content_judge: rule``), not the official LLM judge; token counts (r3) use the
embedded SmolLM2 tokenizer, neither the policy's (Qwen3) nor tiktoken's (official difference 12).
The report: experiments/results/replay_official.json; docs/official_compatibility.md shows it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memalpha.agent.answer_metrics import score_answers
from memalpha.agent.content_judges import RuleContentJudge
from memalpha.agent.reward_math import TurnCalls, rollout_rewards, turn_call_successes
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import make_token_counter
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.memory.store import Memory
from memalpha.tools.executor import execute_response
from memalpha.tools.formats import get_call_format
from memalpha.tools.jsonfix import CALL_REPAIRS
from memalpha.train.profiles import PROFILES
from memalpha_lab.common import RESULTS_DIR, print_table, write_json

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "memalpha4b_pubmed"
DEFAULT_OUT = RESULTS_DIR / "replay_official.json"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def profile_settings(profile: str) -> tuple[str, RewardSettings]:
    """``(rollout.call_repair, reward settings)`` of ``profile``: the documented defaults, then the
    profile's values (with the beta and gamma of configs/memalpha_official.yaml, which the
    defaults equal)."""
    values = PROFILES[profile]
    call_repair = values.get("model.rollout.call_repair", RolloutSettings().call_repair)
    prefix = "model.reward."
    reward = RewardSettings(
        content_judge="rule",
        **{key[len(prefix):]: value for key, value in values.items()
           if key[len(prefix):] in ("call_success", "metric_style", "content_grounding", "compression_gate")
           and key.startswith(prefix)},
    )
    return call_repair, reward


def official_memory_sizes(count_tokens) -> dict[str, int]:
    """Tokens of the memory the official run ended with, per instance."""
    sizes = {}
    for instance_id, memory in json.loads(
        (FIXTURE / "final_memory.json").read_text(encoding="utf-8")
    ).items():
        entries = [
            text for part in ("semantic", "episodic") for item in memory[part] for text in item.values()
        ]
        sizes[instance_id] = (count_tokens(memory["core"]) if memory["core"] else 0) + sum(
            map(count_tokens, entries)
        )
    return sizes


def replay_profile(profile: str, tokenizer: Any) -> dict[str, Any]:
    """Every reward term of the recorded run under ``profile``, per instance and in all."""
    call_repair, reward = profile_settings(profile)
    count_tokens = make_token_counter(tokenizer)
    instances = {i["instance_id"]: i for i in _jsonl(FIXTURE / "instances.jsonl")}
    answers: dict[str, list[dict[str, Any]]] = {}
    for record in _jsonl(FIXTURE / "reader_results.jsonl"):
        answers.setdefault(record["instance_id"], []).append(record)
    turns: dict[str, list[dict[str, Any]]] = {}
    for turn in _jsonl(FIXTURE / "responses.jsonl"):
        turns.setdefault(turn["instance_id"], []).append(turn)
    official_sizes = official_memory_sizes(count_tokens)
    call_format = get_call_format("qwen")
    rows = []
    for instance_id in sorted(turns):
        instance = instances[instance_id]
        memory = Memory(
            token_counter=count_tokens, core_token_limit=RolloutSettings().core_token_limit, seed=0
        )
        calls: list[TurnCalls] = []
        for turn in sorted(turns[instance_id], key=lambda t: t["chunk_idx"]):
            outcome = execute_response(memory, turn["raw_response"], call_format, CALL_REPAIRS[call_repair])
            calls.append(TurnCalls(results=outcome.results, parse_errors=list(outcome.errors),
                                   chunk=instance["chunks"][turn["chunk_idx"]]))
        recorded = answers[instance_id]
        scores, _ = score_answers(
            instance["data_source"],
            [r["reader_response"] for r in recorded],
            [r["answer"] for r in recorded],
            style=reward.answer_style,
        )
        chunk_tokens = sum(count_tokens(chunk) for chunk in instance["chunks"])
        result = rollout_rewards(
            scores, calls, memory.total_tokens(), chunk_tokens, reward, RuleContentJudge()
        )
        attempted = sum(len(t.results) + len(t.parse_errors) for t in calls)
        succeeded = sum(turn_call_successes(t, reward) for t in calls)
        rows.append({
            "instance_id": instance_id,
            "turns": len(calls),
            "calls": attempted,
            "successful_calls": succeeded,
            "turns_all_successful": sum(1 for t in calls if not t.parse_errors
                                        and turn_call_successes(t, reward) == len(t.results)),
            "questions": len(scores),
            "r1": result.r1,
            "r2": sum(result.r2) / len(result.r2),
            "memory_tokens": memory.total_tokens(),
            "official_memory_tokens": official_sizes[instance_id],
            "chunk_tokens": chunk_tokens,
            "r3": result.r3,
            "r4": sum(result.r4) / len(result.r4),
            "mean_reward": sum(result.total) / len(result.total),
        })
    total_turns = sum(r["turns"] for r in rows)

    def turn_mean(key: str) -> float:  # a per-turn mean over all turns (r1, r3 shared by an instance's turns)
        return sum(r[key] * r["turns"] for r in rows) / total_turns

    summary = {
        "instance_id": "ALL",
        **{
            key: sum(r[key] for r in rows)
            for key in (
                "turns",
                "calls",
                "successful_calls",
                "turns_all_successful",
                "questions",
                "memory_tokens",
                "official_memory_tokens",
                "chunk_tokens",
            )
        },
        **{key: turn_mean(key) for key in ("r1", "r2", "r3", "r4", "mean_reward")},
    }
    return {
        "profile": profile,
        "settings": {"rollout.call_repair": call_repair, "reward.call_success": reward.call_success,
                     "reward.metric_style": reward.metric_style, "reward.beta": reward.beta,
                     "reward.gamma": reward.gamma, "reward.content_judge": reward.content_judge,
                     "reward.content_grounding": reward.content_grounding,
                     "reward.compression_gate": reward.compression_gate},
        "instances": rows,
        "all": summary,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    report = {
        "fixture": str(FIXTURE.relative_to(FIXTURE.parents[2])),
        "token_counter": "smollm2-135m-instruct",
        "profiles": [replay_profile(name, tokenizer) for name in ("memalpha", "official")],
    }
    headers = [
        "profile",
        "instance",
        "calls",
        "ok calls",
        "ok turns",
        "r1",
        "r2",
        "mem tok",
        "r3",
        "r4",
        "mean R_t",
    ]
    table = []
    for entry in report["profiles"]:
        for row in [*entry["instances"], entry["all"]]:
            table.append(
                [
                    entry["profile"],
                    row["instance_id"].replace("memalpha-pubmed-rct-", "pubmed-"),
                    row["calls"],
                    row["successful_calls"],
                    f"{row['turns_all_successful']}/{row['turns']}",
                    row["r1"],
                    row["r2"],
                    row["memory_tokens"],
                    row["r3"],
                    row["r4"],
                    row["mean_reward"],
                ]
            )
    print_table(headers, table, floats=3)
    write_json(report, args.out)
    print(f"(written to {args.out})")
    return report


if __name__ == "__main__":
    main()
