"""Skills: list, detail with execution history, create and edit forms, the test panel, one
execution's page and its output file downloads.

Every role reads; writes and test runs need the operator role, as in ``skillhub/api.py``
(``ReadOrOperator`` for definitions, ``IsOperator`` for ``test``; admins hold every role). The
services judge: ``skill_create`` / ``skill_update`` validate the definition (``tool_name`` is
immutable), ``execution_request`` checks access, inputs and the rate limit.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from frontend.access import actor_of, can, ui_view
from frontend.errors import error_page
from frontend.forms import SkillForm, SkillReviewForm, SkillTestForm, add_service_errors
from frontend.selectors import agents, skills
from frontend.templatetags.ui import short_id
from orchestrator.accounts.roles import Role
from orchestrator.errors import Conflict, DomainError, InvalidInput
from skillhub.models import Skill, SkillLoopConfig
from skillhub.render import with_defaults
from skillhub.services.access import Caller
from skillhub.services.environments import environment_status
from skillhub.services.events import events_after
from skillhub.services.executions import execution_manifest, execution_request, execution_wait
from skillhub.services.review import skill_review_save
from skillhub.services.skills import skill_create, skill_update
from skillhub.services.versions import versions_list

#: The longest a test run holds the request (seconds); ``LOOPWRIGHT_UI["SKILL_TEST_WAIT_SECONDS"]``.
TEST_WAIT_SECONDS = 20.0
#: Added to the skill's own timeout: the time a worker needs to pick the execution up.
TEST_WAIT_GRACE_SECONDS = 5.0


def test_wait_seconds(skill: Skill) -> float:
    """How long the test panel waits for a result before it answers "still running"."""
    ceiling = float(
        getattr(settings, "LOOPWRIGHT_UI", {}).get("SKILL_TEST_WAIT_SECONDS", TEST_WAIT_SECONDS)
    )
    return max(0.0, min(skill.timeout_seconds + TEST_WAIT_GRACE_SECONDS, ceiling))


def _refuse(form: Any, exc: DomainError, fallback: str | None = None) -> None:
    """Put a service's refusal on the form: field errors at their fields, else on top."""
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    if errors:
        add_service_errors(form, errors, fallback)
    else:
        form.add_error(fallback if isinstance(exc, InvalidInput) else None, exc.detail)


def _form_page(
    request: HttpRequest, form: SkillForm, skill: Skill | None = None, status: int = 200
) -> HttpResponse:
    context = {"form": form, "skill": skill, "employees": agents.employee_usernames()}
    return render(request, "frontend/skills/form.html", context, status=status)


@ui_view()
def skill_list(request: HttpRequest) -> HttpResponse:
    listed = skills.skills_with_last_execution()
    return render(request, "frontend/skills/list.html", {"skills": listed})


@ui_view()
def skill_detail(request: HttpRequest, tool_name: str) -> HttpResponse:
    """The definition and the execution history, newest first (``?page=``)."""
    skill = skills.skill_of(tool_name)
    return render(request, "frontend/skills/detail.html", _page_context(request, skill))


def _page_context(
    request: HttpRequest, skill: Skill, review_form: SkillReviewForm | None = None
) -> dict[str, Any]:
    config = SkillLoopConfig.objects.filter(skill=skill).first()
    if review_form is None and can(request.user, Role.OPERATOR):
        review_form = SkillReviewForm(initial=SkillReviewForm.initial_of(config))
    return {
        "skill": skill,
        "history": skills.skill_history(skill, request.GET.get("page")),
        "versions": versions_list(skill),
        "review": config,
        "review_form": review_form,
        "environment": environment_status(skill=skill),
    }


