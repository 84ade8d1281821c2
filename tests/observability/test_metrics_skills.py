"""A skill execution, run to its end by the real execution path and sandbox, is counted by its
final status on ``/metrics``."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import ExecutionStatus
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run
from skillhub.services.skills import skill_create
from tests.observability.scrape import moved, web_scrape
from tests.skillhub.conftest import NUMBERS, PY_ADD, SKILL_QUEUE


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_a_finished_skill_execution_is_counted_by_its_final_status(settings: Any) -> None:
    # No worker consumes this queue: the test runs the execution itself, as a skills worker does.
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": f"{SKILL_QUEUE}-metrics"}
    skill = skill_create(
        actor="test",
        tool_name="py_add_metrics",
        title="add",
        description="Adds two numbers",
        code_template=PY_ADD,
        language="python",
        input_schema=NUMBERS,
        timeout_seconds=20,
    )
    caller = Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))
    execution = execution_request(skill=skill, inputs={"a": 2, "b": 3}, caller=caller, origin="api")
    before = web_scrape()
    finished = execution_run(execution_id=execution.id, owner="metrics-test")
    assert finished is not None and finished.status == ExecutionStatus.SUCCEEDED, finished
    after = web_scrape()
    assert moved(before, after, "loopwright_skill_executions_total", outcome="succeeded") == 1
    assert moved(before, after, "loopwright_skill_executions_total", outcome="failed") == 0
