"""The text layer of a PDF (pypdf): page by page, pages separated by a blank line.

Only text a PDF holds is read: a scanned page has none (no OCR). Encrypted files, files pypdf
cannot parse, more than ``MAX_PAGES`` pages or more than ``MAX_TEXT_CHARS`` characters of text
are refused (:class:`UnreadablePdf`, its message naming the document).
"""

from __future__ import annotations

import io
import logging

from pypdf import PdfReader
from pypdf.errors import PyPdfError

MAX_PAGES = 2_000
MAX_TEXT_CHARS = 20_000_000

# pypdf logs every malformed object it recovers from; one problem line per document is enough.
logging.getLogger("pypdf").setLevel(logging.ERROR)


class UnreadablePdf(ValueError):
    """The PDF has no text to read, or cannot be read."""


def pdf_text(name: str, raw: bytes) -> str:
    """The text of every page of ``raw``, in order."""
    try:
        reader = PdfReader(io.BytesIO(raw), strict=False)
        if reader.is_encrypted:
            raise UnreadablePdf(f"{name}: the PDF is encrypted; upload a copy without a password.")
        if len(reader.pages) > MAX_PAGES:
            raise UnreadablePdf(
                f"{name}: the PDF has {len(reader.pages):,} pages; at most {MAX_PAGES:,} are read."
            )
        pages: list[str] = []
        size = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            size += len(text)
            if size > MAX_TEXT_CHARS:
                raise UnreadablePdf(
                    f"{name}: the PDF holds more than {MAX_TEXT_CHARS:,} characters of text."
                )
            pages.append(text)
    except UnreadablePdf:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise UnreadablePdf(f"{name}: the PDF cannot be parsed ({exc}).") from exc
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise UnreadablePdf(f"{name}: the PDF has no text layer (a scan?); nothing to search.")
    return text
