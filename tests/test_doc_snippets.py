"""Every runnable code block of the documentation (README.md and docs/*.md) runs as written.

**Which blocks are runnable** goes by the fence's language tag:

- ``bash`` (commands), ``python`` (a script), ``console`` (a transcript: each ``$ `` line is a
  command, the lines after it are what it prints) and ``pycon`` (a Python session, checked with
  :mod:`doctest`) are runnable;
- ``text`` (output, formulas), ``yaml``, ``json`` and ``mermaid`` are not, and a ``text`` block may
  not hold a ``$ `` or ``>>> `` line (that is a transcript: tag it ``console`` or ``pycon``);
- a block with no tag or another tag fails :func:`test_every_block_has_a_known_tag`.

**Every runnable block carries a marker**, an HTML comment on the last non-blank line before it:

- ``<!-- snippet: NAME -->``: :func:`test_snippet` runs it, by the entry ``NAME`` of
  :data:`SNIPPETS` (a marker without an entry, an entry without a marker, or a runnable block
  without a marker fails the suite);
- ``<!-- not-run: KIND: why -->`` for a block that cannot run here, ``KIND`` one of
  :data:`NOT_RUN` (a GPU, a vLLM server, the network, a data set that is not in the repository, a
  study of docs/results.md, this suite itself, a server that runs until stopped). Such a block is
  still checked for what can be checked without running it: the repository files it names exist,
  its ``make`` targets are in the Makefile, and the options it passes to a script are ones that
  script (or the lab package it uses) defines.

**How a snippet runs** (:func:`run_block`): in a folder of its own, holding the repository's
``configs/`` (as run), ``tests/fixtures`` and whatever the snippet it follows (:attr:`Snippet.after`)
left there, with ``HF_HUB_OFFLINE=1``. A ``memalpha`` command (and ``python -m MODULE``) runs in
this process through :func:`memalpha.cli.main`, as the console script would; a ``python`` block
runs as a script in a fresh interpreter. What may differ from the page is declared per snippet and
is only a size:

- :attr:`Snippet.lowered`: text replacements of the block, each lowering a count, a number of
  steps or a length (each must occur in the block, so a declared change cannot go stale);
- the working folder's ``configs/`` are the repository's with their sizes lowered
  (:data:`TINY_CONFIGS`) and the tiny random model of tests/conftest.py as ``model.model`` (the model
  name counts as a size: a snippet's check is about what the block runs and writes, not about what a
  model has learnt; what the embedded model learns is measured by the studies of docs/results.md).

Input files that stand for the user's own (a folder of notes, a teacher's validation report) are
written by the snippet's :attr:`Snippet.inputs`.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import json
import logging
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch  # noqa: F401 - its log handler must bind the session's stderr, not one test's capsys
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
RUNNABLE = {"bash", "python", "console", "pycon"}
NOT_RUNNABLE = {"text", "yaml", "json", "mermaid"}
NOT_RUN = {
    "gpu": "needs a CUDA GPU",
    "vllm": "needs a vLLM server or its own venv",
    "network": "downloads code, packages or models",
    "data": "needs a data set or model that is not in the repository",
    "study": "reruns a study or benchmark of docs/results.md: minutes to hours, and its sizes are the result",
    "suite": "runs this test suite, part of it, or the whole demo",
    "server": "starts a server that runs until stopped",
}
_FENCE = re.compile(r"^(?P<fence>```|~~~)(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"^<!-- (?:snippet: (?P<name>[a-z0-9-]+)|not-run: (?P<kind>[a-z]+): (?P<why>.+?)) -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    marker: str  # the marker line before the block, or ""

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page.name
        return f"{page}:{self.line}"

    @property
    def name(self) -> str | None:
        match = _MARKER.match(self.marker)
        return match.group("name") if match else None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the marker on the last non-blank line before it."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = [line for line in text[: match.start()].splitlines() if line.strip()]
        marker = before[-1].strip() if before and before[-1].strip().startswith("<!--") else ""
        line = text[: match.start()].count("\n") + 1
        found.append(Block(page, line, match.group("lang").strip(), match.group("body"), marker))
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


# ---------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_block_has_a_known_tag(page):
    bad = [f"{b.where} ({b.lang or 'no tag'})" for b in blocks(page) if b.lang not in RUNNABLE | NOT_RUNNABLE]
    assert not bad, (f"blocks without a known language tag (runnable: {sorted(RUNNABLE)}; other: "
                     f"{sorted(NOT_RUNNABLE)}): {bad}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_runnable_block_is_run_or_marked_not_run(page):
    problems = []
    for block in blocks(page):
        marker = _MARKER.match(block.marker)
        if block.lang in RUNNABLE:
            if marker is None:
                problems.append(f"{block.where}: a runnable {block.lang} block without "
                                "<!-- snippet: NAME --> or <!-- not-run: KIND: why -->")
            elif marker.group("kind") and marker.group("kind") not in NOT_RUN:
                problems.append(f"{block.where}: not-run kind {marker.group('kind')!r} is not one of "
                                f"{sorted(NOT_RUN)}")
        elif block.lang == "text" and re.search(r"^(\$|>>>) ", block.text, re.MULTILINE):
            problems.append(f"{block.where}: a text block holding a transcript: tag it console or pycon")
        if block.lang not in RUNNABLE and marker is not None:
            problems.append(f"{block.where}: a marker on a {block.lang} block, which is not runnable")
    assert not problems, "\n".join(problems)


def test_every_snippet_has_a_runner_and_every_runner_a_snippet():
    names = [block.name for block in ALL_BLOCKS if block.name]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "snippet names used twice"
    assert sorted(set(names) - set(SNIPPETS)) == [], "snippets with no entry in SNIPPETS"
    assert sorted(set(SNIPPETS) - set(names)) == [], "entries of SNIPPETS whose block is gone"
    for name, snippet in SNIPPETS.items():
        assert snippet.after is None or snippet.after in SNIPPETS, name


def test_markers_are_found_and_transcripts_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n<!-- snippet: one -->\n\n```bash\nmemalpha --help\n```\n\n"
                    "```python\nx = 1\n```\n\n<!-- not-run: gpu: cuda -->\n```bash\nnvidia-smi\n```\n\n"
                    "```text\n$ memalpha data synth\n```\n")
    found = blocks(page)
    assert [(b.lang, b.name, b.marker[:16], b.line) for b in found] == [
        ("bash", "one", "<!-- snippet: on", 5), ("python", None, "", 9),
        ("bash", None, "<!-- not-run: gp", 14), ("text", None, "", 18)]
    with pytest.raises(AssertionError, match=r"page.md:9: a runnable python block without(.|\n)*"
                                             r"page.md:18: a text block holding a transcript"):
        test_every_runnable_block_is_run_or_marked_not_run(page)


# ------------------------------------------------------------------- blocks that do not run here
_REPO_PATH = re.compile(r"(?<![\w./-])((?:experiments|configs|tests|lab|docs|memalpha)/[\w./-]*[\w])")
_SCRIPT = re.compile(r"(?:python\S*|bash)[ \t]+((?:experiments|lab)/[\w./-]+\.(?:py|sh))([^\n]*)")


def _not_run_blocks() -> list[Block]:
    return [b for b in ALL_BLOCKS if b.lang in RUNNABLE and b.marker.startswith("<!-- not-run: ")]


def _defines(script: Path, option: str) -> bool:
    """Whether ``script`` takes ``option``: the script names it, or the lab package it draws its
    arguments from defines it as a string."""
    if re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", script.read_text(encoding="utf-8")):
        return True
    lab = sorted((REPO / "experiments" / "lab" / "memalpha_lab").glob("*.py"))
    return any(f'"{option}"' in path.read_text(encoding="utf-8") for path in lab)


@pytest.mark.parametrize("block", _not_run_blocks(), ids=lambda b: b.where)
def test_a_block_that_does_not_run_names_what_exists(block):
    text = block.text.replace("\\\n", " ")
    missing = [p for p in _REPO_PATH.findall(text) if not (REPO / p).exists()]
    assert not missing, f"{block.where} names files that do not exist: {missing}"
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    unknown = [t for t in re.findall(r"(?<![\w-])make ([\w-]+)", text) if t not in targets]
    assert not unknown, f"{block.where} runs make targets the Makefile lacks: {unknown}"
    for script, arguments in _SCRIPT.findall(text):
        options = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", arguments.split("#")[0])
        undefined = [option for option in options if not _defines(REPO / script, option)]
        assert not undefined, f"{block.where}: {script} takes no option {undefined}"


# -------------------------------------------------------------------------------- running snippets
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny_cpu.yaml": {
        "model.model": "{tiny}", "trainer.max_steps": 1, "trainer.val_check_interval": 1,
        "data.synthetic.train": 4, "data.synthetic.val": 2, "data.val_batch_size": 2,
        "model.rollout.group_size": 2,
    },
    "sft_tiny_cpu.yaml": {
        "model.model": "{tiny}", "trainer.max_steps": 2, "trainer.val_check_interval": 2,
        "data.batch_size": 2, "data.val_batch_size": 2, "model.micro_batch_size": 2,
    },
    "memalpha_official.yaml": {"model.model": "{tiny}"},
    "answer_tiny_cpu.yaml": {
        "model.model": "{tiny}", "trainer.max_steps": 1, "trainer.val_check_interval": 1,
        "model.rollout.group_size": 2, "data.instances_per_step": 1, "data.val_batch_size": 2,
    },
    "sft_answer_tiny_cpu.yaml": {
        "model.model": "{tiny}", "trainer.max_steps": 2, "trainer.val_check_interval": 2,
        "data.batch_size": 2, "data.val_batch_size": 2, "model.micro_batch_size": 2,
    },
}
"""Each config's settings as run (``{tiny}``: the tiny random model's folder). The demonstrations
must fit ``model.rollout.max_new_tokens``, so it stays."""


def lowered_config(original: dict[str, Any], changes: dict[str, Any], tiny: str) -> dict[str, Any]:
    """``original`` with ``changes`` (dotted keys) applied; every key must exist, and every change must
    be the model name or a number no larger than the original's."""
    config = json.loads(json.dumps(original))
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        assert last in node, f"{key} is not in the config: the declared substitution is stale"
        if key == "model.model":
            value = value.format(tiny=tiny)
        else:
            assert isinstance(value, int) and isinstance(node[last], int) and value <= node[last], \
                f"{key}: {node[last]} -> {value} is not a lowered size"
        node[last] = value
    return config


