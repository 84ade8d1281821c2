"""The Skills section of the Metrics page: skill executions of several skills, callers and
outcomes, counted per skill (calls, failures, timeouts, median and p90 duration), per caller and
per day by outcome, through the test client."""

from __future__ import annotations

import html as html_module
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from skillhub.models import Skill, SkillExecution
from skillhub.services.skills import skill_create

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def _skill(tool_name: str) -> Skill:
    return skill_create(
        actor="test", tool_name=tool_name, title=tool_name, code_template="print(1)",
        language="python", input_schema={"type": "object", "properties": {}},
    )  # fmt: skip


def _execution(
    skill: Skill, principal: str, status: str, ms: int | None, **fields: Any
) -> SkillExecution:
    return SkillExecution.objects.create(
        skill=skill, tool_name=skill.tool_name, language=skill.language, code="print(1)",
        timeout_seconds=30, output_cap_bytes=1024, status=status, principal=principal,
        duration_ms=ms, **fields,
    )  # fmt: skip


def _cells(text: str, row_start: str) -> list[str]:
    """The text of each cell of the first table row that starts with ``row_start``."""
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", text, re.DOTALL):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.DOTALL)]  # fmt: skip
        if cells and " ".join(cells).startswith(row_start):
            return [" ".join(c.split()) for c in cells]
    raise AssertionError(f"no row starting {row_start!r}")


def test_the_skills_section_counts_calls_failures_durations_and_callers(
    client_as: ClientAs,
) -> None:
    word, shout = _skill("word_count"), _skill("shout")
    for ms in (100, 200, 300, 400):
        _execution(word, "employee:ada", "succeeded", ms)
    _execution(word, "employee:ada", "failed", 30_000, timed_out=True)
    _execution(word, "user:op", "failed", 50)
    _execution(shout, "employee:bob", "succeeded", 1500)
    _execution(shout, "employee:bob", "queued", None)
    old = _execution(shout, "employee:bob", "failed", 10)  # outside the 7-day window
    SkillExecution.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=9))

    response = client_as("viewer").get("/ui/metrics?days=7")
    assert response.status_code == 200
    text = html_module.unescape(response.content.decode())
    section = text[text.index('id="skills-heading"') :]

    # per skill: calls, failures, of which timed out, median and p90 (nearest rank) duration
    assert _cells(section, "word_count") == ["word_count", "6", "2", "1", "200 ms", "30.0 s"]
    assert _cells(section, "shout") == ["shout", "2", "—", "—", "1.5 s", "1.5 s"]
    assert _cells(section, "All") == ["All", "8", "2", "", "", ""]
    # per caller and skill, busiest first
    callers = section[section.index('id="skill-callers"') :]
    assert _cells(callers, "ada") == ["ada employee", "word_count", "5", "1"]
    assert _cells(callers, "op") == ["op user", "word_count", "1", "1"]
    assert _cells(callers, "bob") == ["bob employee", "shout", "2", "—"]
    # the chart: today's calls stacked by outcome
    today = timezone.now().date().isoformat()
    chart = section[section.index('id="chart-skills"') :]
    for title in (f"{today} · succeeded: 5", f"{today} · failed: 2", f"{today} · other: 1"):
        assert f"<title>{title}</title>" in chart
    assert f"{(timezone.now() - timedelta(days=9)).date().isoformat()} ·" not in chart


def test_the_skills_section_says_when_no_skill_ran(client_as: ClientAs) -> None:
    text = client_as("viewer").get("/ui/metrics?days=1").content.decode()
    section = text[text.index('id="skills-heading"') :]
    assert "No skill calls in this window." in section
    assert "Skill calls per day, by outcome" in section
