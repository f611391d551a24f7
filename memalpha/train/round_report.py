"""What a rollout round reports: its scalar metrics for TensorBoard and one rollout as text.

Pure functions of a :class:`~memalpha.agent.rollout.RolloutOutput`; the names follow the
TRL/verl conventions listed in ``docs/quickstart.md``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

from memalpha.agent.rollout import RolloutOutput, RolloutRecord
from memalpha.grpo.advantages import flat_group_share


def round_metrics(
    out: RolloutOutput, rewards: torch.Tensor, compared: tuple[torch.Tensor, Sequence]
) -> dict[str, float]:
    """Reward, reward spread, response, tool-call, reward-term, memory, fact-recall, reader-failure,
    timing and compute metrics of one round; docs/quickstart.md's table of logged metrics says what
    each one means.

    ``rewards`` are the ``[N]`` per-sample rewards ``R_t`` of ``out.samples``; ``compared`` the
    rewards the credit scheme compares and each one's group
    (:class:`~memalpha.grpo.credit.CreditScheme`), whose flat groups give
    ``train/frac_reward_zero_std``. ``reader/questions`` counts the answers after earlier turns of
    per-chunk credit too; those alone are ``reader/turn_questions``.
    """
    samples, records = out.samples, out.records
    calls = sum(s.num_calls for s in samples)
    lengths = [len(s.response_ids) for s in samples]
    recalls = [r.fact_recall for r in records if r.fact_recall is not None]
    known = {"train/fact_recall": sum(recalls) / len(recalls)} if recalls else {}
    per_turn = {}
    if samples and all(s.turn_reward is not None for s in samples):
        per_turn = {
            "train/turn_reward": sum(s.turn_reward for s in samples) / len(samples),
            "reader/turn_questions": float(sum(len(r.turn_questions) for r in records)),
        }
    return {
        **known,
        "train/reward": rewards.mean().item(),
        "train/reward_std": rewards.std(unbiased=False).item(),
        "train/frac_reward_zero_std": flat_group_share(*compared),
        "train/response_length": sum(lengths) / len(lengths),
        "train/truncated_ratio": sum(s.truncated for s in samples) / len(samples),
        "train/tool_calls_per_turn": calls / len(samples),
        "train/tool_success": sum(s.num_successful_calls for s in samples) / calls if calls else 0.0,
        "rewards/r1_accuracy": sum(r.r1 for r in records) / len(records),
        "rewards/r2_tool": sum(s.r2 for s in samples) / len(samples),
        "rewards/r3_compression": sum(r.r3 for r in records) / len(records),
        "rewards/r4_content": sum(s.r4 for s in samples) / len(samples),
        "memory/tokens": sum(r.memory_tokens for r in records) / len(records),
        "reader/failures": float(sum(r.reader_failures for r in records)),
        "reader/failed_calls": float(out.reader_failed_calls),
        "perf/rollout_s": out.rollout_s,
        "perf/reader_s": out.reader_s,
        "perf/rewards_s": out.rewards_s,
        "perf/gen_tokens_per_s": out.generated_tokens / out.rollout_s if out.rollout_s > 0 else 0.0,
        "perf/rollout_total_s": out.rollout_s + out.reader_s,
        "perf/rollouts": float(len(records)),
        "perf/turn_samples": float(len(samples)),
        "perf/generated_tokens": float(out.generated_tokens),
        "reader/questions": float(sum(len(r.questions) + len(r.turn_questions) for r in records)),
        **per_turn,
    }


def rollout_text(record: RolloutRecord) -> str:
    """One rollout as markdown: each chunk's response, reward and tool results, then the final memory."""
    lines = [
        f"### instance `{record.instance_id}` ({record.data_source}), rollout {record.rollout_index}",
        "",
    ]
    for turn in record.turns:
        lines.append(f"**chunk {turn['chunk_index']}** reward {turn.get('reward', 0):.3f}")
        lines.append("```\n" + turn["response"] + "\n```")
        lines.append("results: " + json.dumps(turn["results"], ensure_ascii=False))
        lines.append("")
    lines.append("**final memory**")
    lines.append("```json\n" + json.dumps(record.memory, indent=2, ensure_ascii=False) + "\n```")
    lines.append(f"r1 {record.r1:.3f}, r3 {record.r3:.3f}, memory tokens {record.memory_tokens}")
    return "\n".join(lines)
