"""``POST /api/v1/events/{key}``: fan-out, token and HMAC authentication, replays, idempotency,
and the payload in a sandboxed goal template."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from loops.models import EventDelivery, EventKey, LoopRun
from loops.triggers.events import event_key_create, signature_compute
from tests.triggers.conftest import event_pattern

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
Clients = Callable[[str], APIClient]


@pytest.fixture
def operator(api_client_for: Clients) -> APIClient:
    return api_client_for("operator")


@pytest.fixture
def deploy_secret() -> str:
    _, secret = event_key_create(key="deploy", actor="admin")
    return secret


def signed_post(
    client: APIClient,
    key: str,
    body: bytes,
    secret: str,
    *,
    timestamp: int | None = None,
    signature: str | None = None,
    **headers: Any,
) -> Any:
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    sig = signature or "sha256=" + signature_compute(secret, stamp, body)
    return client.post(
        f"/api/v1/events/{key}",
        data=body,
        content_type="application/json",
        HTTP_X_LOOPWRIGHT_TIMESTAMP=stamp,
        HTTP_X_LOOPWRIGHT_SIGNATURE=sig,
        **headers,
    )


def deliver(client: APIClient, url: str, body: bytes, **headers: Any) -> Any:
    return client.post(url, data=body, content_type="application/json", **headers)


def payload(**fields: Any) -> bytes:
    return json.dumps({"service": "api", "version": "1.4.2", **fields}).encode()


def test_an_event_starts_one_run_of_every_enabled_subscribed_pattern(operator: APIClient) -> None:
    subscribed = [
        event_pattern(
            "deploy", key=f"on-deploy-{n}", goal_template=f"Check {n}: {{{{ event.service }}}}"
        )
        for n in range(3)
    ]
    event_pattern("deploy", key="on-deploy-off", enabled=False)
    event_pattern("other", key="on-other")
    response = deliver(operator, "/api/v1/events/deploy", payload())
    assert response.status_code == 202, response.content
    body = response.json()
    assert [r["pattern"] for r in body["runs"]] == [p.key for p in subscribed]
    assert {r["status"] for r in body["runs"]} == {"queued"}
    assert body["refused"] == [
        {
            "pattern": "on-deploy-off",
            "reason": "Pattern 'on-deploy-off' is disabled; enable it to start runs.",
            "code": "refused",
        }
    ]
    runs = LoopRun.objects.filter(trigger_type="event").order_by("pattern__key")
    assert [r.goal for r in runs] == ["Check 0: api", "Check 1: api", "Check 2: api"]
    assert {r.trigger_ref for r in runs} == {body["delivery_id"]}
    assert {r.triggered_by for r in runs} == {"operator"}
    delivery = EventDelivery.objects.get(pk=body["delivery_id"])
    assert sorted(delivery.run_ids) == sorted(r["id"] for r in body["runs"])


def test_the_payload_and_its_inputs_reach_the_goal_template(operator: APIClient) -> None:
    event_pattern(
        "deploy",
        goal_template="Deploy {{ event.service }}@{{ event.version }} to {{ inputs.env }}",
    )
    response = deliver(operator, "/api/v1/events/deploy", payload(inputs={"env": "staging"}))
    assert response.status_code == 202, response.content
    run = LoopRun.objects.get()
    assert run.goal == "Deploy api@1.4.2 to staging" and run.inputs == {"env": "staging"}


def test_a_valid_signature_starts_the_runs_as_the_key(deploy_secret: str) -> None:
    event_pattern("deploy")
    response = signed_post(APIClient(), "deploy", payload(), deploy_secret)
    assert response.status_code == 202, response.content
    assert LoopRun.objects.get().triggered_by == "hmac:deploy"


@pytest.mark.parametrize(
    "tamper",
    ["wrong secret", "changed body", "no prefix", "not hex", "missing signature"],
)
def test_a_bad_signature_is_401_and_starts_nothing(deploy_secret: str, tamper: str) -> None:
    event_pattern("deploy")
    body = payload()
    stamp = str(int(time.time()))
    good = signature_compute(deploy_secret, stamp, body)
    client = APIClient()
    headers: dict[str, Any] = {"HTTP_X_LOOPWRIGHT_TIMESTAMP": stamp}
    sent = body
    if tamper == "wrong secret":
        headers["HTTP_X_LOOPWRIGHT_SIGNATURE"] = "sha256=" + signature_compute(
            "x" * 64, stamp, body
        )
    elif tamper == "changed body":
        headers["HTTP_X_LOOPWRIGHT_SIGNATURE"] = "sha256=" + good
        sent = payload(version="6.6.6")
    elif tamper == "no prefix":
        headers["HTTP_X_LOOPWRIGHT_SIGNATURE"] = good
    elif tamper == "not hex":
        headers["HTTP_X_LOOPWRIGHT_SIGNATURE"] = "sha256=zz" + good[2:]
    response = client.post(
        "/api/v1/events/deploy", data=sent, content_type="application/json", **headers
    )
    assert response.status_code == 401, response.content
    assert response["Content-Type"] == PROBLEM
    assert response["WWW-Authenticate"] == 'Bearer realm="loopwright"'
    assert "signature does not match" in response.json()["detail"]
    assert LoopRun.objects.count() == 0 and EventDelivery.objects.count() == 0


@pytest.mark.parametrize("age", [301, -301, 86_400])
def test_a_timestamp_outside_the_tolerance_is_refused_as_a_replay(
    deploy_secret: str, age: int
) -> None:
    event_pattern("deploy")
    response = signed_post(
        APIClient(), "deploy", payload(), deploy_secret, timestamp=int(time.time()) - age
    )
    assert response.status_code == 401
    assert "tolerance 300 s" in response.json()["detail"]
    assert LoopRun.objects.count() == 0


def test_a_per_key_tolerance_is_honoured() -> None:
    key, secret = event_key_create(key="slow", actor="admin", tolerance_seconds=3600)
    event_pattern("slow")
    stamp = int(time.time()) - 1800
    assert signed_post(APIClient(), "slow", payload(), secret, timestamp=stamp).status_code == 202
    assert key.tolerance_seconds == 3600


def test_a_non_numeric_timestamp_is_401(deploy_secret: str) -> None:
    response = APIClient().post(
        "/api/v1/events/deploy",
        data=payload(),
        content_type="application/json",
        HTTP_X_LOOPWRIGHT_TIMESTAMP="yesterday",
        HTTP_X_LOOPWRIGHT_SIGNATURE="sha256=00",
    )
    assert response.status_code == 401 and "unix seconds" in response.json()["detail"]


def test_replaying_an_accepted_signed_request_is_401_and_starts_nothing(
    deploy_secret: str,
) -> None:
    event_pattern("deploy")
    stamp = int(time.time())
    first = signed_post(APIClient(), "deploy", payload(), deploy_secret, timestamp=stamp)
    assert first.status_code == 202
    replay = signed_post(APIClient(), "deploy", payload(), deploy_secret, timestamp=stamp)
    assert replay.status_code == 401
    assert "already accepted" in replay.json()["detail"]
    assert LoopRun.objects.count() == 1 and EventDelivery.objects.count() == 1


def test_an_unknown_key_looks_like_a_bad_signature_to_a_signed_caller() -> None:
    response = signed_post(APIClient(), "nope", payload(), "any-secret")
    assert response.status_code == 401
    assert "signature does not match" in response.json()["detail"]


def test_an_unknown_key_is_404_for_an_operator(operator: APIClient) -> None:
    response = deliver(operator, "/api/v1/events/nope", payload())
    assert response.status_code == 404 and response["Content-Type"] == PROBLEM


def test_a_key_only_patterns_use_is_known_to_an_operator(operator: APIClient) -> None:
    event_pattern("no-row")  # no EventKey row: token callers may still deliver
    assert deliver(operator, "/api/v1/events/no-row", payload()).status_code == 202


def test_a_disabled_key_is_409_for_an_operator_and_401_for_a_signer(
    operator: APIClient, deploy_secret: str
) -> None:
    event_pattern("deploy")
    EventKey.objects.filter(key="deploy").update(enabled=False)
    assert deliver(operator, "/api/v1/events/deploy", payload()).status_code == 409
    assert signed_post(APIClient(), "deploy", payload(), deploy_secret).status_code == 401
    assert LoopRun.objects.count() == 0


@pytest.mark.parametrize(("persona", "status"), [("viewer", 403), ("approver", 403)])
def test_roles_below_operator_cannot_deliver_events(
    api_client_for: Clients, persona: str, status: int
) -> None:
    event_pattern("deploy")
    response = deliver(api_client_for(persona), "/api/v1/events/deploy", payload())
    assert response.status_code == status and response["Content-Type"] == PROBLEM
    assert LoopRun.objects.count() == 0


def test_no_credentials_at_all_is_401(api_client_for: Clients) -> None:
    event_pattern("deploy")
    response = deliver(api_client_for("anonymous"), "/api/v1/events/deploy", payload())
    assert response.status_code == 401 and "bearer API token" in response.json()["detail"]


def test_a_revoked_token_is_401(api_client_for: Clients) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer lw_000000000000_nope")
    assert deliver(client, "/api/v1/events/deploy", payload()).status_code == 401


def test_a_retry_with_the_same_idempotency_key_returns_the_same_runs(operator: APIClient) -> None:
    event_pattern("deploy", key="a")
    event_pattern("deploy", key="b")
    first = deliver(operator, "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="evt-1")
    again = deliver(operator, "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="evt-1")
    assert first.status_code == 202 and again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert LoopRun.objects.count() == 2 and EventDelivery.objects.count() == 1


def test_a_re_signed_retry_with_the_same_idempotency_key_is_a_replay(deploy_secret: str) -> None:
    event_pattern("deploy")
    stamp = int(time.time())
    first = signed_post(
        APIClient(), "deploy", payload(), deploy_secret, timestamp=stamp, HTTP_IDEMPOTENCY_KEY="k"
    )
    # The same signed request again (a proxy's retry), then re-signed a second later.
    same = signed_post(
        APIClient(), "deploy", payload(), deploy_secret, timestamp=stamp, HTTP_IDEMPOTENCY_KEY="k"
    )
    later = signed_post(
        APIClient(),
        "deploy",
        payload(),
        deploy_secret,
        timestamp=stamp + 1,
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert first.status_code == 202
    assert (same.status_code, later.status_code) == (200, 200)
    assert same.json() == later.json() == first.json()
    assert LoopRun.objects.count() == 1


def test_the_same_idempotency_key_with_another_payload_is_409(operator: APIClient) -> None:
    event_pattern("deploy")
    deliver(operator, "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="k")
    response = deliver(
        operator, "/api/v1/events/deploy", payload(version="2"), HTTP_IDEMPOTENCY_KEY="k"
    )
    assert response.status_code == 409 and "different payload" in response.json()["detail"]
    assert LoopRun.objects.count() == 1


def test_the_same_payload_in_another_key_order_is_the_same_payload(operator: APIClient) -> None:
    event_pattern("deploy")
    first = b'{"a": 1, "b": {"c": 2, "d": 3}}'
    second = b'{"b": {"d": 3, "c": 2}, "a": 1}'
    for body in (first, second):
        response = operator.post(
            "/api/v1/events/deploy", data=body, content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="k",
        )  # fmt: skip
        assert response.status_code in (200, 202)
    assert LoopRun.objects.count() == 1


def test_the_same_idempotency_key_from_another_sender_is_409(
    operator: APIClient, api_client_for: Clients
) -> None:
    event_pattern("deploy")
    deliver(operator, "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="k")
    response = deliver(
        api_client_for("admin"), "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="k"
    )
    assert response.status_code == 409 and "another sender" in response.json()["detail"]


def test_idempotency_keys_are_per_event_key(operator: APIClient) -> None:
    event_pattern("deploy")
    event_pattern("build")
    for key in ("deploy", "build"):
        response = deliver(
            operator, f"/api/v1/events/{key}", payload(), HTTP_IDEMPOTENCY_KEY="same"
        )
        assert response.status_code == 202
    assert LoopRun.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"", "must be a JSON object"),
        (b"{not json", "not valid JSON"),
        (b'{"inputs": [1]}', "'inputs' must be a JSON object"),
    ],
)
def test_a_payload_that_is_not_a_json_object_is_400(
    operator: APIClient, body: bytes, message: str
) -> None:
    event_pattern("deploy")
    response = operator.post("/api/v1/events/deploy", data=body, content_type="application/json")
    assert response.status_code == 400 and message in response.json()["detail"]
    assert LoopRun.objects.count() == 0 and EventDelivery.objects.count() == 0


def test_a_bad_idempotency_key_is_400(operator: APIClient) -> None:
    event_pattern("deploy")
    response = deliver(operator, "/api/v1/events/deploy", payload(), HTTP_IDEMPOTENCY_KEY="x" * 201)
    assert response.status_code == 400


@pytest.mark.parametrize(
    "template",
    [
        "{{ event.__class__ }}",
        "{{ event['__class__'] }}",
        "{{ event.items.__globals__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
        "{{ event.clear() }}",
    ],
)
def test_the_sandbox_refuses_python_internals_and_starts_no_run(
    operator: APIClient, template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    event_pattern("deploy", goal_template=template.replace("MARKER", str(tmp_path / "pwned")))
    response = deliver(operator, "/api/v1/events/deploy", payload())
    assert response.status_code == 400, response.content
    problem = response.json()
    assert "could not start any run" in problem["detail"]
    assert problem["errors"][0]["code"] == "template_error"
    assert LoopRun.objects.count() == 0 and EventDelivery.objects.count() == 0
    assert not (tmp_path / "pwned").exists()


def test_one_pattern_whose_template_fails_does_not_stop_the_others(operator: APIClient) -> None:
    event_pattern("deploy", key="needs-repo", goal_template="Build {{ event.repo }}")
    event_pattern("deploy", key="fine", goal_template="Ship {{ event.service }}")
    response = deliver(operator, "/api/v1/events/deploy", payload())
    assert response.status_code == 202
    body = response.json()
    assert [r["pattern"] for r in body["runs"]] == ["fine"]
    [refusal] = body["refused"]
    assert refusal["pattern"] == "needs-repo" and refusal["code"] == "template_error"
    assert "repo" in refusal["reason"]


def test_an_event_nobody_subscribes_to_is_accepted_with_no_runs(operator: APIClient) -> None:
    event_key_create(key="quiet", actor="admin")
    response = deliver(operator, "/api/v1/events/quiet", payload())
    assert response.status_code == 202
    assert response.json()["runs"] == [] and response.json()["refused"] == []


def test_the_event_endpoint_is_in_the_openapi_schema(api_client_for: Clients) -> None:
    from drf_spectacular.validation import validate_schema

    schema = api_client_for("viewer").get("/api/schema/", {"format": "json"}).json()
    post = schema["paths"]["/api/v1/events/{event_key}"]["post"]
    assert {"202", "200"} <= set(post["responses"])
    headers = {p["name"] for p in post["parameters"] if p["in"] == "header"}
    assert headers == {"Idempotency-Key", "X-Loopwright-Timestamp", "X-Loopwright-Signature"}
    ours = {
        path: item
        for path, item in schema["paths"].items()
        if "/events/" in path or "event-keys" in path or path.endswith("/schedule")
    }
    validate_schema({**schema, "paths": ours})
