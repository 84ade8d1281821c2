"""Strict, bounded input at the REST edge (issue 19): body size, nesting depth, NUL characters,
unknown fields, range-checked query parameters; every refusal is a problem+json 4xx naming the
limit, the place or the field, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from loops.models import RunStatus
from orchestrator.errors import PayloadTooLarge
from orchestrator.jsonlimits import MAX_DEPTH
from orchestrator.pagination import MAX_LIMIT
from orchestrator.parsers import BoundedJSONParser
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
PATTERN = {
    "key": "fix-typos",
    "goal_template": "Fix typos in {{ inputs.path }}",
    "leader_username": "lead",
    "maker_usernames": ["maker-a"],
    "verifier_username": "checker",
}
TRIGGER = "/api/v1/patterns/fix-typos/trigger"
LOGIN = "/login"


@pytest.fixture
def admin(api_client_for: Callable[[str], APIClient]) -> APIClient:
    client = api_client_for("admin")
    client.raise_request_exception = False  # a 500 must show as a 500, not as a test error
    return client


@pytest.fixture
def pattern(admin: APIClient) -> dict[str, Any]:
    response = admin.post("/api/v1/patterns", PATTERN, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def post_raw(client: APIClient, url: str, body: str | bytes) -> Any:
    return client.generic("POST", url, body, content_type="application/json")


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == PROBLEM
    return dict(response.json())


def only_error(body: dict[str, Any]) -> dict[str, str]:
    assert len(body["errors"]) == 1, body
    return dict(body["errors"][0])


# --- body size ------------------------------------------------------------------------------------


def test_a_10_mb_body_is_413_naming_the_limit(admin: APIClient, pattern: dict[str, Any]) -> None:
    body = json.dumps({"inputs": {"path": "x" * 10_000_000}})
    answer = problem(post_raw(admin, TRIGGER, body), 413)
    assert answer["type"] == "/problems/payload-too-large"
    assert answer["limit_bytes"] == settings.LOOPWRIGHT_MAX_BODY_BYTES
    assert str(settings.LOOPWRIGHT_MAX_BODY_BYTES) in answer["detail"]


def test_the_parser_reads_no_more_than_the_limit(settings: Any) -> None:
    """Behind the middleware's Content-Length check, the parser bounds what it reads itself."""
    settings.LOOPWRIGHT_MAX_BODY_BYTES = 1000
    stream = io.BytesIO(json.dumps({"inputs": {"path": "x" * 2000}}).encode())
    with pytest.raises(PayloadTooLarge) as refused:
        BoundedJSONParser().parse(stream, "application/json", {})
    assert refused.value.extra == {"limit_bytes": 1000}
    assert stream.tell() == 1001


# --- nesting depth -------------------------------------------------------------------------------


def test_a_5000_deep_json_body_is_400(admin: APIClient, pattern: dict[str, Any]) -> None:
    answer = problem(post_raw(admin, TRIGGER, "[" * 5000 + "]" * 5000), 400)
    assert f"{MAX_DEPTH} levels" in answer["detail"]
    assert only_error(answer)["code"] == "too_deep"
    assert answer["max_depth"] == MAX_DEPTH


def test_depth_past_the_limit_inside_inputs_is_400_pointing_there(
    admin: APIClient, pattern: dict[str, Any]
) -> None:
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # with {"inputs": {"a": ...}}: 2 levels too many
    answer = problem(post_raw(admin, TRIGGER, '{"inputs": {"a": ' + deep + "}}"), 400)
    assert only_error(answer)["pointer"].startswith("/inputs/a/0")


def test_depth_at_the_limit_is_accepted(admin: APIClient, pattern: dict[str, Any]) -> None:
    nested: Any = "docs/"
    for _ in range(MAX_DEPTH - 2):
        nested = [nested]
    body = {"inputs": {"path": "docs/", "deep": nested}}
    assert admin.post(TRIGGER, body, format="json").status_code == 201


