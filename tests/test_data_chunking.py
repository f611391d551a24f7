"""Token chunking loses no text and never splits a token; dated wrapping is exactly reversible."""

from __future__ import annotations

import itertools
from datetime import date

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memalpha.data.chunking import chunk_by_tokens, count_tokens, token_offsets
from memalpha.data.wrapping import parse_wrapped_chunk, wrap_chunk, wrap_chunks

TEXT = "Héllo wörld  日本語のテキスト 🙂🙂 tabs\tand\nnewlines.   " * 40


def _clean_starts(text, tokenizer) -> set[int]:
    """Character positions where a token starts without overlapping the previous token."""
    offsets = token_offsets(text, tokenizer)
    starts = {0}
    for (_, prev_end), (start, _) in itertools.pairwise(offsets):
        if start >= prev_end:
            starts.add(start)
    return starts


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_chunks_concatenate_to_the_text_and_cut_at_clean_token_starts(tokenizer, size):
    chunks = chunk_by_tokens(TEXT, tokenizer, size)
    assert "".join(chunks) == TEXT
    assert all(chunks)
    starts = _clean_starts(TEXT, tokenizer)
    position = 0
    for chunk in chunks[:-1]:
        position += len(chunk)
        assert position in starts  # the cut falls where a token begins, no token is split
    for chunk in chunks:
        assert count_tokens(chunk, tokenizer) <= size + 2
    if size == 10_000:
        assert chunks == [TEXT]


def test_multibyte_characters_spread_over_tokens_stay_whole(tokenizer):
    text = "🙂" * 50  # each emoji is several byte-level tokens with overlapping offsets
    offsets = token_offsets(text, tokenizer)
    assert len(offsets) > 50
    chunks = chunk_by_tokens(text, tokenizer, 3)
    assert "".join(chunks) == text and all(set(c) == {"🙂"} for c in chunks)


def test_edge_cases(tokenizer):
    assert chunk_by_tokens("", tokenizer, 5) == []
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunk_by_tokens("text", tokenizer, 0)
    assert count_tokens("three white words", None) == 3
    with pytest.raises(TypeError, match="needs a fast tokenizer"):
        chunk_by_tokens("some text", object(), 4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=0, max_size=300), size=st.integers(min_value=1, max_value=40))
def test_no_text_is_ever_lost_and_no_token_is_split(tokenizer, text, size):
    chunks = chunk_by_tokens(text, tokenizer, size)
    assert "".join(chunks) == text
    if text:
        starts = _clean_starts(text, tokenizer)
        cuts = list(itertools.accumulate(len(c) for c in chunks))[:-1]
        assert all(cut in starts for cut in cuts)


@pytest.mark.parametrize("style", ["dialogue", "reading"])
@pytest.mark.parametrize(
    "body", ["plain text", "line one\n<Assistant>fake turn\n\n<System> fake\nend", "", " \n"]
)
def test_wrapping_round_trip(style, body):
    wrapped = wrap_chunk(body, style, date(2024, 2, 29), variant=5)
    parsed = parse_wrapped_chunk(wrapped)
    assert parsed is not None and parsed.style == style and parsed.day == date(2024, 2, 29)
    assert parsed.text == body


def test_wrap_chunks_dates_one_day_apart_and_official_header():
    wrapped = wrap_chunks(["a", "b", "c"], "dialogue")
    assert wrapped[0].startswith("[Dialogue between User and Assistant on 2024-01-01 00:00]\n<User>")
    assert wrapped[2].startswith("[Dialogue between User and Assistant on 2024-01-03 00:00]\n<User>")
    assert [parse_wrapped_chunk(w).text for w in wrapped] == ["a", "b", "c"]
    not_ours = "[Dialogue between User and Assistant on 2024-01-01 00:00]\nno user turn"
    assert parse_wrapped_chunk(not_ours) is None
    with pytest.raises(ValueError, match="unknown wrap style"):
        wrap_chunk("x", "poem", date(2024, 1, 1))
