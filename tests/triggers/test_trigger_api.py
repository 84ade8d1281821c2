"""Event keys (admins only, the secret shown once) and a pattern's cron schedule."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from rest_framework.test import APIClient

from loops.models import EventKey, LoopPattern
from loops.triggers.events import signature_compute
from loops.triggers.scheduler import cron_schedule_sync, cron_tick
from tests.triggers.conftest import T0, cron_pattern, event_pattern

pytestmark = pytest.mark.django_db
Clients = Callable[[str], APIClient]


@pytest.fixture
def admin(api_client_for: Clients) -> APIClient:
    return api_client_for("admin")


def signed(key: str, secret: str, body: bytes) -> int:
    stamp = str(int(time.time()))
    response = APIClient().post(
        f"/api/v1/events/{key}",
        data=body,
        content_type="application/json",
        HTTP_X_LOOPWRIGHT_TIMESTAMP=stamp,
        HTTP_X_LOOPWRIGHT_SIGNATURE="sha256=" + signature_compute(secret, stamp, body),
    )
    return response.status_code


# --- event keys ------------------------------------------------------------------------------


def test_an_admin_creates_a_key_and_sees_its_secret_only_once(admin: APIClient) -> None:
    created = admin.post(
        "/api/v1/event-keys", {"key": "deploy", "description": "CI deploys"}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert len(body["secret"]) == 64 and body["tolerance_seconds"] == 300
    assert body["created_by"] == "admin"
    assert "secret" not in admin.get("/api/v1/event-keys/deploy").json()
    assert all("secret" not in row for row in admin.get("/api/v1/event-keys").json()["results"])
    event_pattern("deploy")
    assert signed("deploy", body["secret"], b"{}") == 202


def test_rotating_a_key_refuses_the_old_secret_at_once(admin: APIClient) -> None:
    old = admin.post("/api/v1/event-keys", {"key": "deploy"}, format="json").json()["secret"]
    rotated = admin.post("/api/v1/event-keys/deploy/rotate")
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new != old and rotated.json()["rotated_at"]
    event_pattern("deploy")
    assert signed("deploy", old, b'{"a": 1}') == 401
    assert signed("deploy", new, b'{"a": 2}') == 202


def test_an_admin_changes_tolerance_and_disables_a_key(admin: APIClient) -> None:
    admin.post("/api/v1/event-keys", {"key": "deploy"}, format="json")
    response = admin.patch(
        "/api/v1/event-keys/deploy", {"tolerance_seconds": 60, "enabled": False}, format="json"
    )
    assert response.status_code == 200, response.content
    key = EventKey.objects.get(key="deploy")
    assert (key.tolerance_seconds, key.enabled) == (60, False)
    bad = admin.patch("/api/v1/event-keys/deploy", {"tolerance_seconds": 0}, format="json")
    assert bad.status_code == 400


def test_a_duplicate_key_is_400_and_a_key_can_be_deleted(admin: APIClient) -> None:
    assert admin.post("/api/v1/event-keys", {"key": "deploy"}, format="json").status_code == 201
    again = admin.post("/api/v1/event-keys", {"key": "deploy"}, format="json")
    assert again.status_code == 400
    assert admin.delete("/api/v1/event-keys/deploy").status_code == 204
    assert not EventKey.objects.exists()


@pytest.mark.parametrize("persona", ["operator", "approver", "viewer"])
def test_only_admins_may_see_or_manage_event_keys(api_client_for: Clients, persona: str) -> None:
    client = api_client_for(persona)
    assert client.get("/api/v1/event-keys").status_code == 403
    assert client.post("/api/v1/event-keys", {"key": "x"}, format="json").status_code == 403
    assert not EventKey.objects.exists()


# --- schedules -------------------------------------------------------------------------------


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_the_schedule_shows_the_next_fire_time_and_the_next_five(
    api_client_for: Clients,
) -> None:
    pattern = cron_pattern("30 2 * * *", timezone="America/New_York")
    cron_schedule_sync(pattern, now=datetime.fromisoformat("2030-03-08T12:00:00+00:00"))
    response = api_client_for("viewer").get(f"/api/v1/patterns/{pattern.key}/schedule")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["next_fire_at"] == "2030-03-09T07:30:00Z"
    assert body["next_fires"] == [
        "2030-03-09T07:30:00Z",
        "2030-03-10T07:00:00Z",  # 02:30 does not exist that night: 03:00 EDT
        "2030-03-11T06:30:00Z",
        "2030-03-12T06:30:00Z",
        "2030-03-13T06:30:00Z",
    ]
    assert (body["timezone"], body["missed_fire_policy"], body["paused_reason"]) == (
        "America/New_York",
        "coalesce",
        "",
    )


def test_the_schedule_lists_recent_fires_with_their_outcome(api_client_for: Clients) -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    cron_tick(now=T0.replace(minute=5))
    body = api_client_for("viewer").get(f"/api/v1/patterns/{pattern.key}/schedule").json()
    assert body["last_fired_at"] == iso(T0.replace(minute=5))
    assert body["next_fire_at"] == iso(T0.replace(minute=10))
    [fire] = body["recent_fires"]
    assert fire["outcome"] == "started" and fire["run"] and fire["missed"] == 0


def test_a_pattern_without_a_schedule_row_still_shows_its_next_fire(
    api_client_for: Clients,
) -> None:
    pattern = cron_pattern("0 0 1 1 *")  # no hook call, no tick yet
    body = api_client_for("viewer").get(f"/api/v1/patterns/{pattern.key}/schedule").json()
    assert body["next_fire_at"] is not None and body["next_fire_at"].endswith("-01-01T00:00:00Z")
    assert len(body["next_fires"]) == 5


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"enabled": False}, "disabled"),
        ({"trigger_type": "manual"}, "not a cron pattern"),
        ({"cron_expression": "0 0 30 2 *"}, "names no later time"),
    ],
)
def test_a_schedule_that_will_not_fire_says_why(
    api_client_for: Clients, fields: dict[str, object], reason: str
) -> None:
    pattern = cron_pattern("* * * * *")
    LoopPattern.objects.filter(pk=pattern.pk).update(**fields)
    body = api_client_for("viewer").get(f"/api/v1/patterns/{pattern.key}/schedule").json()
    assert body["next_fire_at"] is None and body["next_fires"] == []
    assert reason in body["paused_reason"]


def test_the_schedule_of_an_unknown_pattern_is_404_and_outsiders_are_403(
    api_client_for: Clients,
) -> None:
    assert api_client_for("viewer").get("/api/v1/patterns/nope/schedule").status_code == 404
    pattern = cron_pattern()
    outsider = api_client_for("outsider")
    assert outsider.get(f"/api/v1/patterns/{pattern.key}/schedule").status_code == 403


def test_a_pattern_created_through_the_api_is_scheduled_at_once_and_shows_its_next_fire(
    api_client_for: Clients,
) -> None:
    operator = api_client_for("operator")
    created = operator.post(
        "/api/v1/patterns",
        {
            "key": "nightly",
            "goal_template": "Nightly report",
            "trigger_type": "cron",
            "cron_expression": "0 3 * * *",
            "timezone": "Europe/Berlin",
            "leader_username": "lead",
            "maker_usernames": ["maker"],
            "verifier_username": "checker",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["next_fire_at"] is not None  # 03:00 Berlin time, from the schedule row
    assert cron_tick().synced == 0  # the create hook already wrote the row; nothing to heal
    body = operator.get("/api/v1/patterns/nightly/schedule").json()
    assert body["next_fire_at"] is not None
    assert json.dumps(body)  # plain JSON all the way
    listed = operator.get("/api/v1/patterns").json()["results"][0]
    assert listed["next_fire_at"] == created.json()["next_fire_at"]

    changed = operator.patch("/api/v1/patterns/nightly", {"enabled": False}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["next_fire_at"] is None  # a disabled pattern does not fire
