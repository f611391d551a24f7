"""The user docs stay true: the generated configuration reference is current, and no relative link is dead
(neither its file nor the heading its ``#anchor`` names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memalpha_lab.config_reference import OUTPUT, REPO_ROOT, docstring_args, main, render_reference

DOC_FILES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")])
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _link_targets(markdown: str) -> list[str]:
    """Targets of the markdown links in ``markdown`` outside code, URLs left out."""
    text = _INLINE_CODE.sub("", _FENCE.sub("", markdown))
    return [t for t in _LINK.findall(text) if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def relative_links(markdown: str) -> list[str]:
    """Targets of the markdown links in ``markdown`` that point into the repository (no URLs, no bare
    anchors)."""
    return [target.split("#", 1)[0] for target in _link_targets(markdown) if not target.startswith("#")]


def test_configuration_reference_is_current():
    expected = render_reference()
    current = (REPO_ROOT / OUTPUT).read_text(encoding="utf-8")
    assert current == expected, (
        f"{OUTPUT} is stale; regenerate it with `python -m memalpha_lab.config_reference`"
    )


def test_check_mode_exit_status_and_message(tmp_path, capsys, monkeypatch):
    import memalpha_lab.config_reference as reference

    # the comparison, not the rendering
    monkeypatch.setattr(reference, "render_reference", lambda: "# the page\n")
    page = tmp_path / "configuration.md"
    assert main(["--check", "--output", str(page)]) == 1
    assert "missing" in capsys.readouterr().err
    page.write_text("# an old page\n", encoding="utf-8")
    assert main(["--check", "--output", str(page)]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and "python -m memalpha_lab.config_reference" in err
    assert page.read_text(encoding="utf-8") == "# an old page\n"  # --check writes nothing
    assert main(["--output", str(page)]) == 0
    assert main(["--check", "--output", str(page)]) == 0


def test_reference_documents_every_knob():
    page = (REPO_ROOT / OUTPUT).read_text(encoding="utf-8")
    for option in (
        "`model.update.kl_coef`",
        "`model.rollout.group_size`",
        "`model.lora.r`",
        "`model.lm.precision`",
        "`model.reader.kind`",
        "`model.reward.beta`",
        "`model.optimizer.learning_rate`",
        "`data.instances_per_step`",
    ):
        assert option in page
    assert "kl_coef: 0.001" in page  # the resolved --print_config block is embedded


def test_docstring_args_joins_continuation_lines():
    class Example:
        """Something.

        Args:
            first: one line.
            second: starts here
                and goes on here.
            third: last: with a colon.

        Returns:
            nothing: not an argument.
        """

    assert docstring_args(Example) == {
        "first": "one line.",
        "second": "starts here and goes on here.",
        "third": "last: with a colon.",
    }


def anchored_links(markdown: str) -> list[tuple[str, str]]:
    """``(file, anchor)`` of the links in ``markdown`` that name a heading of a markdown page of the
    repository (``file`` is "" for the page itself)."""
    pairs = [tuple(target.split("#", 1)) for target in _link_targets(markdown) if "#" in target]
    return [(path, anchor) for path, anchor in pairs if path == "" or path.endswith(".md")]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: the heading's text without its links'
    targets, lower-cased, every character but letters, digits, ``_``, ``-`` and spaces dropped,
    spaces turned into ``-``; a repeated heading gets ``-1``, ``-2``, ... ."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _FENCE.sub("", markdown).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", words.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_heading_anchors_follow_github():
    text = (
        "# Fix 6: the head's backward (commits `576906a`)\n"
        "## bench_vs_trl: a [link](x.md) × 2\n## Again\n## Again\n"
    )
    assert heading_anchors(text) == {
        "fix-6-the-heads-backward-commits-576906a",
        "bench_vs_trl-a-link--2",
        "again",
        "again-1",
    }
    assert anchored_links("[a](#top) [b](x.md#sec) [c](../y.py#L3) [d](https://e.org/#x) [e](z.md)") == [
        ("", "top"), ("x.md", "sec")]


@pytest.mark.parametrize("page", DOC_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_anchor_names_a_heading(page: Path):
    dead = []
    for path, anchor in anchored_links(page.read_text(encoding="utf-8")):
        target = page if path == "" else page.parent / path
        if target.exists() and anchor not in heading_anchors(target.read_text(encoding="utf-8")):
            dead.append(f"{path}#{anchor}")
    assert not dead, f"{page.relative_to(REPO_ROOT)} links to headings that do not exist: {dead}"


def test_relative_links_are_found_and_urls_skipped():
    text = "[a](docs/x.md) [b](https://e.org) [c](#top) [d](../y.py#L3) `[e](no.md)`\n```\n[f](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md", "../y.py"]


@pytest.mark.parametrize("page", DOC_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_exists(page: Path):
    missing = [t for t in relative_links(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO_ROOT)} links to missing files: {missing}"


def test_docs_pages_exist():
    names = {p.name for p in DOC_FILES}
    for page in ("quickstart.md", "real_model.md", "data.md", "metrics_and_rewards.md", "configuration.md",
                 "multi_gpu.md", "results.md"):
        assert page in names, f"docs/{page} is missing"


def test_quickstart_lists_the_commands_the_demo_runs():
    from test_demo import demo_commands

    page = (REPO_ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    listed = [line.removeprefix(".venv/bin/memalpha ").split() for line in page.splitlines()
              if line.startswith(".venv/bin/memalpha ")]
    commands = demo_commands()
    assert listed[: len(commands)] == commands