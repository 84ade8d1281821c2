"""``/api/v1/api-tokens`` create and revoke over real HTTP (DRF's client, the real database):
admins only; the full token in the creating response and nowhere after; bad input a 400
problem naming the field with nothing written; a revoked or expired token refused at once, by
the API and by the OpenAI-compatible endpoint."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role, user_roles

pytestmark = pytest.mark.django_db
URL = "/api/v1/api-tokens"


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_an_admin_creates_a_token_whose_secret_is_shown_once_and_works(
    admin_client_api: APIClient,
) -> None:
    expires = (timezone.now() + timedelta(days=3)).isoformat()
    body = {
        "username": "robot",
        "roles": ["operator", "approver"],
        "name": "ci",
        "expires_at": expires,
        "daily_token_quota": 1000,
        "daily_cost_quota": "2.5",
    }
    response = admin_client_api.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    token = created["token"]
    assert token.startswith(f"lw_{created['prefix']}_")
    assert (created["user"], created["name"], created["daily_token_quota"]) == ("robot", "ci", 1000)
    assert created["daily_cost_quota"] == "2.5000" and created["revoked_at"] is None
    assert user_roles(User.objects.get(username="robot")) == {Role.OPERATOR, Role.APPROVER}
    # The secret is never stored nor answered again.
    row = ApiToken.objects.get(prefix=created["prefix"])
    assert token.split("_", 2)[2] not in row.secret_hash
    listed = admin_client_api.get(URL)
    read = admin_client_api.get(f"{URL}/{row.prefix}")
    for again in (listed, read):
        assert again.status_code == 200 and token not in again.content.decode()
    items = listed.json()
    items = items["results"] if isinstance(items, dict) else items
    assert all("token" not in item and "secret_hash" not in item for item in items)
    assert "token" not in read.json()
    assert _bearer(token).get("/api/v1/patterns").status_code == 200


@pytest.mark.parametrize("persona", ["operator", "approver", "viewer", "outsider", "anonymous"])
def test_only_admins_create_or_revoke(
    persona: str, api_client_for: Callable[[str], APIClient]
) -> None:
    target = ApiToken.objects.create(
        user=User.objects.create(username="someone"), prefix="abc123", secret_hash="x"
    )
    client = api_client_for(persona)
    created = client.post(URL, {"username": "x", "roles": ["admin"]}, format="json")
    revoked = client.post(f"{URL}/{target.prefix}/revoke")
    expected = 401 if persona == "anonymous" else 403
    assert (created.status_code, revoked.status_code) == (expected, expected)
    assert not User.objects.filter(username="x").exists()
    target.refresh_from_db()
    assert target.revoked_at is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"roles": ["viewer"]}, "username"),
        ({"username": "bad name!", "roles": ["viewer"]}, "username"),
        ({"username": "u", "roles": []}, "roles"),
        ({"username": "u", "roles": ["root"]}, "roles"),
        (
            {"username": "u", "roles": ["viewer"], "expires_at": "2001-01-01T00:00:00Z"},
            "expires_at",
        ),
        ({"username": "u", "roles": ["viewer"], "expires_at": "soon"}, "expires_at"),
        ({"username": "u", "roles": ["viewer"], "daily_token_quota": -1}, "daily_token_quota"),
        ({"username": "u", "roles": ["viewer"], "daily_cost_quota": "1e9"}, "daily_cost_quota"),
        ({"username": "u", "roles": ["viewer"], "scopes": ["x"]}, "scopes"),
    ],
)
def test_bad_input_is_a_400_problem_naming_the_field_and_writes_nothing(
    admin_client_api: APIClient, body: dict[str, object], field: str
) -> None:
    before = (ApiToken.objects.count(), User.objects.count())
    response = admin_client_api.post(URL, body, format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert field in response.content.decode()
    assert (ApiToken.objects.count(), User.objects.count()) == before


def test_a_revoked_token_is_refused_at_once_and_revoking_again_changes_nothing(
    admin_client_api: APIClient,
) -> None:
    created = admin_client_api.post(
        URL, {"username": "bot", "roles": ["viewer"]}, format="json"
    ).json()
    bot = _bearer(created["token"])
    assert bot.get("/api/v1/patterns").status_code == 200
    first = admin_client_api.post(f"{URL}/{created['prefix']}/revoke")
    assert first.status_code == 200 and first.json()["revoked_at"]
    assert "token" not in first.json()
    assert bot.get("/api/v1/patterns").status_code == 401
    assert bot.get("/v1/models").status_code == 401  # the OpenAI-compatible endpoint too
    again = admin_client_api.post(f"{URL}/{created['prefix']}/revoke")
    assert again.status_code == 200 and again.json()["revoked_at"] == first.json()["revoked_at"]
    assert admin_client_api.post(f"{URL}/ffffff/revoke").status_code == 404


def test_an_expired_token_is_refused(admin_client_api: APIClient) -> None:
    soon = (timezone.now() + timedelta(minutes=5)).isoformat()
    created = admin_client_api.post(
        URL, {"username": "bot", "roles": ["viewer"], "expires_at": soon}, format="json"
    ).json()
    bot = _bearer(created["token"])
    assert bot.get("/api/v1/patterns").status_code == 200
    ApiToken.objects.filter(prefix=created["prefix"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert bot.get("/api/v1/patterns").status_code == 401