# --- NUL characters and other strings no database stores --------------------------------------


def test_nul_in_trigger_inputs_is_400_naming_the_field(
    admin: APIClient, pattern: dict[str, Any]
) -> None:
    body = {"inputs": {"path": "docs/", "note": "a\u0000b"}}
    answer = problem(admin.post(TRIGGER, body, format="json"), 400)
    error = only_error(answer)
    assert (error["pointer"], error["code"]) == ("/inputs/note", "null_character")
    assert "/inputs/note" in answer["detail"]


@pytest.mark.parametrize(
    ("url", "body", "where"),
    [
        ("/api/v1/employees", {"username": "e\u0000"}, "/username"),
        (
            "/api/v1/model-endpoints",
            {"name": "m", "params": {"stop": ["\u0000"]}},
            "/params/stop/0",
        ),
        ("/api/v1/patterns", {**PATTERN, "policy": {"k\u0000": 1}}, "/policy/k\\u0000"),
    ],
)
def test_nul_anywhere_in_a_json_body_is_400(
    admin: APIClient, url: str, body: dict[str, Any], where: str
) -> None:
    answer = problem(admin.post(url, body, format="json"), 400)
    assert only_error(answer)["pointer"] == where


def test_an_unpaired_surrogate_and_a_non_finite_number_are_400(
    admin: APIClient, pattern: dict[str, Any]
) -> None:
    surrogate = problem(post_raw(admin, TRIGGER, '{"inputs": {"note": "\\ud800"}}'), 400)
    assert only_error(surrogate)["code"] == "unpaired_surrogate"
    huge = problem(post_raw(admin, TRIGGER, '{"inputs": {"n": 1e400}}'), 400)
    assert only_error(huge)["code"] == "not_finite"
    assert problem(post_raw(admin, TRIGGER, '{"inputs": {"n": NaN}}'), 400)


def test_nul_in_a_query_parameter_is_400_naming_it(admin: APIClient) -> None:
    answer = problem(admin.get("/api/v1/runs", {"pattern": "a\u0000b"}), 400)
    assert only_error(answer)["pointer"] == "/pattern"


def test_nul_in_a_ui_form_field_is_400(api_client_for: Callable[[str], APIClient]) -> None:
    client = Client(raise_request_exception=False)
    form = "username=a%00&password=x"  # a browser's form post: urlencoded
    response = client.post(LOGIN, form, content_type="application/x-www-form-urlencoded")
    answer = problem(response, 400)
    assert only_error(answer)["pointer"] == "/username"


# --- unknown fields --------------------------------------------------------------------------------


def test_an_unknown_field_on_trigger_is_400_naming_it(
    admin: APIClient, pattern: dict[str, Any]
) -> None:
    body = {"inputs": {"path": "docs/"}, "actingOn": ["src/"]}
    answer = problem(admin.post(TRIGGER, body, format="json"), 400)
    error = only_error(answer)
    assert (error["pointer"], error["code"]) == ("/actingOn", "unknown_field")
    assert "actingOn" in answer["detail"]


def test_an_unknown_field_on_pattern_create_is_400_with_a_suggestion(admin: APIClient) -> None:
    body = {**PATTERN, "actingOn": ["src/"]}
    answer = problem(admin.post("/api/v1/patterns", body, format="json"), 400)
    assert answer["detail"] == "Unknown field 'actingOn'. Did you mean 'acting_on'?"


def test_unknown_fields_in_nested_serializers_are_refused(admin: APIClient) -> None:
    body = {
        "name": "primary",
        "base_url": "https://models.example.test/v1",
        "model": "m",
        "failover": [{"endpoint": "primary", "modle": "x"}],
    }
    answer = problem(admin.post("/api/v1/model-endpoints", body, format="json"), 400)
    assert "/failover/0/modle" in {e["pointer"] for e in answer["errors"]}