@dataclass(frozen=True)
class Snippet:
    """How the block marked ``<!-- snippet: NAME -->`` runs here (the module docstring)."""

    lowered: tuple[tuple[str, str], ...] = ()
    """(as written, as run): text replacements, each lowering a size (``{tiny}``: the tiny model's folder)."""
    after: str | None = None
    """The snippet whose folder this one continues in (a copy of it), as a reader of the page would."""
    inputs: Callable[[Path], None] | None = None
    """Writes the files the block reads as the user's own."""
    check: Callable[[Ran], None] | None = None
    """What the block promised, checked on what it left (a transcript checks its own output)."""
    keep: tuple[str, ...] = ()
    """Python expressions evaluated in a ``python`` block's globals after it ran, their values (as
    JSON) in :attr:`Ran.values` for :attr:`check`."""


@dataclass
class Ran:
    """What a snippet left: its folder, the values it keeps (:attr:`Snippet.keep`), and what it printed."""

    folder: Path
    values: dict[str, Any]
    output: str


def _write_notes(folder: Path) -> None:
    notes = folder / "notes"
    notes.mkdir()
    (notes / "monday.md").write_text("# Monday\n\nAda moved to Porto. Her sister Grace teaches in Coimbra.\n")
    (notes / "tuesday.txt").write_text("Ada adopted a cat called Pixel.\n\nThe cat likes sardines.\n")
    from memalpha.data.loaders import save_jsonl
    from memalpha.data.synthetic import generate_synthetic

    save_jsonl(generate_synthetic(2, split="validation", seed=5, num_chunks=2, questions_per_instance=2,
                                  chunk_words=30), folder / "heldout.jsonl")


