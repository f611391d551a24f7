"""Per-source validation tables from rollout records, printed and written as JSON.

Two accuracies, named apart because they differ whenever instances hold different numbers of
questions: ``accuracy`` is the mean over all questions (every question weighs the same), and
``accuracy_by_instance`` the mean over instances of each instance's question mean (every instance
weighs the same), which is how the official Mem-alpha evaluation averages within a source
(docs/official_compatibility.md, difference 11).

``fact_recall`` beside them measures the memory without the reader: the mean, over rollouts whose
instance knows its gold facts (the synthetic tasks), of the share of those facts in the final
memory (:mod:`memalpha.agent.fact_recall`); ``null`` in the JSON and ``-`` in the table when no
rollout of the row knows its facts, and ``fact_recall_rollouts`` says over how many it is taken.
Where the instances name the fact that answers each question (the synthetic personal and timeline
tasks), ``stored`` is the share of questions whose answer the final memory holds and
``stored_accuracy`` the accuracy on those questions alone: a low ``stored_accuracy`` at a high
``stored`` says the reader, not the memory, loses the answers (``null`` when no question says).

LoCoMo (``data_source`` ``locomo``) is scored per question category: its row's ``per_category``
gives, per category (and over all, and over all but the adversarial one), the questions, their
``accuracy`` (the metric in force) and ``locomo_f1`` (LoCoMo's own score, computed whatever the
metric or style in force: :func:`~memalpha.agent.locomo_metrics.locomo_f1`); the table prints it
below the sources, and each LoCoMo question of the JSON carries its ``locomo_f1`` beside its
``metadata`` (the category).

The summary's ``settings`` (:func:`scoring_settings`) record what measured the report, so that
``memalpha compare`` can refuse two reports scored differently.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from memalpha.agent.answer_metrics import OFFICIAL_ANSWERS, score_answers
from memalpha.agent.locomo_metrics import bleu1
from memalpha.atomic_file import write_atomically
from memalpha.data.locomo import ADVERSARIAL, CATEGORY_NAMES
from memalpha.data.locomo import DATA_SOURCE as LOCOMO
from memalpha.tools.executor import SUCCESS_STATUSES
from memalpha.train.agent_digest import agent_digest, identified
from memalpha.train.step_faults import ReaderFailureError, ReaderFailures, validation_refusal
from memalpha.train.validation_journal import ValidationJournal, journal_path

if TYPE_CHECKING:
    from memalpha.agent.reward_settings import RewardSettings
    from memalpha.agent.rollout import RolloutOutput
    from memalpha.reader.settings import ReaderSettings
    from memalpha.templates.loader import PromptTemplates

COLUMNS = (
    "source", "instances", "questions", "accuracy", "accuracy_by_instance", "fact_recall", "memory_tokens",
    "compression", "tool_success", "mean_reward",
)


def instance_mean_accuracy(records: Sequence[Any]) -> float:
    """Mean over instances of each instance's mean question score (all rollouts of an instance
    pooled); 0 without questions."""
    per_instance: dict[str, list[float]] = defaultdict(list)
    for record in records:
        per_instance[record.instance_id].extend(q["score"] for q in record.questions)
    means = [sum(scores) / len(scores) for scores in per_instance.values() if scores]
    return sum(means) / len(means) if means else 0.0


def _summarise(records: Sequence[Any]) -> dict[str, float]:
    scores = [q["score"] for r in records for q in r.questions]
    rewards = [turn.get("reward", 0.0) for r in records for turn in r.turns]
    cut = sum(bool(turn.get("truncated")) for r in records for turn in r.turns)
    results = [res for r in records for turn in r.turns for res in turn["results"]]
    ok = sum(res["status"] in SUCCESS_STATUSES for res in results)
    recalls = [r.fact_recall for r in records if getattr(r, "fact_recall", None) is not None]
    flagged = [(q["stored"], q["score"]) for r in records for q in r.questions if "stored" in q]
    stored = [score for held, score in flagged if held]
    return {
        "instances": len({r.instance_id for r in records}),
        "questions": len(scores),
        "accuracy": sum(scores) / len(scores) if scores else 0.0,
        "accuracy_by_instance": instance_mean_accuracy(records),
        "fact_recall": sum(recalls) / len(recalls) if recalls else None,
        "fact_recall_rollouts": len(recalls),
        "stored": len(stored) / len(flagged) if flagged else None,
        "stored_accuracy": sum(stored) / len(stored) if stored else None,
        "memory_tokens": sum(r.memory_tokens for r in records) / len(records) if records else 0.0,
        "compression": sum(r.r3 for r in records) / len(records) if records else 0.0,
        # a baseline takes no turn (memalpha.agent.baselines): no call, no reward, not a 0
        "tool_success": ok / len(results) if results else (0.0 if rewards else None),
        "tool_calls": len(results),
        "turns": len(rewards),
        "replies_cut": cut,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "reader_failures": sum(r.reader_failures for r in records),
    }


def summarise_records(records: Sequence[Any]) -> dict[str, Any]:
    """Overall and per-``data_source`` accuracy, fact recall, memory size, compression (r3), tool
    success, the mean per-turn reward ``R_t``, the turns and the replies among them cut at
    ``rollout.max_new_tokens`` (``replies_cut``), and the questions that scored 0 because the reader
    failed. Records without turns (a baseline's) have no tool success or mean reward (None)."""
    by_source: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        by_source[record.data_source].append(record)
    per_source = {source: _summarise(rs) for source, rs in sorted(by_source.items())}
    categories = locomo_categories(by_source.get(LOCOMO, []))
    if categories:
        per_source[LOCOMO]["per_category"] = categories
    return {"overall": _summarise(records), "per_source": per_source}


LOCOMO_ORDER = (4, 1, 2, 3, 5)
"""LoCoMo's categories in the order of its paper's tables: single-hop, multi-hop, temporal,
open-domain, adversarial."""


def locomo_f1_scores(record: Any) -> list[float | None]:
    """LoCoMo's own score (:func:`~memalpha.agent.locomo_metrics.locomo_f1`) of each question of a
    LoCoMo record; None for a question without a LoCoMo category (data not read by the locomo layout)."""
    known = [
        i for i, q in enumerate(record.questions) if q.get("metadata", {}).get("category") in CATEGORY_NAMES
    ]
    out: list[float | None] = [None] * len(record.questions)
    if known:
        questions = [record.questions[i] for i in known]
        scores, _ = score_answers(
            LOCOMO,
            [q["prediction"] for q in questions],
            [q["gold"] for q in questions],
            metadata=[q["metadata"] for q in questions],
            style=OFFICIAL_ANSWERS,
        )
        for i, score in zip(known, scores):
            out[i] = score
    return out


def locomo_categories(records: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Per LoCoMo category name (paper order), then ``all`` and ``all_but_adversarial``: the
    ``category`` number(s), ``questions``, ``accuracy`` (the mean score in force), ``locomo_f1``
    (LoCoMo's own) and ``locomo_bleu1`` (:func:`~memalpha.agent.locomo_metrics.bleu1`, the papers'
    BLEU-1; None for a row with adversarial questions, which LoCoMo scores by the option chosen); empty
    when no question has a LoCoMo category. A category without questions is left out."""
    rows: dict[int, list[tuple[float, float, float | None]]] = defaultdict(list)
    for record in records:
        for question, f1 in zip(record.questions, locomo_f1_scores(record)):
            if f1 is not None:
                category = question["metadata"]["category"]
                bleu = None if category == ADVERSARIAL else bleu1(question["prediction"], question["gold"])
                rows[category].append((question["score"], f1, bleu))

    def row(categories: list[int]) -> dict[str, Any]:
        scored = [triple for c in categories for triple in rows[c]]
        bleus = [b for _, _, b in scored]
        return {
            "category": categories[0] if len(categories) == 1 else categories,
            "questions": len(scored),
            "accuracy": sum(a for a, _, _ in scored) / len(scored),
            "locomo_f1": sum(f for _, f, _ in scored) / len(scored),
            "locomo_bleu1": None if None in bleus else sum(bleus) / len(bleus),
        }

    present = [c for c in LOCOMO_ORDER if rows[c]]
    if not present:
        return {}
    table = {CATEGORY_NAMES[c]: row([c]) for c in present}
    table["all"] = row(present)
    if ADVERSARIAL in present and len(present) > 1:
        table["all_but_adversarial"] = row([c for c in present if c != ADVERSARIAL])
    return table


def format_locomo_table(summary: dict[str, Any]) -> str:
    """The LoCoMo rows of ``summary`` as a table per category ("" when it has none)."""
    categories = summary["per_source"].get(LOCOMO, {}).get("per_category")
    if not categories:
        return ""
    cells = [("locomo category", "questions", "accuracy", "locomo_f1", "bleu1")] + [
        (
            f"{name} ({row['category']})" if isinstance(row["category"], int) else name,
            str(row["questions"]),
            f"{row['accuracy']:.3f}",
            f"{row['locomo_f1']:.3f}",
            "-" if row.get("locomo_bleu1") is None else f"{row['locomo_bleu1']:.3f}",
        )
        for name, row in categories.items()
    ]
    return (
        "\nLoCoMo per category (accuracy: the metric in force; locomo_f1: LoCoMo's own score; bleu1: "
        "the papers' BLEU-1, adversarial questions left out)\n" + format_columns(cells)
    )


READER_TEMPLATES = (
    "answer_system", "answer_system_no_core", "answer_user", "answer_view_empty_list", "answer_judge",
)
"""The prompt texts the reader and the ``llm_judge`` metric's judge read."""
CONTENT_JUDGE_TEMPLATES = (
    "content_judge", "content_judge_core", "content_judge_semantic", "content_judge_episodic",
    "content_judge_system", "content_judge_retry",
)
"""The prompt texts of ``reward.content_judge: llm``."""


def texts_digest(templates: PromptTemplates, names: Sequence[str]) -> str:
    """A short SHA-256 of the templates ``names``: equal exactly when every one of those texts is."""
    payload = json.dumps([getattr(templates, name) for name in names], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def scoring_settings(
    model: str, reader: ReaderSettings, reward: RewardSettings, templates: PromptTemplates
) -> dict[str, dict[str, Any]]:
    """What measured a validation report, as two groups of ``option: value``, keyed as a user sets them.

    ``scoring``: what decides accuracy and memory size: the policy's base ``model`` (memory tokens
    are counted in its tokens; the ``local`` and ``engine`` readers answer with it), the reader
    (its kind, the model that answers, its length and temperature, its retrieval, the digest of its
    prompt texts, and the answer agent's adapter, by path and content digest, when it has one) and
    the answer metric (``reward.metric_style``, ``reward.metric_overrides``).
    Two reports that differ here are not comparable. Each question's instruction is in its record.

    ``reward``: every other reward setting, and with ``reward.content_judge: llm`` the digest of
    the judge's prompt texts: what decides ``mean_reward`` besides the scoring.
    """
    answers = {"local": model, "engine": model, "openai": reader.openai.model}.get(reader.kind)
    generates = reader.kind != "extractive"
    adapter = reader.adapter_path
    answer_agent = {} if adapter is None else {"model.reader.adapter": identified(adapter)}
    scoring: dict[str, Any] = {
        "model.model": model,
        "model.reader.kind": reader.kind,
        "model.reader.model": answers,
        "model.reader.max_new_tokens": reader.max_new_tokens if generates else None,
        "model.reader.temperature": reader.temperature if generates else None,
        **{f"model.reader.retrieval.{k}": v for k, v in asdict(reader.retrieval).items()},
        "model.rollout.prompt_templates[reader]": texts_digest(templates, READER_TEMPLATES),
        "model.reward.metric_style": reward.metric_style,
        "model.reward.metric_overrides": reward.metric_overrides,
        **answer_agent,
    }
    rewards: dict[str, Any] = {
        f"model.reward.{f.name}": getattr(reward, f.name)
        for f in fields(reward)
        if f.name not in ("metric_style", "metric_overrides")
    }
    if reward.content_judge == "llm":
        rewards["model.rollout.prompt_templates[content_judge]"] = texts_digest(
            templates, CONTENT_JUDGE_TEMPLATES
        )
    return {"scoring": scoring, "reward": rewards}


def format_table(summary: dict[str, Any]) -> str:
    rows = [(src, s) for src, s in summary["per_source"].items()] + [("ALL", summary["overall"])]
    cells = [COLUMNS] + [
        (
            src,
            str(s["instances"]),
            str(s["questions"]),
            f"{s['accuracy']:.3f}",
            f"{s['accuracy_by_instance']:.3f}",
            "-" if s["fact_recall"] is None else f"{s['fact_recall']:.3f}",
            f"{s['memory_tokens']:.0f}",
            f"{s['compression']:.3f}",
            _optional(s["tool_success"]),
            _optional(s["mean_reward"]),
        )
        for src, s in rows
    ]
    table = format_columns(cells)
    overall = summary["overall"]
    if overall.get("stored") is not None:
        read = "-" if overall["stored_accuracy"] is None else f"{overall['stored_accuracy']:.3f}"
        table += (f"\nthe final memory holds the answer of {overall['stored']:.3f} of the questions; "
                  f"accuracy on those: {read}")
    if overall.get("replies_cut"):  # a reply cut at the cap may have lost its call: say how many
        table += (f"\n{overall['replies_cut']} of {overall['turns']} replies were cut at "
                  "model.rollout.max_new_tokens")
    failures = summary["overall"]["reader_failures"]
    if failures:
        # a reader outage must not pass for a bad memory: say how much of the accuracy it cost
        table += (
            f"\n{failures} of {summary['overall']['questions']} questions scored 0 because the reader failed"
        )
    return table


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_columns(cells: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the first row a header underlined with dashes, the first column
    left-aligned and the others right-aligned."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_validation_report(summary: dict[str, Any], records: Sequence[Any], path: str | Path) -> str:
    """Write the summary plus every question's prediction and score to ``path`` (atomically); return the
    table, with LoCoMo's per category below it (:func:`format_locomo_table`). A summary with
    ``invalid`` (too many failed reader answers) keeps it in the JSON and ends the table with it;
    ``backends`` (the decoding backend of the policy and the local reader) is
    said under the table too."""
    write_json_atomically(path, {"summary": summary, "records": [report_record(r) for r in records]})
    invalid = f"\nINVALID: {summary['invalid']}" if summary.get("invalid") else ""
    backends = f"\nsampled by {describe_backends(summary['backends'])}" if summary.get("backends") else ""
    table = format_table(summary) + format_locomo_table(summary)
    return table + invalid + backends + f"\n(written to {path})"


def report_record(record: Any) -> dict[str, Any]:
    """A rollout record as the JSON report writes it: each LoCoMo question with its ``locomo_f1``."""
    out = asdict(record)
    if record.data_source == LOCOMO:
        for question, f1 in zip(out["questions"], locomo_f1_scores(record)):
            if f1 is not None:
                question["locomo_f1"] = f1
    return out


def describe_backends(backends: dict[str, str]) -> str:
    """``{"sampling": "cpu-fused", "reader": "cpu-fused"}`` as ``policy cpu-fused, reader cpu-fused``."""
    names = {"sampling": "policy"}
    return ", ".join(f"{names.get(who, who)} {backend}" for who, backend in backends.items())


def write_json_atomically(path: str | Path, payload: Any) -> None:
    """``payload`` as indented JSON at ``path``, atomically (a crash leaves the old file)."""
    write_atomically(path, [json.dumps(payload, ensure_ascii=False, indent=1)])


VALIDATION_SECONDS = ("policy_s", "reader_s", "policy_cpu_s", "reader_cpu_s")
"""A validation report's ``seconds``: wall and process CPU seconds of the policy's turns and the reader."""


class ValidationReporter(Callback):
    """Validation's report: the rollout records every ``validation_step`` returns (a
    :class:`~memalpha.agent.rollout.RolloutOutput`), gathered over the ranks at the epoch's end into
    the summary (:func:`summarise_records`, with the module's sampling ``backends``, the wall and CPU
    seconds the policy and the reader took, and the :func:`scoring_settings` that measured it), the
    ``val/*`` metrics logged, and the report written as
    ``validation.json`` (``memalpha validate``) or ``validation_step<N>.json`` and printed as a table.

    A reader outage is no score: over ``reader.max_failed_share`` failed answers
    (:func:`~memalpha.train.step_faults.validation_refusal`) the report says so under ``invalid``,
    nothing is logged, and every rank raises :class:`~memalpha.train.step_faults.ReaderFailureError`.

    ``memalpha validate`` journals every finished batch and resumes a killed run's journal from
    the same log folder (:mod:`memalpha.train.validation_journal`): :meth:`resumed` gives
    ``validation_step`` a batch's journaled output, and the journal is removed once the report is
    written.
    """

    def __init__(self, max_failed_share: float) -> None:
        self.max_failed_share = max_failed_share
        self.records: list[Any] = []
        self.seconds = dict.fromkeys(VALIDATION_SECONDS, 0.0)
        self.journal: ValidationJournal | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        """For ``memalpha validate``, read the journal a killed run left in this log folder (before
        the model loads: a journal this run cannot resume stops it in one line)."""
        self.journal = None
        if stage != "validate":
            return
        agent = f"{agent_digest(pl_module, trainer.datamodule, trainer.ckpt_path)}-{trainer.world_size}"
        log_dir = Path(trainer.log_dir or ".")  # a collective under DDP: every rank asks
        path = journal_path(log_dir, trainer.global_rank, trainer.world_size)
        self.journal = ValidationJournal(path, agent)
        if self.journal.batches:
            done = len(self.journal.batches)
            rank_zero_info(f"memalpha validate: {done} finished batches taken from {path}")

    def resumed(self, batch_idx: int, batch: Sequence[Any]) -> RolloutOutput | None:
        """The journaled :class:`~memalpha.agent.rollout.RolloutOutput` of a batch a killed
        ``memalpha validate`` finished, or None when it runs now."""
        return None if self.journal is None else self.journal.resumed(batch_idx, batch)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.records = []
        self.seconds = dict.fromkeys(VALIDATION_SECONDS, 0.0)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.records.extend(outputs.records)
        if self.journal is not None:
            self.journal.append(batch_idx, batch, outputs)
        for name, value in (("policy_s", outputs.rollout_s), ("reader_s", outputs.reader_s),
                            ("policy_cpu_s", outputs.rollout_cpu_s), ("reader_cpu_s", outputs.reader_cpu_s)):
            self.seconds[name] += value

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        records, seconds = self.records, [self.seconds]
        if trainer.world_size > 1:
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, (records, self.seconds))
            records = [r for part, _ in gathered for r in part]
            seconds = [s for _, s in gathered]
        summary = {
            **summarise_records(records),
            "backends": pl_module.backends,
            "seconds": {name: sum(s[name] for s in seconds) for name in VALIDATION_SECONDS},
            "settings": {
                **scoring_settings(
                    pl_module.hparams.model, pl_module.reader_settings, pl_module.reward_settings,
                    pl_module.rollout_settings.templates,
                ),
                "memory": pl_module.rollout_settings.baseline.record(),
            },
        }
        overall = summary["overall"]
        where = f"validation at global step {trainer.global_step}"
        refusal = validation_refusal(ReaderFailures.of(records), self.max_failed_share, where)
        if refusal is not None:  # a reader outage is no score: the report says so, nothing is logged
            summary["invalid"] = refusal
        else:
            optional = {
                f"val/{name}": overall[name]
                for name in ("fact_recall", "tool_success") if overall[name] is not None
            }
            pl_module.log_dict(
                {
                    **optional,
                    "val/accuracy": overall["accuracy"],
                    "val/memory_tokens": overall["memory_tokens"],
                    "val/compression": overall["compression"],
                    "val/reader_failures": float(overall["reader_failures"]),
                },
                sync_dist=False,
                rank_zero_only=True,
                batch_size=max(1, overall["questions"]),
            )
        log_dir = Path(trainer.log_dir or ".")  # a collective under DDP: every rank must ask
        if trainer.global_rank == 0 and not trainer.sanity_checking:
            validating = trainer.state.fn == "validate"
            name = "validation.json" if validating else f"validation_step{trainer.global_step}.json"
            table = write_validation_report(summary, records, log_dir / name)
            pl_module.print(table)  # through the progress bar, which moves its bars below the table
        if refusal is not None:  # every rank: the records were gathered, so all refuse alike
            raise ReaderFailureError(refusal)
        if self.journal is not None:  # the report holds every batch now
            trainer.strategy.barrier("memalpha validate: report written")
            self.journal.remove()
            self.journal = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.journal is not None:
            self.journal.close()
