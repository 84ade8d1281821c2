"""A chat's preparation (token, user, grant, employee, guardrails, harness) is reused only
while the one stamp query finds nothing it was read from changed: every change answers at
once what the full read answers (401, 403, the new employee, guardrails or harness)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.utils import timezone

from gateway import access
from gateway.errors import OpenAIError
from gateway.services import grant_create, grant_delete, guardrails_update
from gateway.validation import chat_request
from harness.services import profile_publish, profile_save_draft
from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, employee_update, model_endpoint_create

pytestmark = pytest.mark.django_db(transaction=True)
ASK = chat_request({"model": "ada", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
def ada(seeded_profiles: None) -> Employee:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    return employee_create(username="ada", endpoint=endpoint, system_prompt="You are Ada.")


@pytest.fixture
def alice(ada: Employee) -> User:
    user = user_ensure(username="alice")
    grant_create(employee=ada, user=user, actor="test")
    return user


def bearer(user: User, **fields: Any) -> str:
    return f"Bearer {api_token_create(user=user, name='t', **fields)}"


def refused(key: str) -> int:
    with pytest.raises(OpenAIError) as caught:
        access.prepare_for(key, ASK)
    return caught.value.status


def test_a_repeated_request_is_prepared_by_the_stamp_query_alone(
    alice: User, django_assert_num_queries: Callable[..., Any]
) -> None:
    key = bearer(alice)
    first = access.prepare_for(key, ASK)
    again = chat_request({"model": "ada", "messages": [{"role": "user", "content": "again"}]})
    with django_assert_num_queries(1):
        second = access.prepare_for(key, again)
    assert second.request is again and second.profile is first.profile
    assert second.harness == first.harness and second.user.pk == alice.pk


def revoke(user: User, ada: Employee) -> None:
    ApiToken.objects.filter(user=user).update(revoked_at=timezone.now())


def deactivate(user: User, ada: Employee) -> None:
    User.objects.filter(pk=user.pk).update(is_active=False)


def withdraw_grant(user: User, ada: Employee) -> None:
    grant_delete(employee=ada, user=user, actor="test")


@pytest.mark.parametrize(
    ("change", "status"), [(revoke, 401), (deactivate, 401), (withdraw_grant, 403)]
)
def test_a_revocation_is_refused_on_the_next_request(
    alice: User, ada: Employee, change: Callable[[User, Employee], None], status: int
) -> None:
    key = bearer(alice)
    access.prepare_for(key, ASK)
    access.prepare_for(key, ASK)  # reused
    change(alice, ada)
    assert refused(key) == status


def test_losing_the_admin_role_loses_the_employee(ada: Employee) -> None:
    boss = user_ensure(username="boss", roles=[Role.ADMIN])  # admins need no grant
    key = bearer(boss)
    access.prepare_for(key, ASK)
    boss.groups.remove(Group.objects.get(name=Role.ADMIN.value))
    assert refused(key) == 403


def test_a_wrong_secret_or_an_expired_token_is_never_reused(alice: User) -> None:
    expires = timezone.now() + timedelta(minutes=5)
    key = bearer(alice, expires_at=expires)
    access.prepare_for(key, ASK)
    assert refused(key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")) == 401
    with time_machine.travel(expires + timedelta(seconds=1), tick=False):
        assert refused(key) == 401


def test_an_edited_employee_guardrail_or_harness_profile_is_read_again(
    alice: User, ada: Employee
) -> None:
    key = bearer(alice)
    before = access.prepare_for(key, ASK)
    employee_update(employee=ada, system_prompt="You are Ada, briefly.")
    edited = access.prepare_for(key, ASK)
    assert edited.profile.system_prompt == "You are Ada, briefly."

    guardrails_update(
        employee=ada,
        guardrails={"input": [{"name": "size", "kind": "max_chars", "maxChars": 5}]},
        actor="test",
    )
    guarded = access.prepare_for(key, ASK)
    assert guarded.guardrails != edited.guardrails

    profile_save_draft(tag="default", settings={"paths": {"maxFiles": 7}}, note="fewer files")
    profile_publish(tag="default")
    published = access.prepare_for(key, ASK)
    assert published.harness != before.harness
    assert published.harness["settings"]["paths"]["maxFiles"] == 7
