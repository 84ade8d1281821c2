"""OpenAPI post-processing: the problem+json answers every operation can give, documented.

Referenced from ``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``; a pure function of the schema.
Views document their own success answers and any error worth its own description; this adds the
ones the platform gives everywhere (authentication, permissions, malformed input, body limits,
missing objects, conflicting writes), each as ``application/problem+json`` (RFC 9457), and
marks request bodies closed (``additionalProperties: false``): the API refuses unknown top-level
fields (``orchestrator.strict``), and the schema says so.
"""

from __future__ import annotations

from typing import Any

PROBLEM_MEDIA_TYPE = "application/problem+json"
_EVENT_STREAM = "text/event-stream"
#: One server-sent event carrying a problem: ``event: error``, ``data:`` the problem as JSON.
_ERROR_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["error"]},
        "data": {"type": "string", "description": "The problem (RFC 9457) as JSON."},
    },
    "required": ["event", "data"],
}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error (RFC 9457). Field errors are listed in `errors` with JSON Pointers.",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "request_id": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "pointer": {"type": "string"},
                    "detail": {"type": "string"},
                    "code": {"type": "string"},
                },
                "additionalProperties": True,
            },
        },
    },
    "required": ["type", "title", "status"],
    "additionalProperties": True,
}
_DESCRIPTIONS = {
    "400": "Invalid input: the problem names each field (`errors`, JSON Pointers).",
    "401": "No or unknown credentials.",
    "403": "The credentials lack the role this operation needs.",
    "404": "No such object.",
    "405": (
        "The method is not allowed on this path: the path parameter names one of the "
        "collection's own actions (a profile tagged `compile`, for instance)."
    ),
    "409": "The write conflicts with the object's current state.",
    "413": "The request body is larger than the limit the problem names.",
    "415": "The request body's media type is not accepted.",
}
_WRITES = frozenset({"post", "put", "patch", "delete"})
_METHODS = frozenset({"get", "head", "options", *_WRITES})


def _problem_statuses(method: str, operation: dict[str, Any]) -> list[str]:
    """The platform's error answers for one operation."""
    statuses = ["400"]
    if operation.get("security") != [] and operation.get("security") != [{}]:
        statuses += ["401", "403"]
    if any(param.get("in") == "path" for param in operation.get("parameters", [])):
        statuses += ["404", "405"]
    if method in _WRITES:
        statuses.append("409")
    if "requestBody" in operation:
        statuses += ["413", "415"]
    return statuses


def _close_request_bodies(result: dict[str, Any]) -> None:
    """``additionalProperties: false`` on every JSON request body object that has properties."""
    schemas = result.get("components", {}).get("schemas", {})
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in _METHODS:
                continue
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                body = media.get("schema", {})
                ref = body.get("$ref", "")
                if ref.startswith("#/components/schemas/"):
                    body = schemas.get(ref.rsplit("/", 1)[-1], {})
                if body.get("type") == "object" and "properties" in body:
                    body.setdefault("additionalProperties", False)


def add_problem_responses(
    result: dict[str, Any], generator: object, request: object, public: bool
) -> dict[str, Any]:
    """Document the problem+json answers of every operation, and the ``Problem`` component;
    close the request bodies."""
    _close_request_bodies(result)
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = _PROBLEM_SCHEMA
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status in _problem_statuses(method, operation):
                responses.setdefault(status, {"description": _DESCRIPTIONS[status]})
            streams = any(
                _EVENT_STREAM in response.get("content", {})
                for status, response in responses.items()
                if str(status).startswith("2")
            )
            for status, response in responses.items():
                if str(status).startswith("4"):
                    content = response.setdefault("content", {})
                    content.setdefault(PROBLEM_MEDIA_TYPE, {"schema": _PROBLEM_REF})
                    if streams:  # an EventSource client gets the problem as an `error` event
                        content.setdefault(_EVENT_STREAM, {"schema": _ERROR_EVENT})
    return result
