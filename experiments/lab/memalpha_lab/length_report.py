"""The pre-registered length study's verdict (issue 55, item 3), rebuilt from its committed files alone.

Run:  .venv/bin/python experiments/studies/length_study.py --check
      (this module's ``main``: [--scores experiments/results/length_study/instance_scores.json]
       [--summary experiments/results/length_study.json] [--check])

``experiments/studies/length_study.py`` validates every adapter on three held-out sets of growing length
and writes their per-instance scores (``{"lengths": {"2": {"start": ..., "seeds": {seed: {"grpo": ...,
"sft_continued": ...}}}, "8": ..., "32": ...}}``, each length in the control arms' layout,
:func:`length_values` per instance) and a summary. This module rebuilds from the scores file, per length,
the arm means and the paired comparisons; each arm's drop from the shortest to the longest length; and
the verdict; prints them, and with ``--check`` exits 1 when they differ from the summary's.

The rule (docs/results.md, "Pre-registered: does GRPO's gain hold at 16 times the training length?"):

* primary metric: ``fact_recall`` at the longest length, ``grpo - sft_continued`` paired per held-out
  instance; each seed's paired mean change, then the 95 % Student t interval over the seeds;
* guard: ``memory_share`` averaged over the longest held-out set is at most
  :data:`~memalpha_lab.decisive_report.GUARD_LIMIT` in every seed's ``grpo`` run;
* verdict, once every planned seed holds both arms at every length (before that: ``pending``): "GRPO
  is worse" when the interval's high end is below 0; "GRPO beats" when its low end is above 0 and the
  guard holds; "not shown" otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memalpha.agent.answer_metrics import score_answers
from memalpha.intervals import mean_interval
from memalpha.memory.store import EPISODIC, SEMANTIC, Memory
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.options import RetrievalSettings
from memalpha_lab.common import RESULTS_DIR, print_table
from memalpha_lab.control_arms_report import (
    START,
    arm_means,
    arm_scores,
    compare,
    comparison_rows,
    format_interval,
    seeds_with,
)
from memalpha_lab.decisive_plan import guarded_values
from memalpha_lab.decisive_report import decision, report_main
from memalpha_lab.instance_scores import InstanceScores

GRPO, SFT = "grpo", "sft_continued"
ARMS = (GRPO, SFT)
PRIMARY = "fact_recall"
THIRDS = ("first", "middle", "last")
READER_METRICS = ("accuracy", "extractive_accuracy")
METRICS = (
    PRIMARY,
    *READER_METRICS,
    "tool_success",
    "stored",
    "stored_accuracy",
    "memory_tokens",
    "memory_share",
    *(f"accuracy_{t}" for t in THIRDS),
    *(f"stored_{t}" for t in THIRDS),
)
COMPARISONS: tuple[tuple[str, str], ...] = ((GRPO, SFT), (GRPO, START), (SFT, START))
DROP_METRICS = (PRIMARY, *READER_METRICS)
VERDICTS = ("GRPO beats", "not shown", "GRPO is worse")
SCORES_PATH = RESULTS_DIR / "length_study" / "instance_scores.json"
SUMMARY_PATH = RESULTS_DIR / "length_study.json"


def third(chunk: int, chunks: int) -> str:
    """Which third of an input of ``chunks`` chunks the middle of chunk index ``chunk`` sits in."""
    return THIRDS[min(2, (6 * chunk + 3) // (2 * chunks))]


def memory_of(record: Mapping[str, Any]) -> Memory:
    """A validation record's final memory (``record["memory"]``) as a :class:`Memory` again: its core and
    its entries in their order, which is all retrieval reads."""
    saved = record["memory"]
    memory = Memory(core_token_limit=1 << 30)  # the core as it was saved, never cut again
    memory.core = saved.get("core", "")
    for kind, key in ((SEMANTIC, "semantic"), (EPISODIC, "episodic")):
        for entry in saved.get(key, []):
            memory.insert(kind, entry["content"])
    return memory


def extractive_scores(record: Mapping[str, Any], retrieval: RetrievalSettings) -> list[float]:
    """Each question of ``record`` scored as the extractive reader answers it from the record's final
    memory (:class:`memalpha.reader.extractive.ExtractiveReader`: what retrieval finds, no model)."""
    questions = record["questions"]
    if not questions:
        return []
    memory = memory_of(record)
    source = record["data_source"]
    answers = ExtractiveReader(retrieval=retrieval).answer(
        [(memory, q["question"]) for q in questions], [source] * len(questions)
    )
    scores, _ = score_answers(
        source,
        [a.text for a in answers],
        [q["gold"] for q in questions],
        questions=[q["question"] for q in questions],
    )
    return scores


def length_values(
    records: list[Mapping[str, Any]], retrieval: RetrievalSettings | None = None
) -> InstanceScores:
    """:func:`~memalpha_lab.decisive_plan.guarded_values` of one validation's records, each instance also
    holding ``extractive_accuracy``; ``stored`` (the share of its questions whose answer fact the final
    memory holds) and, where one is, ``stored_accuracy``; and per third of the input where its
    questions' evidence sits, ``accuracy_<third>`` and ``stored_<third>`` (absent for a third none of
    its questions asks about). One rollout per instance, as validation runs."""
    retrieval = retrieval or RetrievalSettings()
    values = guarded_values(records)
    for record in records:
        mine = values[record["data_source"]][record["instance_id"]]
        questions = record["questions"]
        extractive = extractive_scores(record, retrieval)
        mine["extractive_accuracy"] = sum(extractive) / len(extractive) if extractive else 0.0
        flagged = [q for q in questions if "stored" in q]
        if flagged:
            mine["stored"] = sum(q["stored"] for q in flagged) / len(flagged)
            held = [q["score"] for q in flagged if q["stored"]]
            if held:
                mine["stored_accuracy"] = sum(held) / len(held)
        chunks = len(record["turns"])
        for part in THIRDS:
            here = [
                q for q in questions if "evidence_chunk" in q and third(q["evidence_chunk"], chunks) == part
            ]
            if here:
                mine[f"accuracy_{part}"] = sum(q["score"] for q in here) / len(here)
                stored = [q["stored"] for q in here if "stored" in q]
                if stored:
                    mine[f"stored_{part}"] = sum(stored) / len(stored)
    return values


def run_mean(scores: Mapping[str, Any], seed: str, arm: str, metric: str) -> float | None:
    """The mean of ``metric`` over one run's held-out instances (None when not run or not measured)."""
    run = arm_scores(scores, seed, arm)
    if run is None:
        return None
    values = [v[metric] for v in run.values() if metric in v]
    return sum(values) / len(values) if values else None


