"""A bearer token's user and roles are read in the token's one statement: ``user_roles`` then
issues none, and the roles are those ``user_roles`` reads from the groups (a superuser or an
admin holds all; other group names grant nothing). Refusals are unchanged."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import ALL_ROLES, Role, user_roles
from orchestrator.accounts.services import (
    TOKEN_REFUSED,
    TokenRefused,
    api_token_authenticate,
    api_token_create,
    api_token_resolve,
    user_ensure,
)

pytestmark = pytest.mark.django_db


def _used_just_now(token: str) -> str:
    """The token, marked used a moment ago (its read touches nothing)."""
    ApiToken.objects.filter(prefix=token.split("_")[1]).update(last_used_at=timezone.now())
    return token


@pytest.mark.parametrize(
    ("groups", "superuser", "expected"),
    [
        ((), False, set()),
        (("operator", "approver"), False, {Role.OPERATOR, Role.APPROVER}),
        (("viewer",), False, {Role.VIEWER}),
        (("admin",), False, set(ALL_ROLES)),
        ((), True, set(ALL_ROLES)),
        (("Admin", "admin,viewer", "viewer "), False, set()),
    ],
)
def test_the_token_its_user_and_the_roles_are_one_statement(
    groups: tuple[str, ...],
    superuser: bool,
    expected: set[Role],
    django_assert_num_queries: Callable[..., Any],
) -> None:
    user = User.objects.create(username="robot", is_superuser=superuser)
    user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in groups))
    user.groups.add(Group.objects.get_or_create(name="unrelated")[0])
    user_ensure(username="other", roles=list(ALL_ROLES))  # another user's groups count for nothing
    token = _used_just_now(api_token_create(user=user))
    with django_assert_num_queries(1):
        resolved = api_token_authenticate(f"Bearer {token}")
        roles = user_roles(resolved.user)
    assert roles == expected == user_roles(User.objects.get(pk=user.pk))


def test_the_first_use_of_a_minute_also_records_it() -> None:
    token = api_token_create(user=user_ensure(username="robot", roles=[Role.VIEWER]))
    with CaptureQueriesContext(connection) as sent:
        resolved = api_token_resolve(token)
        assert resolved is not None and user_roles(resolved.user) == {Role.VIEWER}
    assert len(sent.captured_queries) == 2 and "UPDATE" in sent.captured_queries[1]["sql"]
    row = ApiToken.objects.get(pk=resolved.pk)
    assert row.last_used_at is not None
    with CaptureQueriesContext(connection) as again:
        assert api_token_resolve(token) is not None
    assert len(again.captured_queries) == 1
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=timezone.now() - timedelta(minutes=2))
    with CaptureQueriesContext(connection) as later:
        assert api_token_resolve(token) is not None
    assert len(later.captured_queries) == 2


@pytest.mark.parametrize("change", ["revoked", "expired", "inactive", "wrong secret"])
def test_a_refused_token_is_refused_as_before(change: str) -> None:
    user = user_ensure(username="robot", roles=[Role.ADMIN])
    token = api_token_create(user=user)
    rows = ApiToken.objects.filter(user=user)
    if change == "revoked":
        rows.update(revoked_at=timezone.now())
    elif change == "expired":
        rows.update(expires_at=timezone.now() - timedelta(seconds=1))
    elif change == "inactive":
        User.objects.filter(pk=user.pk).update(is_active=False)
    else:
        token = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(TokenRefused) as refused:
        api_token_authenticate(f"Bearer {token}")
    assert str(refused.value) == TOKEN_REFUSED
    if change == "inactive":
        resolved = api_token_resolve(token)
        assert resolved is not None and user_roles(resolved.user) == frozenset()


def test_a_role_granted_or_withdrawn_counts_from_the_next_request() -> None:
    user = user_ensure(username="robot", roles=[Role.VIEWER])
    token = api_token_create(user=user)
    operator = Group.objects.get_or_create(name=Role.OPERATOR.value)[0]
    user.groups.add(operator)
    first = api_token_resolve(token)
    assert first is not None and user_roles(first.user) == {Role.VIEWER, Role.OPERATOR}
    user.groups.remove(operator)
    second = api_token_resolve(token)
    assert second is not None and user_roles(second.user) == {Role.VIEWER}
