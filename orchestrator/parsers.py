"""The API's one request parser: JSON, bounded in size, depth and content.

:class:`BoundedJSONParser` reads at most ``LOOPWRIGHT_MAX_BODY_BYTES`` (413 problem beyond,
for bodies sent without a Content-Length too) and parses with
:func:`orchestrator.jsonlimits.loads_bounded`: nesting deeper than ``MAX_DEPTH``, NUL
characters, unpaired surrogates and non-finite numbers are 400 problems whose pointer names the
place (``/inputs/note``), on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from orchestrator.jsonlimits import JsonRefused, loads_bounded


def max_body_bytes() -> int:
    """The largest request body accepted (``LOOPWRIGHT_MAX_BODY_BYTES``)."""
    return int(settings.LOOPWRIGHT_MAX_BODY_BYTES)


def read_bounded(stream: IO[bytes] | None) -> bytes:
    """The whole body, or :class:`PayloadTooLarge` once it passes the limit."""
    from orchestrator.errors import PayloadTooLarge  # errors imports DRF's views, which load us

    if stream is None:
        return b""
    limit = max_body_bytes()
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(limit)
    return raw


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser with the bounds of :mod:`orchestrator.jsonlimits`."""

    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_bounded(stream)
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - the body is not valid {encoding}.") from exc
        try:
            return loads_bounded(text)
        except JsonRefused as exc:
            from orchestrator.errors import refused_json

            raise refused_json(exc) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