def test_read_only_fields_sent_back_are_ignored(admin: APIClient, pattern: dict[str, Any]) -> None:
    got = admin.get("/api/v1/patterns/fix-typos").json()
    response = admin.put("/api/v1/patterns/fix-typos", {**got, "title": "Typos"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["title"] == "Typos"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("title", 0, "Must be a JSON string."), ("enabled", 0, "Must be a JSON boolean (true or false)."),
     ("enabled", "true", "Must be a JSON boolean (true or false)."),
     ("maker_usernames", ["a", 1], "Each item: Must be a JSON string.")],
)  # fmt: skip
def test_values_of_the_wrong_json_type_are_400_not_coerced(
    admin: APIClient, field: str, value: Any, message: str
) -> None:
    answer = problem(admin.post("/api/v1/patterns", {**PATTERN, field: value}, format="json"), 400)
    error = only_error(answer)
    assert (error["pointer"], error["detail"]) == (f"/{field}", message)


def test_a_number_sent_as_a_string_is_400(admin: APIClient) -> None:
    body = {"name": "m", "base_url": "https://models.example.test/v1", "model": "m",
            "max_retries": "3"}  # fmt: skip
    answer = problem(admin.post("/api/v1/model-endpoints", body, format="json"), 400)
    assert only_error(answer) == {
        "pointer": "/max_retries", "detail": "Must be a JSON number.", "code": "invalid_type"
    }  # fmt: skip


# --- numbers and dates in query parameters ----------------------------------------------------


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/skills", "/api/v1/approvals"])
@pytest.mark.parametrize(
    "query",
    [{"limit": str(10**18)}, {"limit": "0"}, {"limit": "-1"}, {"limit": "abc"},
     {"offset": str(10**19)}, {"offset": "-5"}, {"limit": ""}],
)  # fmt: skip
def test_limit_and_offset_out_of_range_are_400(
    admin: APIClient, url: str, query: dict[str, str]
) -> None:
    make_run(make_pattern(key="p"), status=RunStatus.QUEUED)  # rows, so the query is run
    answer = problem(admin.get(url, query), 400)
    (name,) = query
    assert only_error(answer)["pointer"] == f"/{name}"
    assert "whole number" in answer["detail"]


def test_limit_within_bounds_pages(admin: APIClient) -> None:
    pattern = make_pattern(key="p")
    for _ in range(3):
        make_run(pattern, status=RunStatus.QUEUED)
    page = admin.get("/api/v1/runs", {"limit": "2", "offset": "1"}).json()
    assert (page["count"], len(page["results"])) == (3, 2)
    assert admin.get("/api/v1/runs", {"limit": str(MAX_LIMIT)}).status_code == 200


@pytest.mark.parametrize(
    "value",
    ["", "2024-01-01T00:00:00+99:00", "4131-02-25T10:35:50.937644-17:34", "9999-12-31T23:59:59-23:00", "0001-01-01T00:00:00+23:00",
     "not-a-date"],
)  # fmt: skip
def test_odd_dates_in_filters_are_400(admin: APIClient, value: str) -> None:
    make_run(make_pattern(key="p"), status=RunStatus.QUEUED)
    answer = problem(admin.get("/api/v1/runs", {"created_after": value}), 400)
    assert only_error(answer)["pointer"] == "/created_after"


@pytest.mark.parametrize(
    ("url", "query"),
    [("/api/v1/patterns", {"enabled": "null"}), ("/api/v1/skills", {"enabled": "maybe"}),
     ("/api/v1/employees", {"streaming": "null"})],
)  # fmt: skip
def test_a_boolean_filter_refuses_what_is_not_a_boolean(
    admin: APIClient, url: str, query: dict[str, str]
) -> None:
    answer = problem(admin.get(url, query), 400)
    (name,) = query
    assert only_error(answer) == {
        "pointer": f"/{name}", "detail": "Must be true or false.", "code": "invalid"
    }  # fmt: skip
    assert admin.get(url, {name: "true"}).status_code == 200
    assert problem(admin.get(url, {name: ""}), 400)["detail"].startswith("Must not be empty")


