"""OpenAPI post-processing: resource tags, and the problem+json answers operations can give.

Referenced from ``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``; pure functions of the schema.
``tag_operations`` tags each operation by its resource (the path's first segment after
``/api/v1/``) and describes the tags. ``add_problem_responses`` adds the ``Problem`` component
(what ``orchestrator.errors`` sends) and, as ``application/problem+json`` (RFC 9457), the error
answers an operation can give: 400 when it reads input, 401/403 when it checks credentials, 404
when its path names an object, 405 where a path parameter can name a collection's action, 409
where its service raises ``Conflict`` (``CONFLICTS``), 413/415 when it takes a body. Views
document their own success answers and any error worth its own description (429, say). It also
marks request bodies closed (``additionalProperties: false``): the API refuses unknown
top-level fields (``orchestrator.strict``), and the schema says so.
"""

from __future__ import annotations

import re
from typing import Any

PROBLEM_MEDIA_TYPE = "application/problem+json"
API_PREFIX = "/api/v1/"
#: One tag per resource (the path's first segment after ``/api/v1/``), with its description.
TAGS: dict[str, str] = {
    "a2a-agents": "Remote A2A agents the loops may call as tools (connectors).",
    "api-tokens": "API tokens by prefix: who holds them, expiry, revocation, daily quotas.",
    "approvals": "Gated tool calls and questions waiting for a human decision.",
    "chat-completions": "The record of calls to the OpenAI-compatible endpoint.",
    "employee-grants": "Who may call which AI employee at the OpenAI-compatible endpoint.",
    "employees": "AI employees: model, harness, guardrails and sub-agents.",
    "event-keys": "Keys that let outside systems start runs by webhook.",
    "events": "Webhook deliveries that start runs (a bearer token or the key's signature).",
    "harness-profiles": "Versioned harness profiles: drafts, publishing, compilation.",
    "instructions": "Versioned instruction texts the harness layers include.",
    "knowledge-bases": "Knowledge bases: documents, syncs, search and who may read them.",
    "mcp-servers": "Outside MCP servers whose tools the loops may call.",
    "memories": "Remembered items of the AI employees, and their uses.",
    "model-aliases": "Names for model endpoints, resolved when a run starts.",
    "model-endpoints": "The model servers the loops call, and their prices.",
    "patterns": "Loop patterns: roles, policy, triggers; start runs from them.",
    "retrievals": "The record of knowledge searches made by runs, chats and people.",
    "runs": "Runs of a pattern: status, events, steps, spans, artifacts and human actions.",
    "skill-directories": "Folders whose skills are imported into the Skill Hub.",
    "skill-executions": "Runs of Skill Hub skills: status, events, output files.",
    "skills": "Skill Hub skills: sandboxed programs offered as tools (also over MCP).",
}
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
    "title": "Problem",
    "description": (
        "An error (RFC 9457), as `orchestrator.errors` sends it. Field errors are listed in "
        "`errors` with JSON Pointers; some problems add members of their own (`limit_bytes`, "
        "`current_status`, `allowed_actions`, `max_depth`)."
    ),
    "properties": {
        "type": {
            "type": "string",
            "format": "uri-reference",
            "description": "The kind of problem, `/problems/<kind>` (`/problems/not-found`).",
        },
        "title": {"type": "string", "description": "The kind's short, fixed summary."},
        "status": {"type": "integer", "description": "The HTTP status code.", "example": 400},
        "detail": {"type": "string", "description": "What went wrong with this request."},
        "instance": {"type": "string", "description": "The request's path."},
        "request_id": {"type": "string", "description": "The request's id, as in the logs."},
        "errors": {
            "type": "array",
            "description": "One entry per invalid field (400).",
            "items": {
                "type": "object",
                "properties": {
                    "pointer": {
                        "type": "string",
                        "description": "JSON Pointer into the body, or `/<query parameter>`.",
                    },
                    "detail": {"type": "string"},
                    "code": {"type": "string", "description": "`required`, `invalid`, …"},
                },
                "required": ["pointer", "detail"],
                "additionalProperties": True,
            },
        },
    },
    "required": ["type", "title", "status", "detail"],
    "additionalProperties": True,
}
_DESCRIPTIONS = {
    "400": "Invalid input: the problem names each field (`errors`, JSON Pointers).",
    "401": (
        "Not authenticated; `detail` says why: no credentials, another scheme than Bearer, a "
        "malformed token, or a token that is unknown, revoked or expired (one message for "
        "those three)."
    ),
    "403": "The credentials lack the role this operation needs.",
    "404": "No such object.",
    "405": (
        "The method is not allowed on this path: the path parameter names one of the "
        "collection's own actions (a profile tagged `compile`, for instance)."
    ),
    "409": "The write conflicts with the object's current state (`detail` says which).",
    "413": "The request body is larger than the limit the problem names.",
    "415": "The request body's media type is not accepted.",
}
_WRITES = frozenset({"post", "put", "patch", "delete"})
_METHODS = frozenset({"get", "head", "options", *_WRITES})
_RUN_ACTIONS = ("pause", "resume", "cancel", "escalate", "accept", "retry", "budget")
#: The operations whose views or services raise ``Conflict`` (409), by method and path: a
#: write refused by the object's state (a decided approval, a finished run, a used alias).
#: Each entry must name an operation of the schema (tests/test_openapi_contract.py).
CONFLICTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("post", "/api/v1/approvals/{id}/decide"),
        *(("post", f"/api/v1/runs/{{id}}/{action}") for action in _RUN_ACTIONS),
        ("post", "/api/v1/patterns/{key}/trigger"),
        ("delete", "/api/v1/patterns/{key}"),
        ("post", "/api/v1/events/{event_key}"),
        ("post", "/api/v1/model-aliases"),
        ("delete", "/api/v1/model-aliases/{name}"),
        ("delete", "/api/v1/model-endpoints/{name}"),
        ("post", "/api/v1/employees/{username}/sub-agents"),
        ("post", "/api/v1/employee-grants"),
        ("post", "/api/v1/harness-profiles"),
        ("post", "/api/v1/harness-profiles/create-profile"),
        ("delete", "/api/v1/harness-profiles/{tag}"),
        ("post", "/api/v1/harness-profiles/{tag}/save-draft"),
        ("post", "/api/v1/harness-profiles/{tag}/publish"),
        ("post", "/api/v1/instructions"),
        ("delete", "/api/v1/instructions/{name}"),
        ("put", "/api/v1/instructions/{name}/draft"),
        ("post", "/api/v1/instructions/{name}/publish"),
        ("put", "/api/v1/skills/{tool_name}"),
        ("patch", "/api/v1/skills/{tool_name}"),
        ("delete", "/api/v1/skills/{tool_name}"),
        ("get", "/api/v1/skill-executions/{id}/download"),
        ("post", "/api/v1/knowledge-bases/{key}/documents"),
        ("post", "/api/v1/knowledge-bases/{key}/sync"),
        ("post", "/api/v1/knowledge-bases/{key}/git-sync"),
    }
)
#: Operations open to anyone that check credentials themselves (a webhook: a token or a
#: signature), so still answer 401 and 403.
SELF_AUTHENTICATED: frozenset[tuple[str, str]] = frozenset({("post", "/api/v1/events/{event_key}")})


