"""An employee's daily token quota binds its chats (and its runs: tests/agents/
test_employee_quotas.py): once a chat has used it up, the next is a 429 ``quota_exceeded`` with
``Retry-After`` and reaches no model. The real app under uvicorn, the official SDK, a model over
loopback HTTP."""

from __future__ import annotations

import openai
import pytest

from orchestrator.agents.models import Employee, EmployeeUsageDay
from tests.gateway.conftest import Team
from tests.support.model_server import Completion
from tests.support.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_chat_out_of_quota_is_429_with_retry_after(server: str, team: Team) -> None:
    ada = team.employee("ada")
    Employee.objects.filter(pk=ada.pk).update(daily_token_quota=10)
    key = team.caller("alice", ada)
    team.model.queue(Completion(content="first"))
    with openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30) as sdk:
        sdk.chat.completions.create(model="ada", messages=[{"role": "user", "content": "hi"}])
        wait_for(lambda: EmployeeUsageDay.objects.filter(username="ada", tokens=15).exists(), 10)
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(model="ada", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "quota_exceeded"
    assert 'employee "ada" has used its daily tokens quota (10; 15 today)' in str(refused.value)
    retry_after = int(refused.value.response.headers["Retry-After"])
    assert 0 < retry_after <= 86_401
    assert len(team.model.bodies) == 1
