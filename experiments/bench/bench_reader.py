"""Local reader throughput (batch 8 vs batch 1) and its accuracy when memory holds the gold facts.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_reader.py [--instances 16] [--quick]

The synthetic validation split (``memalpha.data.synthetic``, all four families) is turned into
"oracle" memories: the chunks that hold the answers to an instance's questions are written
into memory directly, so the score is what the reader can earn from a memory that lost
nothing -- an upper bound for the agent. Two layouts:

* ``chunks``     one entry per evidence chunk, verbatim (date header included);
* ``sentences``  one entry per sentence (per labelled example for ICL), prefixed with the
                 chunk's date, the granularity a good agent would store.

Dated families (timeline, summary) go to the episodic list, the others to the semantic list.
The reader is the embedded SmolLM2-135M-Instruct through :class:`memalpha.reader.local.LocalReader`
(greedy), retrieval and prompt budget as in training. Throughput is questions per wall-clock
second including retrieval and prompt building; the machine is shared (2 CPU cores), so the
numbers are indicative. Writes ``experiments/results/bench_reader.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.agent.answer_metrics import score_answers
from memalpha.data.synthetic import generate_synthetic
from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path
from memalpha.memory.store import EPISODIC, SEMANTIC, Memory
from memalpha.reader.local import LocalReader
from memalpha.reader.options import RetrievalSettings

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench_reader.json"
DATED_FAMILIES = {"synth_timeline", "synth_summary"}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def chunk_units(chunk: str) -> list[str]:
    """Sentences (or labelled examples) of a chunk's body, each prefixed with the chunk's date."""
    header, _, body = chunk.partition("\n")
    found = _DATE.search(header)
    prefix = f"On {found.group(0)}: " if found else ""
    body = re.sub(r"</?(User|Assistant)>", "", body)
    units: list[str] = []
    for paragraph in re.split(r"\n\s*\n", body):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if paragraph.startswith("Sample:"):
            units.append(" ".join(paragraph.split()))
            continue
        units.extend(
            prefix + s.strip() for s in _SENTENCE_END.split(paragraph.replace("\n", " ")) if s.strip()
        )
    return units


def oracle_memory(instance, layout: str) -> Memory:
    memory = Memory()
    evidence = sorted({c for chunks in instance.metadata.get("evidence_chunks", []) for c in chunks})
    evidence = evidence or list(range(len(instance.chunks)))
    target = EPISODIC if instance.data_source in DATED_FAMILIES else SEMANTIC
    for index in evidence:
        chunk = instance.chunks[index]
        for unit in ([chunk] if layout == "chunks" else chunk_units(chunk)):
            memory.insert(target, unit)
    return memory


def run(reader: LocalReader, items) -> tuple[list, float]:
    start = time.perf_counter()
    answers = reader.answer(items)
    return answers, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--instances", type=int, default=16, help="validation instances (cycling the 4 families)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-budget", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="4 instances, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    if args.quick:
        args.instances = 4

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    instances = generate_synthetic(args.instances, split="val", seed=args.seed)

    def reader(batch_size: int) -> LocalReader:
        return LocalReader(
            model,
            tokenizer,
            max_new_tokens=args.max_new_tokens,
            temperature=0.0,
            retrieval=RetrievalSettings(prompt_tokens=args.prompt_budget),
            batch_size=batch_size,
        )

    report: dict = {
        "command": "HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_reader.py"
        + (" --quick" if args.quick else f" --instances {args.instances}"),
        "model": "smollm2-135m-instruct (fp32, greedy)",
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "instances": len(instances),
        "max_new_tokens": args.max_new_tokens,
        "prompt_budget_tokens": args.prompt_budget,
        "layouts": {},
    }
    rows = []
    for layout in ("chunks", "sentences"):
        memories = [oracle_memory(inst, layout) for inst in instances]
        items, meta = [], []
        for inst, memory in zip(instances, memories):
            for qa in inst.questions:
                items.append((memory, qa.question))
                meta.append((inst.data_source, qa))
        batch_sizes = (8, 1) if layout == "chunks" else (8,)
        timings = {}
        answers8 = None
        for bs in batch_sizes:
            answers, seconds = run(reader(bs), items)
            timings[bs] = seconds
            if bs == 8:
                answers8 = answers
            else:
                same = sum(a.text == b.text for a, b in zip(answers, answers8))
                report["batch1_batch8_identical_answers"] = f"{same}/{len(items)}"
        by_family: dict[str, list[float]] = defaultdict(list)
        for source in sorted({s for s, _ in meta}):
            idx = [i for i, (s, _) in enumerate(meta) if s == source]
            scores, _ = score_answers(
                source,
                [answers8[i].text for i in idx],
                [meta[i][1].answer for i in idx],
                [meta[i][1].question for i in idx],
                ok=[answers8[i].ok for i in idx],
            )
            by_family[source] = scores
        all_scores = [s for v in by_family.values() for s in v]
        prompt_tokens = [reader(8).conversation_tokens(c) for c in reader(8).answer_conversations(items)]
        entry = {
            "questions": len(items),
            "mean_prompt_tokens": sum(prompt_tokens) / len(prompt_tokens),
            "accuracy": sum(all_scores) / len(all_scores),
            "accuracy_by_family": {k: sum(v) / len(v) for k, v in by_family.items()},
            "questions_per_s": {f"batch{bs}": len(items) / t for bs, t in timings.items()},
            "seconds": {f"batch{bs}": t for bs, t in timings.items()},
            "examples": [
                {"source": meta[i][0], "question": meta[i][1].question, "gold": meta[i][1].answer,
                 "answer": answers8[i].text}
                for i in range(0, len(items), max(1, len(items) // 6))
            ],
        }
        report["layouts"][layout] = entry
        for bs, t in timings.items():
            rows.append(
                (
                    layout,
                    bs,
                    len(items),
                    entry["mean_prompt_tokens"],
                    len(items) / t,
                    entry["accuracy"],
                    entry["accuracy_by_family"],
                )
            )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(
        f"\n{'memory':<10} {'batch':>5} {'questions':>9} "
        f"{'prompt tok':>10} {'q/s':>6} {'accuracy':>8}  by family"
    )
    for layout, bs, n, ptok, qps, acc, fam in rows:
        fams = ", ".join(f"{k.removeprefix('synth_')} {v:.2f}" for k, v in fam.items())
        print(f"{layout:<10} {bs:>5} {n:>9} {ptok:>10.0f} {qps:>6.2f} {acc:>8.3f}  {fams}")
    if "batch1_batch8_identical_answers" in report:
        print(f"batch 1 vs batch 8 identical answers: {report['batch1_batch8_identical_answers']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