@ui_view(methods=("POST",), write=Role.OPERATOR)
def skill_review_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    """The skill's human review settings: the same service as the API's ``.../review``."""
    skill = skills.skill_of(tool_name)
    form = SkillReviewForm(request.POST)
    if form.is_valid():
        try:
            skill_review_save(
                skill=skill,
                requires_review=form.cleaned_data["requires_review"],
                review_prompt=form.cleaned_data["review_prompt"] or "",
                review_schema=form.cleaned_data["review_schema"],
            )
        except InvalidInput as exc:
            add_service_errors(form, exc.extra.get("errors") or [], fallback="review_schema")
        else:
            messages.success(request, "Review settings saved.")
            return redirect("ui:skill", tool_name=skill.tool_name)
    context = _page_context(request, skill, review_form=form)
    return render(request, "frontend/skills/detail.html", context, status=400)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def skill_create_view(request: HttpRequest) -> HttpResponse:
    form = SkillForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            skill = skill_create(
                actor=actor_of(request),
                tool_name=form.cleaned_data["tool_name"],
                **form.service_fields(),
            )
        except DomainError as exc:
            _refuse(form, exc)
        else:
            messages.success(request, f"Skill {skill.tool_name} created.")
            return redirect("ui:skill", tool_name=skill.tool_name)
    return _form_page(request, form, status=400 if form.is_bound else 200)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def skill_edit_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    skill = skills.skill_of(tool_name)
    form = SkillForm(request.POST or None, initial=SkillForm.initial_of(skill), editing=True)
    if request.method == "POST" and form.is_valid():
        fields = form.service_fields()
        if form.cleaned_data.get("tool_name"):
            fields["tool_name"] = form.cleaned_data["tool_name"]  # the service refuses a change
        try:
            updated = skill_update(skill=skill, actor=actor_of(request), **fields)
        except Conflict as exc:
            form.add_error("tool_name", exc.detail)
        except DomainError as exc:
            _refuse(form, exc)
        else:
            messages.success(request, f"Skill {updated.tool_name} saved.")
            return redirect("ui:skill", tool_name=updated.tool_name)
    return _form_page(request, form, skill, status=400 if form.is_bound else 200)


def _test_page(
    request: HttpRequest, skill: Skill, form: SkillTestForm, status: int = 200
) -> HttpResponse:
    execution = None
    wanted = request.GET.get("execution")
    if wanted and not form.is_bound:
        execution = skills.execution_of(skill, wanted)
    context = {
        "skill": skill,
        "form": form,
        "execution": execution,
        "files": execution_manifest(execution) if execution else [],
        "waited": test_wait_seconds(skill),
    }
    return render(request, "frontend/skills/test.html", context, status=status)


def _example_inputs(skill: Skill) -> dict[str, Any]:
    """The test panel's starting inputs: the schema's defaults."""
    schema = skill.input_schema if isinstance(skill.input_schema, dict) else {}
    return with_defaults(schema, {})


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def skill_test_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    """Run the skill once in the sandbox with JSON inputs; wait (bounded) for the result, then
    show it on this page (``?execution=<id>``), or say it is still running and link to it."""
    skill = skills.skill_of(tool_name)
    if request.method != "POST":
        wanted = request.GET.get("execution")
        inputs = skills.execution_of(skill, wanted).inputs if wanted else _example_inputs(skill)
        return _test_page(request, skill, SkillTestForm(initial={"inputs": inputs}))
    form = SkillTestForm(request.POST)
    if not form.is_valid():
        return _test_page(request, skill, form, status=400)
    try:
        execution = execution_request(
            skill=skill,
            inputs=form.cleaned_data["inputs"] or {},
            caller=Caller.for_user(request.user),
            origin="test",
        )
    except DomainError as exc:  # inputs off the schema, a disabled skill, the rate limit
        _refuse(form, exc, fallback="inputs")
        return _test_page(request, skill, form, status=400)
    finished = execution_wait(execution_id=execution.id, timeout=test_wait_seconds(skill))
    if finished.finished:
        messages.success(request, f"Execution {short_id(finished.id)}: {finished.status}.")
    url = reverse("ui:skill-test", kwargs={"tool_name": skill.tool_name})
    return redirect(f"{url}?execution={finished.id}")


@ui_view()
def execution_detail(request: HttpRequest, tool_name: str, execution_id: str) -> HttpResponse:
    skill = skills.skill_of(tool_name)
    execution = skills.execution_of(skill, execution_id)
    context = {
        "skill": skill,
        "execution": execution,
        "files": execution_manifest(execution),
        "can_test": can(request.user, Role.OPERATOR),
        "events": events_after(execution.id, 0),
    }
    return render(request, "frontend/skills/execution.html", context)


@ui_view()
def execution_download(request: HttpRequest, tool_name: str, execution_id: str) -> HttpResponse:
    """One output file as an attachment (``?name=``), within the API's download limit."""
    skill = skills.skill_of(tool_name)
    execution = skills.execution_of(skill, execution_id)
    file = skills.output_file_of(execution, request.GET.get("name", ""))
    limit = int(settings.SKILLHUB["DOWNLOAD_MAX_BYTES"])
    if file.data is None or file.size > limit:
        return error_page(
            request,
            409,
            "Not downloadable",
            f"Output file {file.name!r} ({file.size} bytes) is over the download limit "
            f"({limit} bytes) or was not kept by the sandbox.",
        )
    response = HttpResponse(bytes(file.data), content_type="application/octet-stream")
    safe = file.name.replace('"', "").replace("\n", "").replace("\r", "").rsplit("/", 1)[-1]
    response["Content-Disposition"] = f'attachment; filename="{safe}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