def _authenticated(operation: dict[str, Any]) -> bool:
    return operation.get("security") not in ([], [{}])


def _shadowed_by_action(
    path: str, method: str, operation: dict[str, Any], paths: dict[str, Any]
) -> bool:
    """Whether a path parameter of ``path`` can take the name of a sibling literal path (a
    collection's action, ``/harness-profiles/compile``) that lacks ``method``: Django routes
    that name to the action, which answers 405. A parameter whose ``pattern`` excludes the
    name (a skill's ``tool_name``) cannot."""
    patterns = {
        param["name"]: param.get("schema", {}).get("pattern")
        for param in operation.get("parameters", [])
        if param.get("in") == "path"
    }
    segments = path.split("/")
    for index, segment in enumerate(segments):
        if not segment.startswith("{"):
            continue
        pattern = patterns.get(segment.strip("{}"))
        for other, item in paths.items():
            parts = other.split("/")
            if len(parts) != len(segments) or method in item or parts[index].startswith("{"):
                continue
            if parts[:index] != segments[:index] or parts[index + 1 :] != segments[index + 1 :]:
                continue
            if pattern is None or re.search(pattern, parts[index]):
                return True
    return False


def _problem_statuses(
    path: str, method: str, operation: dict[str, Any], paths: dict[str, Any]
) -> list[str]:
    """The platform's error answers for one operation: only those it can give."""
    parameters = operation.get("parameters", [])
    statuses = []
    if "requestBody" in operation or parameters:
        statuses.append("400")
    if _authenticated(operation) or (method, path) in SELF_AUTHENTICATED:
        statuses += ["401", "403"]
    if any(param.get("in") == "path" for param in parameters):
        statuses.append("404")
        if _shadowed_by_action(path, method, operation, paths):
            statuses.append("405")
    if (method, path) in CONFLICTS:
        statuses.append("409")
    if "requestBody" in operation:
        statuses += ["413", "415"]
    return statuses


def tag_operations(
    result: dict[str, Any], generator: object, request: object, public: bool
) -> dict[str, Any]:
    """Tag each operation by its resource, the path's first segment after ``/api/v1/``, and
    describe each tag used (``TAGS``)."""
    used: set[str] = set()
    for path, path_item in result.get("paths", {}).items():
        resource = path.removeprefix(API_PREFIX).split("/", 1)[0]
        for method, operation in path_item.items():
            if method in _METHODS:
                operation["tags"] = [resource]
                used.add(resource)
    result["tags"] = [{"name": name, "description": TAGS.get(name, "")} for name in sorted(used)]
    return result


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
    paths = result.get("paths", {})
    for path, path_item in paths.items():
        for method, operation in path_item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status in _problem_statuses(path, method, operation, paths):
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
