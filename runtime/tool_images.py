"""Images in tool results (``ToolResult.images``): the bounds a result's images are held to, the
notes the model reads instead of a dropped image, and the ``user`` message that carries a step's
images to an endpoint that accepts them (OpenAI chat completions allow no image parts in a
``tool`` message). Pure: no database, no network (docs/model-client.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from runtime.model_images import MAX_DATA_URL_BYTES, ImageEndpoint
from runtime.types import Message, ToolCall

#: Images one tool result may carry; the rest are dropped with a note.
MAX_RESULT_IMAGES = 4
#: The text part that opens the message carrying a step's tool images (compaction knows such a
#: message by it and keeps it with the tool results it belongs to).
IMAGES_HEADER = "[Images returned by the tool calls above, as part of their results]"
_DATA_URL = re.compile(r"^data:image/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/=]+$")
__all__ = [
    "IMAGES_HEADER", "MAX_RESULT_IMAGES", "ImageEndpoint", "bounded_images", "image_count",
    "images_message", "is_images_message", "not_shown_note",
]  # fmt: skip


def bounded_images(images: Sequence[Any]) -> tuple[tuple[str, ...], list[str]]:
    """The images a result may pass on (``data:image/...;base64,`` URLs of at most
    ``MAX_DATA_URL_BYTES``, at most ``MAX_RESULT_IMAGES``), in order, and a note per drop."""
    kept: list[str] = []
    notes: list[str] = []
    for number, url in enumerate(images, start=1):
        if not isinstance(url, str) or not url.startswith("data:image/"):
            notes.append(f"[image {number} dropped: not a data:image/<type>;base64 URL]")
        elif len(url) > MAX_DATA_URL_BYTES:
            limit = MAX_DATA_URL_BYTES // (1024 * 1024)
            notes.append(
                f"[image {number} ({_mime(url)}, about {_size(url):,} bytes) dropped: larger "
                f"than the {limit} MB limit for an image of a tool result]"
            )
        elif not _DATA_URL.match(url):
            notes.append(f"[image {number} dropped: not a data:image/<type>;base64 URL]")
        elif len(kept) == MAX_RESULT_IMAGES:
            notes.append(
                f"[image {number} dropped: at most {MAX_RESULT_IMAGES} images of a tool result "
                "are passed on]"
            )
        else:
            kept.append(url)
    return tuple(kept), notes


def not_shown_note(count: int, endpoint_name: str) -> str:
    """What the model reads instead of ``count`` images its endpoint does not accept."""
    images = "1 image" if count == 1 else f"{count} images"
    return (
        f"[{images} of this result not shown: the model endpoint "
        f"{endpoint_name or '(unnamed)'!r} does not accept images (its vision setting is off)]"
    )


def images_message(calls: Sequence[tuple[ToolCall, Sequence[str]]]) -> Message:
    """The ``user`` message after a step's tool messages: the header, then per call a text part
    naming it and its images as ``image_url`` parts."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": IMAGES_HEADER}]
    for call, urls in calls:
        parts.append({"type": "text", "text": f"From tool call {call.id} ({call.name}):"})
        parts.extend({"type": "image_url", "image_url": {"url": url}} for url in urls)
    return {"role": "user", "content": parts}


def is_images_message(message: Message) -> bool:
    """Whether ``message`` is one :func:`images_message` made."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list) or not content:
        return False
    first = content[0]
    return isinstance(first, dict) and first.get("text") == IMAGES_HEADER


def image_count(message: Message) -> int:
    """The ``image_url`` parts of ``message``'s content."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image_url")


def _mime(url: str) -> str:
    return url[5 : url.find(";")] if url.startswith("data:") and ";" in url else "image"


def _size(url: str) -> int:
    return (len(url) - url.find(",") - 1) * 3 // 4
