"""From bytes to chunks (pure): text of plain text, Markdown, HTML and PDF; other types refused
naming the supported types, a PDF without text refused; chunks of about 800 characters at paragraph boundaries, with a
small overlap, the same every time."""

from __future__ import annotations

from itertools import pairwise

import pytest

from knowledge.ingest import (
    CHUNK_CHARS,
    OVERLAP_CHARS,
    UnreadableDocument,
    UnsupportedDocument,
    chunk_text,
    content_type_of,
    extract,
)
from tests.support.pdf import text_pdf

PARAGRAPHS = [f"Paragraph {i}. " + " ".join(f"word{i}x{j}" for j in range(30)) for i in range(40)]
TEXT = "\n\n".join(PARAGRAPHS)


def test_chunks_are_bounded_deterministic_and_overlap() -> None:
    chunks = chunk_text(TEXT)
    assert chunks == chunk_text(TEXT)
    assert len(chunks) > 5
    assert all(len(chunk) <= CHUNK_CHARS + OVERLAP_CHARS + 2 for chunk in chunks)
    for before, after in pairwise(chunks):
        overlap = after.split("Paragraph", 1)[0].strip()
        assert overlap and before.endswith(overlap)
        assert len(overlap) <= OVERLAP_CHARS
    for paragraph in PARAGRAPHS:  # whole paragraphs are never cut when they fit
        assert any(paragraph in chunk for chunk in chunks)


def test_a_paragraph_longer_than_a_chunk_is_cut_at_sentences_and_words() -> None:
    long = " ".join(["A sentence of several words ends here."] * 60) + " " + "x" * 2000
    chunks = chunk_text(long)
    assert len(chunks) > 3
    assert all(len(chunk) <= CHUNK_CHARS + OVERLAP_CHARS + 2 for chunk in chunks)
    assert "".join(chunks).count("x") >= 2000


def test_short_and_empty_texts() -> None:
    assert chunk_text("one line") == ["one line"]
    assert chunk_text("") == []
    assert chunk_text("\n\n  \n") == []


def test_html_is_stripped_to_text_without_scripts_or_styles() -> None:
    page = (
        b"<html><head><title>Leave</title><style>p{color:red}</style>"
        b"<script>alert('x')</script></head><body><h1>Paid leave</h1><p>Thirty&nbsp;days "
        b"a <b>year</b>.</p><ul><li>one</li><li>two</li></ul></body></html>"
    )
    extracted = extract("leave.html", page)
    assert extracted.content_type == "text/html"
    assert "alert" not in extracted.text and "color" not in extracted.text
    assert "Paid leave" in extracted.text
    assert "Thirty\xa0days a year." in extracted.text or "Thirty days a year." in extracted.text
    assert "one\n\ntwo" in extracted.text


def test_content_types_by_declaration_or_extension() -> None:
    assert content_type_of("a.md") == "text/markdown"
    assert content_type_of("a.MARKDOWN", "application/octet-stream") == "text/markdown"
    assert content_type_of("a", "text/plain; charset=utf-8") == "text/plain"
    assert content_type_of("page.htm") == "text/html"
    assert content_type_of("x.bin", "text/x-markdown") == "text/markdown"


@pytest.mark.parametrize(
    ("name", "raw", "declared"),
    [
        ("image.png", b"\x89PNG", ""),
        ("data", b"abc", "application/json"),
    ],
)
def test_other_types_are_refused_naming_the_supported_ones(
    name: str, raw: bytes, declared: str
) -> None:
    with pytest.raises(UnsupportedDocument) as refused:
        extract(name, raw, declared)
    assert refused.value.status_code == 415
    assert "text/markdown" in refused.value.detail and "application/pdf" in refused.value.detail


def test_the_text_layer_of_a_pdf_is_read_page_by_page() -> None:
    raw = text_pdf([["Leave policy", "Holidays: 25 days (paid)."], ["Page two: on call."]])
    read = extract("policy.pdf", raw)
    assert read.content_type == "application/pdf"
    assert read.text == "Leave policy\nHolidays: 25 days (paid).\n\nPage two: on call."
    assert extract("policy", raw, "application/octet-stream").text == read.text


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"%PDF-1.7 truncated", "cannot be parsed"),
        (text_pdf([[]]), "no text layer"),
        (b"%PDF-1.4 disguised as text", "cannot be parsed"),
    ],
)
def test_a_pdf_without_readable_text_is_refused(raw: bytes, reason: str) -> None:
    with pytest.raises(UnreadableDocument) as refused:
        extract("scan.pdf", raw, "text/plain" if b"disguised" in raw else "")
    assert reason in refused.value.detail and "scan.pdf" in refused.value.detail


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00bad", b"nul \x00 inside"])
def test_binary_text_is_refused(raw: bytes) -> None:
    with pytest.raises(UnreadableDocument):
        extract("a.txt", raw)


def test_the_digest_is_of_the_bytes_and_a_bom_is_dropped() -> None:
    plain = extract("a.txt", b"hello")
    bom = extract("a.txt", b"\xef\xbb\xbfhello")
    assert plain.text == bom.text == "hello"
    assert plain.sha256 != bom.sha256
