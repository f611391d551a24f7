"""What the reward pays scripted policies: does it order memories by what they hold (issue 30)?

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/scripted_policies.py [--val 48] [--questions 4]
      [--readers echo,local] [--threads N] [--out experiments/results/scripted_policies.json]

Four scripted policies (:mod:`memalpha_lab.scripted`) write every chunk turn of the held-out
synthetic instances of ``configs/tiny_cpu.yaml`` (personal facts and dated events; by default 48
instances of 4 questions, as the learning curve's SFT start in
``experiments/results/learning_curve_q4.json``): delete the empty core (content-free), insert one fixed
sentence (generic), insert the whole chunk (copy), insert each gold fact (oracle). Their replies go through
the real rollout: prompts, parsing, execution, the reader, and the reward under three rules:

* ``memalpha``  the default profile after issue 30: r2 counts supported changes of memory, r4
                gives unsupported writes 0, r3 is paid in proportion to r1;
* ``status``    the default profile before issue 30: r2 counts ``ok`` and ``skipped`` calls, the
                paper's r3 and r4;
* ``official``  the official profile's reward settings.

Two readers: ``echo``, the extractive reader (``reader.kind: extractive``, no model: it answers
with the memory retrieved for the question, so a question scores when its gold is stored there) and ``local``,
the embedded SmolLM2-135M-Instruct with the config's reader settings, the reader of the demo and of the
learning curve. Answers do not depend on the rule, so each memory is read once per reader. The reward's
weights are the defaults (beta 0.05, gamma 0.1) with the rule judge.

Prints one table per reader (policy, rule, r1, r2, r3, r4, R, fact recall) and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.synthetic import SyntheticSettings
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME, load_tokenizer, resolve_model_path
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.settings import ReaderSettings
from memalpha.train.profiles import PROFILES
from memalpha.train.settings_loader import LoadedConfig, load_config
from memalpha_lab.common import REPO_ROOT, RESULTS_DIR, command_line, machine_info, print_table, write_json
from memalpha_lab.scripted import POLICIES, reward_terms, run_scripted

CONFIG = REPO_ROOT / "configs" / "tiny_cpu.yaml"
OUT = RESULTS_DIR / "scripted_policies.json"
SFT_REFERENCE = {
    "source": "experiments/results/learning_curve_q4.json, step 0 (docs/results.md)",
    "what": "held-out mean reward R_t of a 6-step SFT start, 48 instances of 4 questions, local reader, "
    "measured under the reward before issue 30 (rule 'status')",
    "mean_reward": 1.134,
}
TERMS = ("r1", "r2", "r3", "r4", "R", "fact_recall")


def rule_settings(rule: str) -> RewardSettings:
    """The reward settings of one rule (see the module docstring)."""
    if rule == "memalpha":
        return RewardSettings()
    if rule == "status":
        return RewardSettings(call_success="status", content_grounding="none", compression_gate="none")
    prefix = "model.reward."
    return RewardSettings(
        **{k[len(prefix) :]: v for k, v in PROFILES["official"].items() if k.startswith(prefix)}
    )


def remember_answers(reader) -> None:
    """Answer each distinct conversation once: the policies' memories do not change with the rule."""
    chat, seen = reader.chat, {}

    def cached(conversations, **options):
        keys = [json.dumps(c, sort_keys=True) for c in conversations]
        missing = [c for k, c in zip(keys, conversations) if k not in seen]
        for conversation, answer in zip(missing, chat(missing, **options) if missing else []):
            seen[json.dumps(conversation, sort_keys=True)] = answer
        return [seen[k] for k in keys]

    reader.chat = cached


def build_reader(kind: str, config: LoadedConfig, tokenizer, settings: RolloutSettings):
    if kind == "echo":
        return ExtractiveReader(templates=settings.templates)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(EMBEDDED_MODEL_NAME))
    model.eval()
    reader = ReaderSettings(**config.section("model")["reader"]).build(model, tokenizer, settings.templates)
    remember_answers(reader)
    return reader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--val", type=int, default=48, help="held-out instances")
    parser.add_argument("--questions", type=int, default=4, help="questions per instance")
    parser.add_argument("--readers", default="echo,local", help="comma-separated: echo, local")
    parser.add_argument("--rules", default="memalpha,status,official")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    config = load_config(CONFIG)
    synthetic = config.section("data").get("synthetic", {}) | {"questions": args.questions}
    synthetic = SyntheticSettings(**synthetic)
    instances = synthetic.generate("validation", 0, count=args.val)
    settings = RolloutSettings(**{**config.section("model")["rollout"], "group_size": 1})
    tokenizer = load_tokenizer(EMBEDDED_MODEL_NAME)
    machine = machine_info()
    start = time.perf_counter()
    rows = []
    for reader_kind in args.readers.split(","):
        reader = build_reader(reader_kind, config, tokenizer, settings)
        table = []
        for policy in POLICIES:
            for rule in args.rules.split(","):
                out = run_scripted(policy, instances, tokenizer, reader, settings, rule_settings(rule))
                terms = reward_terms(out)
                rows.append({"reader": reader_kind, "policy": policy, "rule": rule, **terms})
                print(
                    f"  {reader_kind} {policy} {rule}: R {terms['R']:.3f} "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
                table.append([policy, rule, *(terms[t] for t in TERMS)])
        print(f"\nreader: {reader_kind} ({len(instances)} instances, {args.questions} questions each)")
        print_table(["policy", "rule", *TERMS], table, floats=3)
    print(f"\nSFT reference: mean reward {SFT_REFERENCE['mean_reward']} ({SFT_REFERENCE['source']})")
    report = {
        "benchmark": "scripted_policies",
        "command": command_line(),
        "settings": {
            "config": str(CONFIG.relative_to(REPO_ROOT)),
            "val_instances": args.val,
            "questions": args.questions,
            "families": list(synthetic.families),
            "rules": {
                rule: {
                    k: getattr(rule_settings(rule), k)
                    for k in (
                        "call_success",
                        "content_grounding",
                        "compression_gate",
                        "support_min_share",
                        "support_min_tokens",
                        "beta",
                        "gamma",
                        "content_judge",
                    )
                }
                for rule in args.rules.split(",")
            },
        },
        "sft_reference": SFT_REFERENCE,
        "results": rows,
        "wall_s": time.perf_counter() - start,
    }
    print(f"written to {write_json(report, args.out, machine=machine)}")


if __name__ == "__main__":
    main()
