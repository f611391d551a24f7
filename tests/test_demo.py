"""``make demo`` (the Makefile's ``demo`` target) runs ``memalpha`` commands only, docs/quickstart.md's,
after clearing what an earlier demo left, and its before/after table is ``memalpha compare``'s."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from memalpha.cli import COMMANDS
from memalpha.commands.compare import format_result

REPO = Path(__file__).resolve().parents[1]


def demo_recipe() -> list[str]:
    """The shell lines of the Makefile's ``demo`` target."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^demo: .*?\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, "the Makefile has no demo target"
    return [line.strip() for line in match.group(1).splitlines()]


def demo_commands() -> list[list[str]]:
    """The demo's ``memalpha`` commands, their arguments split (the ``$(MEMALPHA)`` lines)."""
    prefix = "$(MEMALPHA) "
    return [shlex.split(line.removeprefix(prefix)) for line in demo_recipe() if line.startswith(prefix)]


def test_the_demo_clears_its_outputs_then_runs_listed_memalpha_commands_only():
    recipe = demo_recipe()
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "MEMALPHA := HF_HUB_OFFLINE=1 $(VENV)/bin/memalpha" in makefile
    outputs = re.search(r"^DEMO_OUTPUTS := (.*)$", makefile, re.MULTILINE).group(1).split()
    assert recipe[0] == "rm -rf $(DEMO_OUTPUTS)"
    assert set(outputs) == {"runs/demos", "runs/sft_tiny_cpu", "runs/tiny_cpu", "runs/demo_summary.json"}
    commands = demo_commands()
    assert len(commands) == len(recipe) - 1, "a demo line that is not a memalpha command"
    assert all(command[0] in COMMANDS for command in commands)
    names = ["data", "data", "validate", "sft", "validate", "fit", "compare"]
    assert [command[0] for command in commands] == names
    last = commands[-1]
    assert last[:4] == ["compare", "runs/tiny_cpu/base", "runs/tiny_cpu/sft", "runs/tiny_cpu/grpo"]
    assert last[last.index("--out") + 1] == "runs/demo_summary.json"


def test_the_committed_summary_is_what_compare_writes():
    summary = json.loads((REPO / "experiments" / "results" / "demo_summary.json").read_text(encoding="utf-8"))
    assert [r["label"] for r in summary["reports"]] == ["base", "sft", "grpo"]
    assert [(c["before"], c["after"]) for c in summary["changes"]] == [("base", "sft"), ("sft", "grpo")]
    assert summary["notes"] == []  # the demo's reports record their settings, and they agree
    assert "grpo - sft: mean change per instance" in format_result(summary)