def _write_teacher(folder: Path) -> None:
    """A teacher's validation report and its instances: the oracle's turns recorded as a validation
    record (tests/test_distill.py), scored 1."""
    from test_distill import _by_instance, _oracle_record

    from memalpha.agent.oracle_demos import oracle_demonstrations
    from memalpha.data.loaders import save_jsonl
    from memalpha.data.synthetic import generate_synthetic
    from memalpha.lm.core.embedded import load_tokenizer
    from memalpha.train.settings_loader import load_config

    settings = load_config(folder / "configs" / "tiny_cpu.yaml").agent()
    tokenizer = load_tokenizer(settings.model)
    instances = generate_synthetic(2, split="train", seed=3, num_chunks=2, facts_per_chunk=2,
                                   distractors_per_chunk=0, questions_per_instance=2, chunk_words=40,
                                   families=("synth_personal", "synth_timeline"))
    oracle = _by_instance(oracle_demonstrations(instances, tokenizer, settings.rollout, seed=0))
    records = [_oracle_record(i, oracle[i.instance_id], tokenizer, score=1.0) for i in instances]
    report = folder / "runs" / "teacher" / "validation.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"summary": {}, "records": records}))
    (folder / "data").mkdir()
    save_jsonl(instances, folder / "data" / "train.jsonl")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _check_cold_start(ran: Ran) -> None:
    runs = ran.folder / "runs"
    assert len(_jsonl(runs / "demos" / "train.jsonl")) == 8  # 4 instances of 2 chunks
    assert (runs / "sft_tiny_cpu" / "adapter" / "adapter_config.json").is_file()
    assert (runs / "tiny_cpu" / "checkpoints" / "last.ckpt").is_file()
    assert list((runs / "tiny_cpu").glob("version_*/adapter/adapter_config.json"))