def test_a_date_with_an_offset_within_bounds_filters(admin: APIClient) -> None:
    make_run(make_pattern(key="p"), status=RunStatus.QUEUED)
    found = admin.get("/api/v1/runs", {"created_after": "2000-01-01T00:00:00-15:59"})
    assert found.status_code == 200 and found.json()["count"] == 1


def test_the_served_schema_states_the_bounds(admin: APIClient) -> None:
    schema = admin.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200, schema.content[:300]
    params = schema.json()["paths"]["/api/v1/runs"]["get"]["parameters"]
    limit = next(p for p in params if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, MAX_LIMIT)


# --- MCP: the same bounds before the SDK parses the JSON-RPC message -----------------------------


async def _asgi_post(app: Any, chunks: list[bytes]) -> tuple[int, bytes, bytes | None]:
    """POST ``chunks`` to an ASGI app; (status, response body, body the inner app read)."""
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body, getattr(app.app, "seen", None)


class _Inner:
    """The SDK's place: reads the whole body it is given and answers 200."""

    seen: bytes | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        data, more = b"", True
        while more:
            message = await receive()
            data += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen = data
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_the_mcp_endpoint_bounds_size_depth_and_nul(settings: Any) -> None:
    from asgiref.sync import async_to_sync

    from skillhub.mcp import BoundedBody

    settings.LOOPWRIGHT_MAX_BODY_BYTES = 10_000
    call = async_to_sync(_asgi_post)
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    good = json.dumps({**message, "params": {"name": "t", "arguments": {"a": 1}}}).encode()
    assert call(BoundedBody(_Inner()), [good[:10], good[10:]]) == (200, b"ok", good)

    status, body, seen = call(BoundedBody(_Inner()), [b"x" * 6000, b"x" * 6000])
    assert (status, seen, json.loads(body)["limit_bytes"]) == (413, None, 10_000)

    deep = b"[" * 5000 + b"]" * 5000
    status, body, seen = call(BoundedBody(_Inner()), [deep])
    assert (status, seen, json.loads(body)["errors"][0]["code"]) == (400, None, "too_deep")

    nul = json.dumps({**message, "params": {"name": "t", "arguments": {"a": "\u0000"}}})
    status, body, seen = call(BoundedBody(_Inner()), [nul.encode()])
    error = json.loads(body)["errors"][0]
    assert (status, seen, error["pointer"]) == (400, None, "/params/arguments/a")


# --- no RecursionError escapes ---------------------------------------------------------------


def test_a_recursion_error_out_of_an_api_view_is_a_400_problem() -> None:
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    from orchestrator.errors import problem_exception_handler

    request = Request(APIRequestFactory().post("/api/v1/x"))
    response = problem_exception_handler(RecursionError(), {"request": request})
    assert response is not None and response.status_code == 400
    assert response.data["errors"][0]["code"] == "too_deep"


def test_a_recursion_error_out_of_any_view_is_a_400_problem() -> None:
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from orchestrator.middleware import BoundedRequestMiddleware

    def view(request: HttpRequest) -> HttpResponse:
        raise AssertionError("not called")

    middleware = BoundedRequestMiddleware(view)
    response = middleware.process_exception(RequestFactory().get("/runs"), RecursionError())
    assert response is not None and response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    assert json.loads(response.content)["max_depth"] == MAX_DEPTH


def test_timeouts_are_bounded(admin: APIClient) -> None:
    body = {"name": "m", "base_url": "https://models.example.test/v1", "model": "m",
            "timeout_seconds": 1e308}  # fmt: skip
    answer = problem(admin.post("/api/v1/model-endpoints", body, format="json"), 400)
    assert only_error(answer)["pointer"] == "/timeout_seconds"
