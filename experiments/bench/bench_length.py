"""Length as a measured axis: ``memalpha validate`` of one adapter on held-out synthetic instances of
growing length (issue 55, item 1; docs/results.md, "bench_length").

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_length.py
          [--adapter runs/sft_tiny_cpu/adapter] [--lengths 2,8,32,128] [--instances 4] [--questions 6]
          [--data-seed 5800] [--run-dir runs/bench_length] [--out experiments/results/bench_length.json]
          [--reuse] [-- extra memalpha validate options, e.g. --model.reader.retrieval.top_k_entries 5]

Each length is one ``memalpha validate --config configs/tiny_cpu.yaml --model.adapter_path ADAPTER`` in a
process of its own (the product's path, the demo's cold-start adapter by default: ``make demo`` writes it),
on ``--instances`` synthetic validation instances of that many chunks at synthetic data seed
``--data-seed``, ``--questions`` questions each, their evidence spread over the whole input
(``data.synthetic.evidence: spread``: question ``i`` asks about the ``i``-th of the equal stretches, so
the first chunks are asked about too). Per length it reports, from the process and its validation report:

* CPU seconds per chunk of the policy's turns (all rows of a chunk index are one batch) and per
  question of the reader, from the report's ``seconds`` (the process is single-threaded, so its CPU
  seconds count the work whatever else runs on the machine; wall seconds beside them);
* the process's peak RSS (``wait4``) and its RSS every second;
* prompt tokens per turn, max and p95, against ``rollout.max_prompt_tokens``, and the responses cut at
  ``rollout.max_new_tokens``;
* memory tokens at the end;
* accuracy, fact recall, the share of questions whose answer the final memory holds (``stored``), the
  accuracy on those (``stored_accuracy``) and the share stored but answered wrongly (``stored_wrong``),
  overall and by where the evidence sits (first, middle and last third of the input).

With ``--reader-variant`` (repeatable, e.g. ``unit=sentence,top_k_entries=10``: ``reader.retrieval``
fields), each length's final memories are also answered again by the config's reader with those
retrieval settings, through the product's reader (``ReaderSettings.build``, the embedded base weights)
and its answer metrics: the policy's turns are greedy and the reader does not change them, so its
memories are the same, and only the reader's side is measured again. Per variant: accuracy, the
accuracy where the answer is stored, and the share stored but answered wrongly, overall and by third.

Writes ``--out`` (JSON, with the machine and commit) and a plot beside it (``.png``). ``--reuse`` keeps
every length whose report exists in ``--run-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: CPU seconds count the work done

from memalpha_lab.common import (
    REPO_ROOT,
    command_line,
    machine_info,
    print_table,
    write_json,
)
from memalpha_lab.study_runner import add_run_arguments

THIRDS = ("first", "middle", "last")
CONFIG = REPO_ROOT / "configs" / "tiny_cpu.yaml"


def third(chunk: int, chunks: int) -> str:
    """Which third of an input of ``chunks`` chunks the middle of chunk index ``chunk`` sits in (of two
    chunks, the first is in the first third and the second in the last)."""
    return THIRDS[min(2, (6 * chunk + 3) // (2 * chunks))]


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in (0, 1]) of ``values``."""
    ordered = sorted(values)
    return float(ordered[max(0, min(len(ordered) - 1, -(-int(share * 100) * len(ordered) // 100) - 1))])


def question_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every final answer with its score, whether its answer was stored, and its evidence's chunk."""
    return [q for r in records for q in r["questions"]]


def answer_figures(questions: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, ``stored``, ``stored_accuracy`` and ``stored_wrong`` over ``questions``."""
    n = len(questions)
    stored = [q for q in questions if q.get("stored")]
    return {
        "questions": n,
        "accuracy": sum(q["score"] for q in questions) / n if n else None,
        "stored": len(stored) / n if n else None,
        "stored_accuracy": sum(q["score"] for q in stored) / len(stored) if stored else None,
        "stored_wrong": sum(q["score"] < 1 for q in stored) / n if n else None,
    }


def length_figures(report: dict[str, Any], chunks: int, budget: int, max_new: int) -> dict[str, Any]:
    """What the benchmark reports for one length, from its validation report."""
    summary, records = report["summary"], report["records"]
    turns = [t for r in records for t in r["turns"]]
    prompts = [t["prompt_tokens"] for t in turns]
    questions = question_rows(records)
    seconds = summary["seconds"]
    by_third = {
        part: answer_figures([q for q in questions if third(q["evidence_chunk"], chunks) == part])
        for part in THIRDS
    }
    overall = summary["overall"]
    return {
        "chunks": chunks,
        "instances": overall["instances"],
        "policy_cpu_s_per_chunk": seconds["policy_cpu_s"] / chunks,
        "reader_cpu_s_per_question": seconds["reader_cpu_s"] / max(1, len(questions)),
        "policy_s_per_chunk": seconds["policy_s"] / chunks,
        "reader_s_per_question": seconds["reader_s"] / max(1, len(questions)),
        **{name: seconds[name] for name in ("policy_s", "reader_s", "policy_cpu_s", "reader_cpu_s")},
        "prompt_tokens_max": max(prompts),
        "prompt_tokens_p95": percentile(prompts, 0.95),
        "prompt_budget": budget,
        "prompts_over_budget": sum(p > budget for p in prompts),
        "responses_cut": sum(bool(t["truncated"]) for t in turns),
        "turns": len(turns),
        "max_new_tokens": max_new,
        "memory_tokens": overall["memory_tokens"],
        "input_tokens": sum(r["chunk_tokens"] for r in records) / len(records),
        "fact_recall": overall["fact_recall"],
        "tool_success": overall["tool_success"],
        **answer_figures(questions),
        "by_third": by_third,
    }


def run_validate(argv: list[str], log: Path) -> dict[str, Any]:
    """``memalpha validate ARGV`` in its own process: wall and CPU seconds, peak RSS (``wait4``) and the
    RSS every second. A failed run stops the benchmark with one line naming its log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    trace: list[tuple[float, int]] = []
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "memalpha.cli", "validate", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        stop = threading.Event()

        def sample() -> None:
            page = os.sysconf("SC_PAGE_SIZE")
            while not stop.wait(1.0):
                try:
                    with open(f"/proc/{process.pid}/statm", encoding="ascii") as handle:
                        trace.append(
                            (round(time.perf_counter() - start, 1), int(handle.read().split()[1]) * page)
                        )
                except (OSError, ValueError, IndexError):  # the process has just ended
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"bench_length: memalpha validate failed (exit {process.returncode}); see {log}")
    return {
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "rss_trace": trace,
    }


def retrieval_variant(text: str) -> dict[str, Any]:
    """``unit=sentence,top_k_entries=10`` as ``reader.retrieval`` fields, checked by
    :class:`~memalpha.reader.options.RetrievalSettings`."""
    from memalpha.reader.options import RetrievalSettings

    fields: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if not value:
            raise ValueError(f"{part!r} is not FIELD=VALUE")
        fields[name.strip()] = int(value) if value.strip().isdigit() else value.strip()
    try:
        RetrievalSettings(**fields)
    except TypeError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return fields


def reader_settings(config: Path, variant: dict[str, Any]):
    """The config's ``model.reader`` group with ``variant``'s retrieval fields."""
    from memalpha.reader.settings import ReaderSettings
    from memalpha.train.settings_loader import load_config

    reader = dict(load_config(config).section("model").get("reader", {}))
    reader["retrieval"] = {**reader.get("retrieval", {}), **variant}
    return ReaderSettings(**reader)


def answered_again(
    reports: dict[int, dict[str, Any]], config: Path, variants: list[dict[str, Any]]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Each length's final memories answered again by the config's reader under each retrieval
    variant; per variant and length, :func:`answer_figures` overall and by third."""
    from memalpha.agent.answer_metrics import score_answers
    from memalpha.lm.core.policy import load_policy
    from memalpha.memory.store import Memory
    from memalpha.train.settings_loader import load_config

    model_name = load_config(config).agent().model
    policy, tokenizer = load_policy(model_name, lora=None)
    count = make_counter(tokenizer)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for variant in variants:
        reader = reader_settings(config, variant).build(policy, tokenizer)
        name = ",".join(f"{k}={v}" for k, v in variant.items())
        out[name] = {}
        for chunks, report in reports.items():
            records = report["records"]
            memories = [Memory.from_dict(r["memory"], count) for r in records]
            items = [(m, q["question"]) for m, r in zip(memories, records) for q in r["questions"]]
            sources = [r["data_source"] for r in records for _ in r["questions"]]
            answers = reader.answer(items, sources)
            questions = [dict(q) for r in records for q in r["questions"]]
            for n, (source, question) in enumerate(zip(sources, questions)):
                scored, _ = score_answers(
                    source, [answers[n].text], [question["gold"]], questions=[question["question"]]
                )
                question["score"] = scored[0]
            out[name][chunks] = {
                **answer_figures(questions),
                "by_third": {
                    part: answer_figures([q for q in questions if third(q["evidence_chunk"], chunks) == part])
                    for part in THIRDS
                },
            }
    return out


def make_counter(tokenizer):
    from memalpha.agent.rollout import make_token_counter

    return make_token_counter(tokenizer)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, extra = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--adapter",
        type=Path,
        default=REPO_ROOT / "runs" / "sft_tiny_cpu" / "adapter",
        help="the adapter validated (default: make demo's cold-start adapter)",
    )
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--lengths", default="2,8,32,128", help="comma-separated chunks per instance")
    parser.add_argument("--instances", type=int, default=4, help="held-out instances per length")
    parser.add_argument("--questions", type=int, default=6, help="questions per instance")
    parser.add_argument(
        "--data-seed", type=int, default=5800, help="synthetic data seed of the held-out sets"
    )
    add_run_arguments(parser, "bench_length", "bench_length", "keep every length whose report exists")
    parser.add_argument(
        "--reader-variant",
        action="append",
        default=[],
        metavar="FIELD=VALUE,...",
        help="reader.retrieval settings to answer each length's final memories with again (repeatable)",
    )
    parsed = parser.parse_args(args)
    try:
        parsed.length_list = [int(n) for n in parsed.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {parsed.lengths!r}")
    if any(n < 1 for n in parsed.length_list) or parsed.instances < 1 or parsed.questions < 1:
        parser.error("--lengths, --instances and --questions must be >= 1")
    try:
        parsed.variants = [retrieval_variant(text) for text in parsed.reader_variant]
    except ValueError as exc:
        parser.error(f"--reader-variant: {exc}")
    if parsed.variants and any(option.startswith("--model.reader") for option in extra):
        parser.error(
            "--reader-variant answers with the config's reader: give no --model.reader option after --"
        )
    if not (parsed.adapter / "adapter_config.json").is_file():
        parser.error(
            f"--adapter {parsed.adapter} is not an adapter folder (run make demo to write the default)"
        )
    # validate runs in the repository root: a path given relative to where this was started is made
    # absolute here, so its reports land where --reuse and the summary look for them
    for name in ("adapter", "config", "run_dir", "out"):
        setattr(parsed, name, getattr(parsed, name).resolve())
    return parsed, extra


def config_values(config: Path, extra: list[str]) -> tuple[int, int]:
    """``rollout.max_prompt_tokens`` and ``rollout.max_new_tokens`` as the config and ``extra`` set them."""
    from memalpha.train.settings_loader import load_config

    rollout = load_config(config).section("model")["rollout"]
    values = {"max_prompt_tokens": rollout["max_prompt_tokens"], "max_new_tokens": rollout["max_new_tokens"]}
    for i, option in enumerate(extra[:-1]):
        for name in values:
            if option == f"--model.rollout.{name}":
                values[name] = int(extra[i + 1])
    return values["max_prompt_tokens"], values["max_new_tokens"]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["chunks"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (
        ("accuracy", "accuracy"),
        ("fact_recall", "fact recall"),
        ("stored", "answer stored"),
        ("stored_accuracy", "accuracy where stored"),
    ):
        left.plot(lengths, [r[key] for r in rows], marker="o", label=label)
    left.set(
        xscale="log",
        xlabel="chunks per instance",
        ylim=(0, 1),
        title="what the memory holds and the reader finds",
    )
    left.set_xticks(lengths, [str(n) for n in lengths], minor=False)
    left.set_xticks([], minor=True)
    left.legend()
    right.plot(
        lengths, [r["policy_cpu_s_per_chunk"] for r in rows], marker="o", label="policy CPU s per chunk"
    )
    right.set(
        xscale="log", xlabel="chunks per instance", ylabel="seconds", title="cost per chunk and peak RSS",
        ylim=(0, 1.2 * max(r["policy_cpu_s_per_chunk"] for r in rows)),
    )
    right.set_xticks(lengths, [str(n) for n in lengths], minor=False)
    right.set_xticks([], minor=True)
    twin = right.twinx()
    twin.plot(
        lengths, [r["peak_rss_bytes"] / 2**30 for r in rows], marker="s", color="tab:red", label="peak RSS"
    )
    twin.set(ylabel="GiB", ylim=(0, 1.2 * max(r["peak_rss_bytes"] for r in rows) / 2**30))
    right.legend(loc="upper left")
    twin.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    budget, max_new = config_values(args.config, extra)
    rows, reports = [], {}
    for chunks in args.length_list:
        version = f"chunks{chunks}"
        report_path = args.run_dir / "validate" / version / "validation.json"
        measured_path = report_path.with_name("process.json")
        if not (args.reuse and report_path.is_file() and measured_path.is_file()):
            process = run_validate(
                [
                    "--config",
                    str(args.config),
                    "--model.adapter_path",
                    str(args.adapter),
                    "--data.seed",
                    str(args.data_seed),
                    "--data.synthetic.val",
                    str(args.instances),
                    "--data.synthetic.chunks",
                    str(chunks),
                    "--data.synthetic.questions",
                    str(args.questions),
                    "--data.synthetic.evidence",
                    "spread",
                    "--data.val_batch_size",
                    str(args.instances),
                    "--trainer.logger.init_args.save_dir",
                    str(args.run_dir),
                    "--trainer.logger.init_args.name",
                    "validate",
                    "--trainer.logger.init_args.version",
                    version,
                    *extra,
                ],
                args.run_dir / "logs" / f"{version}.log",
            )
            write_json(process, measured_path)
        process = json.loads(measured_path.read_text(encoding="utf-8"))
        report = reports[chunks] = json.loads(report_path.read_text(encoding="utf-8"))
        rows.append(
            {
                **length_figures(report, chunks, budget, max_new),
                **{k: process[k] for k in ("wall_s", "cpu_s", "peak_rss_bytes")},
                "rss_trace": process["rss_trace"],
            }
        )
        print(f"{chunks} chunks: {process['wall_s']:.0f} s", flush=True)
    headers = [
        "chunks",
        "policy CPU s/chunk",
        "reader CPU s/q",
        "peak RSS GiB",
        "prompt max",
        "prompt p95",
        "over budget",
        "cut",
        "memory tok",
        "accuracy",
        "fact recall",
        "stored",
        "acc. stored",
        "stored wrong",
    ]
    print_table(
        headers,
        [
            [
                r["chunks"],
                r["policy_cpu_s_per_chunk"],
                r["reader_cpu_s_per_question"],
                r["peak_rss_bytes"] / 2**30,
                r["prompt_tokens_max"],
                r["prompt_tokens_p95"],
                r["prompts_over_budget"],
                r["responses_cut"],
                r["memory_tokens"],
                r["accuracy"],
                r["fact_recall"],
                r["stored"],
                r["stored_accuracy"],
                r["stored_wrong"],
            ]
            for r in rows
        ],
    )
    print_table(
        ["chunks", *[f"{p} acc." for p in THIRDS], *[f"{p} stored" for p in THIRDS]],
        [
            [
                r["chunks"],
                *[r["by_third"][p]["accuracy"] for p in THIRDS],
                *[r["by_third"][p]["stored"] for p in THIRDS],
            ]
            for r in rows
        ],
    )
    base = next((r for r in rows if r["chunks"] == 8), None)
    longest = rows[-1]
    ratios = None
    if base is not None and longest is not base:
        ratios = {
            "chunks": [8, longest["chunks"]],
            "policy_cpu_s_per_chunk": longest["policy_cpu_s_per_chunk"] / base["policy_cpu_s_per_chunk"],
            "peak_rss": longest["peak_rss_bytes"] / base["peak_rss_bytes"],
        }
        print(
            f"\n{longest['chunks']} chunks against 8: "
            f"cost per chunk x{ratios['policy_cpu_s_per_chunk']:.2f}, "
            f"peak RSS x{ratios['peak_rss']:.2f} (targets <= 1.25)"
        )
    again = answered_again(reports, args.config, args.variants) if args.variants else {}
    for name, by_length in again.items():
        print(f"\nthe same memories answered again with reader.retrieval {name}")
        print_table(
            ["chunks", "accuracy", "stored", "acc. stored", "stored wrong", *[f"{p} acc." for p in THIRDS]],
            [
                [
                    n,
                    f["accuracy"],
                    f["stored"],
                    f["stored_accuracy"],
                    f["stored_wrong"],
                    *[f["by_third"][p]["accuracy"] for p in THIRDS],
                ]
                for n, f in by_length.items()
            ],
        )
    result = {
        "benchmark": "bench_length",
        "command": command_line(),
        "settings": {
            "adapter": str(args.adapter),
            "config": str(args.config),
            "instances": args.instances,
            "questions": args.questions,
            "data_seed": args.data_seed,
            "evidence": "spread",
            "extra": extra,
        },
        "rows": rows,
        "ratios_vs_8": ratios,
        "reader_variants": {
            name: {str(n): f for n, f in by_length.items()} for name, by_length in again.items()
        },
    }
    write_json(result, args.out, machine=machine_info())
    plot(rows, args.out.with_suffix(".png"))
    print(f"(written to {args.out} and {args.out.with_suffix('.png')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
