"""Images a run is given (``inputs["images"]``): the trigger's check and the content parts the
goal message carries them in. Pure: no database, no network (docs/runs.md, docs/model-client.md).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

IMAGES_KEY = "images"
MAX_IMAGES = 8
#: A ``data:`` URL's size limit (its characters: the base64 text of the image and its header).
MAX_DATA_URL_BYTES = 5 * 1024 * 1024
_DATA_URL = re.compile(r"^data:image/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/=\s]+$")


class ImagesRefused(Exception):
    """The run was given images and the employee's endpoint does not accept them."""


class ImageEndpoint(Protocol):
    """The model endpoint an invocation talks to, as far as images go (``ToolLoopInvoker``)."""

    @property
    def vision(self) -> bool:
        """Whether the endpoint accepts image content parts."""
        ...

    @property
    def endpoint_name(self) -> str: ...


def refuse_images(inputs: Any, endpoint: ImageEndpoint) -> None:
    """Raise :class:`ImagesRefused` when the run was given images ``endpoint`` does not accept."""
    if input_images(inputs) and not endpoint.vision:
        raise ImagesRefused(
            f"The run was given images (inputs.images) but the model endpoint "
            f"{endpoint.endpoint_name or '(unnamed)'!r} does not accept images "
            "(its vision setting is off)."
        )


def image_input_problems(inputs: Any) -> list[dict[str, str]]:
    """Every problem of ``inputs["images"]`` as ``{pointer, detail, code}`` (pointers from the
    request's root: ``/inputs/images/0``); empty when there are none or they are fine."""
    if not isinstance(inputs, dict) or IMAGES_KEY not in inputs:
        return []
    images = inputs[IMAGES_KEY]
    where = f"/inputs/{IMAGES_KEY}"
    if not isinstance(images, list):
        return [_problem(where, "A list of image URLs (https:// or data:image/...;base64,).")]
    if len(images) > MAX_IMAGES:
        return [_problem(where, f"At most {MAX_IMAGES} images ({len(images)} given).")]
    problems = []
    for index, url in enumerate(images):
        detail = _url_problem(url)
        if detail:
            problems.append(_problem(f"{where}/{index}", detail))
    return problems


def _url_problem(url: Any) -> str:
    if not isinstance(url, str):
        return "An image URL string."
    if url.startswith("https://"):
        return "" if len(url) <= 2048 and not any(c.isspace() for c in url) else "A bad URL."
    if url.startswith("data:"):
        if len(url) > MAX_DATA_URL_BYTES:
            return f"A data URL of at most {MAX_DATA_URL_BYTES // (1024 * 1024)} MB."
        if not _DATA_URL.match(url):
            return "A data URL must be data:image/<type>;base64,<data>."
        return ""
    return "Only https:// and data:image/...;base64, URLs are accepted."


def _problem(pointer: str, detail: str) -> dict[str, str]:
    return {"pointer": pointer, "detail": detail, "code": "invalid_image"}


def input_images(inputs: Any) -> list[str]:
    """The run's image URLs (checked at the trigger), in order; [] when there are none."""
    if not isinstance(inputs, dict):
        return []
    images = inputs.get(IMAGES_KEY)
    return [url for url in images if isinstance(url, str)] if isinstance(images, list) else []


def without_images(inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` without the images (they go as content parts, not in the Inputs block)."""
    if not input_images(inputs):
        return inputs
    return {key: value for key, value in inputs.items() if key != IMAGES_KEY}


def image_parts(text: str, images: list[str]) -> list[dict[str, Any]]:
    """An OpenAI content-part array: ``text``, then one ``image_url`` part per image."""
    return [
        {"type": "text", "text": text},
        *({"type": "image_url", "image_url": {"url": url}} for url in images),
    ]
