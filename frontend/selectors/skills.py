"""Read-only queries of the Skills pages."""

from __future__ import annotations

import uuid

from django.core.paginator import Page, Paginator
from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
)
from django.http import Http404

from skillhub.models import Skill, SkillExecution, SkillOutputFile

HISTORY_PAGE_SIZE = 25


def skills_with_last_execution() -> list[Skill]:
    """Every skill with the status, id and time of its newest execution (``last_execution_*``)."""
    newest = SkillExecution.objects.filter(skill=OuterRef("pk")).order_by("-created_at")
    return list(
        Skill.objects.defer("archive", "code_template", "instructions")
        .annotate(
            last_execution_status=Subquery(newest.values("status")[:1]),
            last_execution_id=Subquery(newest.values("id")[:1]),
            last_execution_at=Subquery(newest.values("created_at")[:1]),
        )
        .order_by("tool_name")
    )


def skill_of(tool_name: str) -> Skill:
    """The skill in a URL, or a 404."""
    skill = Skill.objects.defer("archive").filter(tool_name=tool_name).first()
    if skill is None:
        raise Http404(f"There is no skill {tool_name!r}.")
    return skill


def skill_history(skill: Skill, page: str | int | None = 1) -> Page[SkillExecution]:
    """The skill's executions, newest first, one page at a time (a bad page number: the last)."""
    executions = (
        SkillExecution.objects.filter(skill=skill)
        .defer("code")
        .prefetch_related(Prefetch("output_files", queryset=_files_without_data()))
        .order_by("-created_at", "-id")
    )
    return Paginator(executions, HISTORY_PAGE_SIZE).get_page(page)


def _files_without_data() -> QuerySet[SkillOutputFile]:
    """Output files without their content; ``kept`` says whether the content was stored."""
    kept = ExpressionWrapper(Q(data__isnull=False), output_field=BooleanField())
    return SkillOutputFile.objects.defer("data").annotate(kept=kept).order_by("name")


def execution_of(skill: Skill, execution_id: str) -> SkillExecution:
    """One execution of ``skill``, or a 404 (never a 500 for a malformed id)."""
    try:
        pk = uuid.UUID(str(execution_id))
    except ValueError:
        raise Http404(f"There is no execution {execution_id!r}.") from None
    execution = (
        SkillExecution.objects.filter(pk=pk, skill=skill).prefetch_related("output_files").first()
    )
    if execution is None:
        raise Http404(f"Skill {skill.tool_name!r} has no execution {execution_id}.")
    return execution


def output_file_of(execution: SkillExecution, name: str) -> SkillOutputFile:
    found = SkillOutputFile.objects.filter(execution=execution, name=name).first()
    if found is None:
        raise Http404(f"Execution {execution.id} has no output file {name!r}.")
    return found
