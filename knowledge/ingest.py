"""From a document's bytes to searchable chunks (pure): the text of plain text, Markdown and
HTML (the standard library's parser; scripts and styles dropped) and the text layer of PDF
(``knowledge.pdf``), then deterministic chunks
of about ``CHUNK_CHARS`` characters cut at paragraph boundaries, each beginning with the last
few words of the one before (``OVERLAP_CHARS``).

Other types are refused (:class:`UnsupportedDocument`, a 415 naming the supported types).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePosixPath

from rest_framework import status

from knowledge.pdf import UnreadablePdf, pdf_text
from orchestrator.errors import DomainError

CHUNK_CHARS = 800
OVERLAP_CHARS = 120
#: Content type → the extensions that imply it.
SUPPORTED = {
    "text/plain": (".txt", ".text", ".rst", ".csv", ".log"),
    "text/markdown": (".md", ".markdown"),
    "text/html": (".html", ".htm"),
    "application/pdf": (".pdf",),
}
SUPPORTED_TEXT = "text/plain, text/markdown, text/html or application/pdf (.txt, .md, .html, .pdf)"
_ALIASES = {"text/x-markdown": "text/markdown", "application/xhtml+xml": "text/html"}
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")
_SPACES = re.compile(r"[ \t\f\v\r]+")


class UnsupportedDocument(DomainError):
    status_code = status.HTTP_415_UNSUPPORTED_MEDIA_TYPE
    problem_type = "unsupported-document"
    title = "Unsupported document type"


class UnreadableDocument(DomainError):
    problem_type = "unreadable-document"
    title = "The document cannot be read"


@dataclass(frozen=True)
class ExtractedText:
    content_type: str
    text: str
    sha256: str


def content_type_of(name: str, declared: str = "") -> str:
    """The supported content type of a document called ``name`` (the declared type first,
    parameters dropped; the extension when none or a generic one is declared)."""
    kind = declared.split(";", 1)[0].strip().lower()
    kind = _ALIASES.get(kind, kind)
    if kind in SUPPORTED:
        return kind
    if kind in ("", "application/octet-stream"):
        suffix = PurePosixPath(name.lower()).suffix
        for candidate, suffixes in SUPPORTED.items():
            if suffix in suffixes:
                return candidate
    shown = kind or PurePosixPath(name).suffix or "no type"
    raise UnsupportedDocument(
        f"{name}: {shown} is not supported; upload {SUPPORTED_TEXT}.",
        supported=sorted(SUPPORTED),
    )


def extract(name: str, raw: bytes, declared: str = "") -> ExtractedText:
    """The text of a document, or a 415/400 problem saying why there is none."""
    kind = "application/pdf" if raw.startswith(b"%PDF-") else content_type_of(name, declared)
    if kind == "application/pdf":
        try:
            text = pdf_text(name, raw)
        except UnreadablePdf as exc:
            raise UnreadableDocument(str(exc)) from exc
        return ExtractedText("application/pdf", normalise(text), hashlib.sha256(raw).hexdigest())
    try:
        decoded = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnreadableDocument(f"{name}: the document is not UTF-8 text.") from None
    if "\x00" in decoded:
        raise UnreadableDocument(f"{name}: the document holds NUL characters (binary data).")
    text = html_text(decoded) if kind == "text/html" else decoded
    return ExtractedText(kind, normalise(text), hashlib.sha256(raw).hexdigest())


def normalise(text: str) -> str:
    """Line ends made ``\\n``, runs of spaces one space, trailing spaces and extra blank lines
    gone."""
    lines = [_SPACES.sub(" ", line).strip() for line in text.replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class _TextOfHtml(HTMLParser):
    """Text of an HTML page: block elements end lines, scripts and styles are dropped."""

    BLOCKS = frozenset(
        [
            "p",
            "div",
            "br",
            "li",
            "ul",
            "ol",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "tr",
            "table",
            "section",
            "article",
            "header",
            "footer",
            "pre",
            "blockquote",
            "hr",
            "dt",
            "dd",
            "title",
        ]
    )
    SKIPPED = frozenset({"script", "style", "noscript", "template", "svg"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIPPED:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_text(page: str) -> str:
    parser = _TextOfHtml()
    parser.feed(page)
    parser.close()
    return "".join(parser.parts)


def chunk_text(text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[str]:
    """``text`` cut into chunks of at most about ``size`` characters at paragraph (then
    sentence, then word) boundaries; each chunk after the first starts with the last words
    (up to ``overlap`` characters) of the one before. The same text always gives the same
    chunks."""
    pieces: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        paragraph = paragraph.strip()
        if paragraph:
            pieces += _pieces(paragraph, size)
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > size:
            chunks.append(current)
            tail = _tail(current, overlap)
            current = f"{tail} {piece}" if tail else piece
        else:
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def _pieces(paragraph: str, size: int) -> list[str]:
    """A paragraph as parts of at most ``size`` characters (sentences, then words)."""
    if len(paragraph) <= size:
        return [paragraph]
    parts: list[str] = []
    current = ""
    for sentence in _SENTENCE.split(paragraph):
        for word in _words(sentence, size):
            if current and len(current) + 1 + len(word) > size:
                parts.append(current)
                current = word
            else:
                current = f"{current} {word}" if current else word
    if current:
        parts.append(current)
    return parts


def _words(sentence: str, size: int) -> list[str]:
    if len(sentence) <= size:
        return [sentence]
    words: list[str] = []
    for word in sentence.split():
        words += [word[i : i + size] for i in range(0, len(word), size)]
    return words


def _tail(chunk: str, overlap: int) -> str:
    """The last whole words of ``chunk`` within ``overlap`` characters."""
    if overlap <= 0:
        return ""
    tail = chunk[-overlap:]
    words = tail.split()
    if len(chunk) > overlap and not chunk[-overlap - 1].isspace() and not tail[0].isspace():
        words = words[1:]  # a cut word
    return " ".join(words)