def _check_distill(ran: Ran) -> None:
    teacher = _jsonl(ran.folder / "runs" / "demos" / "teacher.jsonl")
    official = _jsonl(ran.folder / "runs" / "demos" / "official.jsonl")
    assert len(teacher) == 4 and all(d["metadata"]["source"] == "teacher" for d in teacher)  # 2 x 2 chunks
    assert len(official) == 17 and all(d["metadata"]["source"] == "official" for d in official)
    assert "kept 17 of 30 recorded turns" in ran.output


def _check_demo(ran: Ran) -> None:
    runs = ran.folder / "runs"
    for stage in ("base", "sft"):
        assert json.loads((runs / "tiny_cpu" / stage / "validation.json").read_text())["records"]
    assert (runs / "tiny_cpu" / "grpo" / "adapter" / "adapter_config.json").is_file()


def _check_compare(ran: Ran) -> None:
    pair = json.loads((ran.folder / "runs" / "sft_vs_grpo.json").read_text())
    assert [report["label"] for report in pair["reports"]] == ["A", "B"]
    assert "(written to runs/sft_vs_grpo.json)" in ran.output


def _check_baselines(ran: Ran) -> None:
    result = json.loads((ran.folder / "runs" / "baselines.json").read_text())
    assert [r["memory"] for r in result["reports"]] == ["raw_chunks top 2", "agent", "full_text"]
    assert all(r["tool_success"] is None for r in result["reports"][::2])
    assert "raw_chunks top 2 learns nothing, makes no tool call" in ran.output


def _check_baselines_api(ran: Ran) -> None:
    assert ran.values["[e.content for e in reading.memory.episodic]"] == [
        "Ada moved to Porto in May.", "Her sister Grace teaches in Coimbra."]


def _check_answer_agent(ran: Ran) -> None:
    runs = ran.folder / "runs"
    assert len(_jsonl(runs / "answers" / "train.jsonl")) == 4  # 2 instances x 2 questions
    assert (runs / "sft_answer" / "adapter" / "adapter_config.json").is_file()
    report = json.loads((runs / "tiny_cpu" / "sft_answered" / "validation.json").read_text())
    assert report["summary"]["settings"]["scoring"]["model.reader.adapter"][0].endswith("sft_answer/adapter")