def drops(by_length: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each arm's change from the shortest held-out length to the longest, per metric of
    :data:`DROP_METRICS`: per seed the run's mean at the longest minus its mean at the shortest (the two
    sets hold different instances, so the means are taken apart), then the t interval over the seeds;
    the start's once; and ``grpo - sft_continued`` of those per-seed changes with its t interval."""
    lengths = sorted(by_length, key=int)
    short, long = by_length[lengths[0]], by_length[lengths[-1]]
    seeds = [s for s in seeds_with(long, ARMS) if s in seeds_with(short, ARMS)]
    out: dict[str, Any] = {"lengths": [int(lengths[0]), int(lengths[-1])], "seeds": [int(s) for s in seeds]}
    for metric in DROP_METRICS:
        per_arm: dict[str, Any] = {}
        start = (run_mean(long, "0", START, metric), run_mean(short, "0", START, metric))
        per_arm[START] = None if None in start else start[0] - start[1]
        change: dict[str, list[float]] = {}
        for arm in ARMS:
            change[arm] = [
                run_mean(long, s, arm, metric) - run_mean(short, s, arm, metric)
                for s in seeds
                if run_mean(long, s, arm, metric) is not None and run_mean(short, s, arm, metric) is not None
            ]
            per_arm[arm] = mean_interval(change[arm]) if len(change[arm]) >= 2 else None
        both = (
            [a - b for a, b in zip(change[GRPO], change[SFT])]
            if len(change[GRPO]) == len(change[SFT])
            else []
        )
        per_arm[f"{GRPO} - {SFT}"] = mean_interval(both) if len(both) >= 2 else None
        out[metric] = per_arm
    return out


def complete_everywhere(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> bool:
    """Whether every planned seed holds both arms at every length."""
    return all(
        set(map(str, planned_seeds)) <= set(seeds_with(run, ARMS)) for run in scores["lengths"].values()
    )


def rebuild(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> dict[str, Any]:
    """Everything the summary holds that the scores file determines."""
    by_length = scores["lengths"]
    longest = max(by_length, key=int)
    decided = decision(by_length[longest], planned_seeds, GRPO, SFT, ARMS, VERDICTS, metric=PRIMARY)
    if decided["verdict"] != "pending" and not complete_everywhere(scores, planned_seeds):
        decided["verdict"] = "pending"
    decided["length"] = int(longest)
    return {
        "arm_means": {n: arm_means(run, METRICS, ARMS) for n, run in by_length.items()},
        "comparisons": {
            n: {f"{a} - {b}": {m: compare(run, a, b, m) for m in METRICS} for a, b in COMPARISONS}
            for n, run in by_length.items()
        },
        "drops": drops(by_length),
        "decision": decided,
    }


def print_length(rebuilt: Mapping[str, Any]) -> None:
    """Per length the arms' means and the paired comparisons, then the drops, the guard and the verdict."""
    headline = (PRIMARY, *READER_METRICS, "stored_accuracy")
    for length, means in sorted(rebuilt["arm_means"].items(), key=lambda item: int(item[0])):
        print(f"\n{length} chunks: arm means [95 % interval over instances]")
        print_table(
            ["arm", *headline],
            [[arm, *(format_interval(values.get(m)) for m in headline)] for arm, values in means.items()],
        )
        rows = [
            row
            for name, by_metric in rebuilt["comparisons"][length].items()
            for row in comparison_rows(name, by_metric, headline)
        ]
        print_table(["comparison", "over", "n", *headline], rows)
    changes = rebuilt["drops"]
    low, high = changes["lengths"]
    print(f"\nchange from {low} to {high} chunks (per seed, then t over seeds {changes['seeds']})")
    print_table(
        ["metric", *(changes[DROP_METRICS[0]].keys())],
        [
            [
                m,
                *(
                    v if isinstance(v, float) or v is None else format_interval(v)
                    for v in changes[m].values()
                ),
            ]
            for m in DROP_METRICS
        ],
    )
    decided = rebuilt["decision"]
    for arm, held in decided["guard"].items():
        shares = ", ".join(f"seed {s}: {v:.3f}" for s, v in held["per_seed"].items()) or "no run"
        print(
            f"guard at {decided['length']} chunks ({arm}: memory tokens / input tokens <= {held['limit']}): "
            f"{'passed' if held['passed'] else 'NOT passed'} ({shares})"
        )
    t = decided["t_over_seeds"]
    where = "-" if t is None else f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]"
    print(
        f"verdict ({decided['comparison']}, {decided['metric']} at {decided['length']} chunks, t over seeds "
        f"{decided['seeds_done']} of {decided['seeds_planned']}: {where}): {decided['verdict']}"
    )


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, __doc__.split("\n", 1)[0], rebuild, SCORES_PATH, SUMMARY_PATH, print_length)


if __name__ == "__main__":
    raise SystemExit(main())
