"""Skill results are stored truly and exactly once: NUL characters in the output (which
PostgreSQL text and JSON cannot hold) are stored as U+FFFD with a note, a result that still
cannot be stored fails the execution once (never left for the poller to re-run), and an output
flood is reported as the output cap it hit, in both runtimes and on both streams."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from sandbox import SandboxResult
from sandbox.types import MiB
from skillhub.models import ExecutionStatus, Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import (
    execution_claim,
    execution_request,
    execution_run,
    executions_recover,
)
from skillhub.services.results import CAUSE_NOT_STORED, execution_store, storable_text
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import TEXT, SkillsWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
#: Some tests run executions inline beside a module-scoped skills worker (conftest).
INLINE_EXECUTIONS = True
PROBLEM = "application/problem+json"
EMPTY = {"type": "object", "properties": {}}
#: Programs printing NUL characters (as escapes in the source: the program text has none).
PRINTS_NUL = {
    "python": (
        "import os, sys\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/r.bin', 'wb').write(b'a\\x00b')\n"
        "sys.stdout.write('a\\x00b\\n')\n"
        "sys.stderr.write('warn\\x00\\n')\n"
    ),
    "node": ("process.stdout.write('a\\u0000b\\n');\nprocess.stderr.write('warn\\u0000\\n');\n"),
}


def make(
    language: str, code: str, *, timeout: int = 20, output_mb: int = 1, schema: Any = EMPTY
) -> Skill:
    return skill_create(
        actor="test", tool_name=f"s_{language}_{int(time.monotonic_ns() % 10**9)}",
        title="t", code_template=code, language=language, input_schema=schema,
        timeout_seconds=timeout, max_output_size_mb=output_mb,
    )  # fmt: skip


def run(skill: Skill) -> SkillExecution:
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=skill, inputs={}, caller=Caller.for_user(user), origin="test"
    )
    done = execution_run(execution_id=execution.id, owner="inline-test")
    assert done is not None
    return done


def event_types(execution: SkillExecution) -> list[str]:
    return list(execution.events.order_by("seq").values_list("type", flat=True))


# --- NUL in the output -----------------------------------------------------------------------


@pytest.mark.parametrize("language", ["python", "node"])
def test_nul_in_the_output_is_stored_as_replacement_characters_and_runs_once(
    language: str,
) -> None:
    done = run(make(language, PRINTS_NUL[language]))
    assert done.status == ExecutionStatus.SUCCEEDED, (done.error, done.stderr)
    assert done.stdout == "a\ufffdb\n" and done.stderr == "warn\ufffd\n"
    assert any("stdout: 1 NUL" in note for note in done.notes), done.notes
    assert any("stderr: 1 NUL" in note for note in done.notes), done.notes
    assert done.attempts == 1 and event_types(done).count("claimed") == 1
    assert event_types(done)[-1] == "succeeded"
    if language == "python":  # output files are bytes: kept exactly
        [out] = done.output_files.all()
        assert bytes(out.data) == b"a\x00b"
    report = executions_recover()
    assert done.id not in report.requeued + report.failed


def test_a_nul_skill_answers_through_the_api_within_its_timeout_and_runs_once(
    skills_worker: SkillsWorker, api_client_for: Callable[[str], APIClient]
) -> None:
    skill = make("python", PRINTS_NUL["python"], timeout=10)
    client = api_client_for("operator")
    started = time.monotonic()
    response = client.post(f"/api/v1/skills/{skill.tool_name}/test", {"inputs": {}}, format="json")
    elapsed = time.monotonic() - started
    assert response.status_code == 200, (response.content, skills_worker.log()[-3000:])
    execution = response.json()
    assert execution["status"] == "succeeded" and execution["stdout"] == "a\ufffdb\n"
    assert elapsed < skill.timeout_seconds
    row = SkillExecution.objects.get(pk=execution["id"])
    assert row.attempts == 1 and event_types(row).count("claimed") == 1
    assert "died or stalled" not in row.error


def test_nul_in_inputs_or_a_definition_is_refused_with_a_pointer(
    operator_client: APIClient,
) -> None:
    skill = make("node", "console.log({{text}});", schema=TEXT)
    response = operator_client.post(
        f"/api/v1/skills/{skill.tool_name}/test", {"inputs": {"text": "a\x00b"}}, format="json"
    )
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    assert [e["pointer"] for e in response.json()["errors"]] == ["/inputs/text"]
    assert not SkillExecution.objects.exists()
    schema = {**EMPTY, "description": "a\x00b"}  # JSON: PostgreSQL's jsonb refuses \u0000
    created = operator_client.post(
        "/api/v1/skills",
        {"tool_name": "nul_schema", "title": "t", "code_template": "print(1)",
         "language": "python", "input_schema": schema},
        format="json",
    )  # fmt: skip
    assert created.status_code == 400 and created["Content-Type"] == PROBLEM, created.content
    assert [e["pointer"] for e in created.json()["errors"]] == ["/input_schema/description"]
    assert "NUL" in created.json()["detail"]


def test_storable_text_replaces_nul_and_lone_surrogates() -> None:
    assert storable_text("a\x00b\udcffc") == ("a\ufffdb\ufffdc", 2)
    assert storable_text("plain ü") == ("plain ü", 0)


# --- a result that cannot be stored ----------------------------------------------------------


def test_a_result_that_cannot_be_stored_fails_the_execution_once() -> None:
    """The database refuses the write (a negative duration breaks the column's CHECK, a real
    refusal on both databases): the execution fails at once with that reason and the poller
    never re-queues it."""
    skill = make("python", "print(1)")
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=skill, inputs={}, caller=Caller.for_user(user), origin="test"
    )
    lease = execution_claim(execution_id=execution.id, owner="inline-test")
    assert lease is not None
    result = SandboxResult(
        stdout="1\n", stderr="", exit_code=0, timed_out=False, killed_reason=None,
        stdout_truncated=False, stderr_truncated=False, duration_ms=-1, output_files=(),
        backend="bubblewrap",
    )  # fmt: skip
    assert execution_store(lease=lease, result=result)
    row = SkillExecution.objects.get(pk=execution.id)
    assert row.status == ExecutionStatus.FAILED and row.attempts == 1
    assert "result could not be stored" in row.error and "not run again" in row.error
    assert row.lease_expires_at is None and row.stdout == ""
    failed = row.events.get(type="failed").data
    assert failed["cause"] == CAUSE_NOT_STORED
    report = executions_recover()
    assert execution.id not in report.requeued + report.failed
    assert SkillExecution.objects.get(pk=execution.id).status == ExecutionStatus.FAILED


# --- output caps, every runtime ----------------------------------------------------------------

FLOODS: dict[str, tuple[str, str]] = {
    "python-stdout": ("python", "import sys\nwhile True:\n    sys.stdout.write('x' * 1000)\n"),
    "python-print": ("python", "while True:\n    print('y' * 100)\n"),
    "python-stderr": ("python", "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)\n"),
    "node-stdout": ("node", "for (;;) process.stdout.write('x'.repeat(65536));"),
    "node-console": ("node", "for (;;) console.log('y'.repeat(100));"),
    "node-stderr": ("node", "for (;;) process.stderr.write('e'.repeat(1000));"),
}


@pytest.mark.parametrize("case", sorted(FLOODS))
def test_a_flood_past_the_cap_is_reported_as_the_output_cap(case: str) -> None:
    language, code = FLOODS[case]
    done = run(make(language, code, output_mb=1))
    stream = "stderr" if case.endswith("stderr") else "stdout"
    kept: Any = getattr(done, stream)
    assert done.status == ExecutionStatus.FAILED, (done.error, done.stderr[-300:])
    assert done.killed_reason == "output_cap", (done.exit_code, done.stderr[-300:])
    assert getattr(done, f"{stream}_truncated") is True
    assert len(kept.encode()) == 1 * MiB
    assert f"killed: {stream} passed the output cap" in done.error
    assert done.attempts == 1 and not done.timed_out