def _check_answer_agent_grpo(ran: Ran) -> None:
    runs = ran.folder / "runs"
    assert (runs / "answer_tiny_cpu" / "adapter" / "adapter_config.json").is_file()
    report = json.loads((runs / "tiny_cpu" / "grpo_answered" / "validation.json").read_text())
    answered_by = report["summary"]["settings"]["scoring"]["model.reader.adapter"][0]
    assert answered_by.endswith("answer_tiny_cpu/adapter")


def _check_answer_agent_api(ran: Ran) -> None:
    assert ran.values == {"agent.settings.reader.adapter_path": "runs/sft_answer/adapter",
                          "stored.reader.adapter": "answer"}


def _check_peft(ran: Ran) -> None:
    assert ran.values == {"type(model).__name__": "PeftModelForCausalLM", "model.peft_config['default'].r": 8}


def _check_api(ran: Ran) -> None:
    from memalpha.inference.memory_file import load_memory

    saved = ran.folder / "ada.memory.json"
    assert load_memory(saved).to_dict() == ran.values["reading.memory.to_dict()"]
    (scored,) = ran.values["scored"]
    assert scored["question"] == "Where does Ada live?" and scored["score"] in (0.0, 1.0)


def _check_predict(ran: Ran) -> None:
    notes = _jsonl(ran.folder / "notes.memories.jsonl")
    assert [r["instance_id"] for r in notes] == ["monday.md", "tuesday.txt"]
    held = _jsonl(ran.folder / "heldout.predictions.jsonl")
    assert len(held) == 2 and all(len(r["questions"]) == 2 for r in held)


def _check_profiles(ran: Ran) -> None:
    assert ran.output.count("loss_agg: seq-mean-token-mean") == 2  # both runs resolve the official profile


def _check_official_step(ran: Ran) -> None:
    assert list((ran.folder / "runs").rglob("last.ckpt"))


def _check_trl(ran: Ran) -> None:
    """TRL trained one step with the environment and logged the metrics the page tells a reader to
    watch. (Whether the cold start's calls give rewards that differ is the embedded model's skill:
    docs/results.md's memory_vs_trl measures it; tests/test_trl_environment.py checks that the
    memorising template parses memalpha's calls and that they reach the memory.)"""
    assert ran.values["trainer.state.global_step"] == 1
    (step,) = [log for log in ran.values["trainer.state.log_history"] if "frac_reward_zero_std" in log]
    watched = ("reward", "reward_std", "frac_reward_zero_std", "tools/call_frequency",
               "tools/failure_frequency")
    assert all(key in step for key in watched), f"TRL's step log lacks {set(watched) - set(step)}"


