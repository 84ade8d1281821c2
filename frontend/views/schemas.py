"""``/ui/schemas/<name>.json``: the JSON Schemas the UI's JSON fields are checked against as
they are typed (``frontend/static/frontend/editor.js``), generated from the same pydantic
models the services validate with, so the browser and the server agree on the allowed keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from frontend.access import ui_view
from harness.schema import export_json_schema
from loops.policy import PatternPolicy


def _pattern_policy() -> dict[str, Any]:
    return PatternPolicy.model_json_schema(by_alias=True)


SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "pattern-policy": _pattern_policy,
    "harness-settings": export_json_schema,
}


@ui_view()
def json_schema(request: HttpRequest, name: str) -> HttpResponse:
    make = SCHEMAS.get(name)
    if make is None:
        raise Http404(f"There is no schema {name!r}.")
    response = JsonResponse(make())
    response["Cache-Control"] = "private, max-age=300"
    return response
