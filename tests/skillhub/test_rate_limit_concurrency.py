"""The per-principal rate limit holds under concurrent requests on real parallel connections:
exactly ``limit`` executions are created, every other request gets the 429 refusal."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller, SkillRateLimited
from skillhub.services.executions import execution_request

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_requests_cannot_pass_the_limit_together(
    make_skill: Callable[..., Skill], settings: Any
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "RATE_LIMIT_PER_MINUTE": 3}
    skill = make_skill()
    caller = Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def request() -> None:
        try:
            start.wait()
            execution_request(skill=skill, inputs={"a": 1}, caller=caller, origin="api")
            outcomes.append("created")
        except SkillRateLimited:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["created"] * 3 + ["refused"] * 5
    assert SkillExecution.objects.count() == 3