SNIPPETS: dict[str, Snippet] = {
    # docs/cold_start.md
    "cold-start": Snippet(check=_check_cold_start, lowered=(
        ("--count 24", "--count 4"), ("--split test --count 4", "--split test --count 1"))),
    "cold-start-distill": Snippet(inputs=_write_teacher, check=_check_distill),
    # docs/quickstart.md
    "quickstart-demo": Snippet(lowered=(("--count 24", "--count 4"),), check=_check_demo),
    "quickstart-compare": Snippet(after="quickstart-demo", check=_check_compare),
    "quickstart-peft": Snippet(after="quickstart-demo", check=_check_peft,
                               keep=("type(model).__name__", "model.peft_config['default'].r")),
    # docs/baselines.md
    "baselines-validate": Snippet(after="quickstart-demo", check=_check_baselines),
    "baselines-api": Snippet(check=_check_baselines_api,
                             keep=("[e.content for e in reading.memory.episodic]",)),
    # docs/answer_agent.md
    "answer-agent-sft": Snippet(
        after="quickstart-demo", check=_check_answer_agent,
        lowered=(("--num-train 64", "--num-train 2"), ("--num-val 8", "--num-val 1"))),
    "answer-agent-grpo": Snippet(after="answer-agent-sft", check=_check_answer_agent_grpo),
    "answer-agent-api": Snippet(after="answer-agent-sft", check=_check_answer_agent_api,
                                keep=("agent.settings.reader.adapter_path", "stored.reader.adapter")),
    # docs/inference.md
    "inference-api": Snippet(after="quickstart-demo", check=_check_api,
                             keep=("reading.memory.to_dict()", "scored")),
    "inference-predict": Snippet(after="quickstart-demo", inputs=_write_notes, check=_check_predict),
    # docs/official_compatibility.md
    "official-profiles": Snippet(check=_check_profiles),
    "official-one-step": Snippet(lowered=(("--model.model smollm2-135m-instruct", "--model.model {tiny}"),),
                                 check=_check_official_step),
    # docs/data.md: the transcripts check their own output
    "data-inspect-parquet": Snippet(),
    "data-inspect-memoryagentbench": Snippet(),
    "data-inspect-locomo": Snippet(),
    "data-load-error": Snippet(),
    "data-skip-bad": Snippet(),
    "data-synth": Snippet(),
    "data-inspect-synth": Snippet(after="data-synth"),
    "data-convert": Snippet(after="data-synth"),
    # docs/trl.md
    "trl-cold-start": Snippet(lowered=(
        ("--count 24", "--count 4"), ("--split test --count 4", "--split test --count 1"))),
    "trl-train": Snippet(after="trl-cold-start", check=_check_trl,
                         keep=("trainer.state.global_step", "trainer.state.log_history"), lowered=(
        ('"train": 64', '"train": 8'), ("max_steps=20", "max_steps=1"),
        ("gradient_accumulation_steps=4", "gradient_accumulation_steps=2"))),
}


def block_named(name: str) -> Block:
    (block,) = [b for b in ALL_BLOCKS if b.name == name]
    return block


def as_run(name: str, tiny: str) -> str:
    """The block's text with its declared substitutions made."""
    block, snippet = block_named(name), SNIPPETS[name]
    text = block.text
    for written, run in snippet.lowered:
        assert written in text, f"{block.where}: the declared substitution {written!r} is not in the block"
        text = text.replace(written, run.format(tiny=tiny))
    return text


def commands(script: str) -> list[list[str]]:
    """The command lines of a bash block, continuation lines joined and comments dropped."""
    lines = script.replace("\\\n", " ").splitlines()
    return [argv for line in lines if (argv := shlex.split(line, comments=True))]


def run_command(argv: list[str], monkeypatch) -> None:
    """One command line as the shell would run it, in this process: ``VAR=value`` prefixes set,
    ``memalpha`` (or ``.venv/bin/memalpha``) through :func:`memalpha.cli.main`, ``python -m MODULE``
    (or ``.venv/bin/python -m``) through :func:`runpy.run_module`; a non-zero exit fails."""
    from memalpha.cli import main

    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        key, value = argv.pop(0).split("=", 1)
        monkeypatch.setenv(key, value)
    try:
        if argv and argv[0] in ("memalpha", ".venv/bin/memalpha"):
            main(argv[1:])
        elif argv[:1] in (["python"], [".venv/bin/python"]) and argv[1:2] == ["-m"] and len(argv) > 2:
            monkeypatch.setattr(sys, "argv", [argv[2], *argv[3:]])
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            raise AssertionError(f"this test runs memalpha and python -m MODULE only: {shlex.join(argv)}")
    except SystemExit as exit_info:
        assert exit_info.code in (0, None), f"{shlex.join(argv)} exited with {exit_info.code}"


