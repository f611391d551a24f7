"""``memalpha --help`` lists every command, each listed command answers ``--help``, and what
memalpha does not offer (Lightning's ``test``, a typo) stops with one line saying what to use."""

from __future__ import annotations

import lightning.pytorch  # noqa: F401 - its log handler must bind the session's stderr, not one test's capsys
import pytest

from memalpha.cli import COMMANDS, REPLACED, run


def test_help_lists_every_command_with_its_line(capsys):
    assert run(["--help"]) is None
    printed = capsys.readouterr().out
    listed = [line.split()[0] for line in printed.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()]
    assert listed == list(COMMANDS)
    for name, line in COMMANDS.items():
        assert f"  {name.ljust(max(map(len, COMMANDS)))}  {line}\n" in printed
    assert set(COMMANDS) >= {"fit", "validate", "predict", "sft", "compare", "data", "prompts"}
    assert not set(REPLACED) & set(COMMANDS)


def test_no_command_prints_the_help_and_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run([])
    assert exit_info.value.code == 2 and "commands:" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_listed_command_answers_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out.lower()


def test_memalpha_test_points_at_validate_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["test", "--config", "configs/tiny_cpu.yaml"])
    message = str(exit_info.value.code)
    assert message == ("memalpha test: error: memalpha has no test stage: score held-out sets with "
                       "'memalpha validate' (data.val_path)")


def test_an_unknown_command_names_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["tain", "--config", "configs/tiny_cpu.yaml"])
    assert str(exit_info.value.code) == (
        f"memalpha: error: unknown command 'tain'; commands: {', '.join(COMMANDS)}"
    )