@contextlib.contextmanager
def captured():
    """stdout, stderr and the warnings logged, together in the order written, as a terminal shows them
    (Python prints a logged warning's message alone when no handler is set up; pytest sets its own)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        root.removeHandler(handler)


def run_console(text: str, monkeypatch) -> str:
    """Each ``$ `` command of a transcript, its printed lines compared with the lines shown after it."""
    steps = re.split(r"^\$ ", text, flags=re.MULTILINE)[1:]
    out = []
    for step in steps:
        command, _, shown = step.partition("\n")
        while command.endswith("\\"):
            more, _, shown = shown.partition("\n")
            command = command[:-1] + more.strip()
        with captured() as buffer:
            run_command(shlex.split(command), monkeypatch)
        printed = [line.rstrip() for line in buffer.getvalue().strip().splitlines()]
        expected = [line.rstrip() for line in shown.strip().splitlines()]
        assert printed == expected, f"$ {command}\nprinted:\n" + "\n".join(printed)
        out.append(buffer.getvalue())
    return "".join(out)


def run_pycon(text: str) -> None:
    test = doctest.DocTestParser().get_doctest(text, {}, "pycon", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def run_block(name: str, folder: Path, tiny: str, monkeypatch) -> Ran:
    """Run the snippet ``name`` in ``folder`` (already prepared)."""
    block = block_named(name)
    text = as_run(name, tiny)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if block.lang == "console":
        return Ran(folder, {}, run_console(text, monkeypatch))
    if block.lang == "pycon":
        run_pycon(text)
        return Ran(folder, {}, "")
    if block.lang == "python":
        return run_python(name, text, folder)
    with captured() as buffer:
        for argv in commands(text):
            run_command(argv, monkeypatch)
    return Ran(folder, {}, buffer.getvalue())


_PYTHON = """import json, runpy, sys
namespace = runpy.run_path(sys.argv[1], run_name="__main__")
values = {expression: eval(expression, namespace) for expression in json.loads(sys.argv[2])}
with open(sys.argv[3], "w") as out:
    json.dump(values, out, default=repr)
"""


def run_python(name: str, text: str, folder: Path) -> Ran:
    """A ``python`` block as a user runs it: a script in a fresh interpreter, in ``folder`` (a model
    an earlier in-process command loaded must not change what it does); the expressions the snippet
    keeps come back as JSON."""
    script, values = folder / f"snippet_{name}.py", folder / f"snippet_{name}.json"
    script.write_text(text, encoding="utf-8")
    process = subprocess.run(
        [sys.executable, "-c", _PYTHON, str(script), json.dumps(SNIPPETS[name].keep), str(values)],
        cwd=folder, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=False,
    )
    assert process.returncode == 0, f"{name} failed:\n{process.stderr[-3000:]}"
    return Ran(folder, json.loads(values.read_text(encoding="utf-8")), process.stdout)


def fresh_folder(folder: Path, tiny: str) -> None:
    """A working folder as a checkout has it: the configs (as run) and the test fixtures."""
    (folder / "configs").mkdir(parents=True)
    for config in sorted((REPO / "configs").glob("*.yaml")):
        original = yaml.safe_load(config.read_text(encoding="utf-8"))
        as_run_config = lowered_config(original, TINY_CONFIGS.get(config.name, {}), tiny)
        (folder / "configs" / config.name).write_text(yaml.safe_dump(as_run_config, sort_keys=False))
    (folder / "tests").mkdir()
    (folder / "tests" / "fixtures").symlink_to(REPO / "tests" / "fixtures")


@pytest.fixture(scope="session")
def snippet_runs(tmp_path_factory, tiny_model_dir):
    """``ran(name)``: the snippet, run once per session (in a copy of the folder of the one it follows)."""
    done: dict[str, Ran] = {}

    def ran(name: str) -> Ran:
        if name in done:
            return done[name]
        snippet = SNIPPETS[name]
        folder = tmp_path_factory.mktemp(name)
        shutil.rmtree(folder)
        if snippet.after is not None:
            shutil.copytree(ran(snippet.after).folder, folder, symlinks=True)
        else:
            fresh_folder(folder, tiny_model_dir)
        if snippet.inputs is not None:
            snippet.inputs(folder)
        with pytest.MonkeyPatch.context() as monkeypatch:
            done[name] = run_block(name, folder, tiny_model_dir, monkeypatch)
        return done[name]

    return ran


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet(name, snippet_runs):
    ran = snippet_runs(name)
    check = SNIPPETS[name].check
    if check is not None:
        check(ran)

