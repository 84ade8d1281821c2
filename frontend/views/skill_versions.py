"""A skill's "Roll back" button (the History section of its page lists the versions): restore a
version's state through ``skill_rollback``, which records it as a new version. Operators and
admins, as the skill API's writes."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from frontend.access import actor_of, ui_view
from frontend.errors import error_page
from frontend.selectors import skills
from orchestrator.accounts.roles import Role
from orchestrator.errors import InvalidInput
from skillhub.services.rollback import skill_rollback


@ui_view(methods=("POST",), write=Role.OPERATOR)
def skill_rollback_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    """POST ``reason`` (required) and optionally ``version`` (default: see the service)."""
    skill = skills.skill_of(tool_name)
    wanted = request.POST.get("version", "").strip()
    if wanted and not wanted.isdigit():
        return error_page(request, 400, "Rollback refused", "version: must be a version number")
    try:
        restored = skill_rollback(
            skill=skill,
            actor=actor_of(request),
            reason=request.POST.get("reason", "")[:2000],
            to=int(wanted) if wanted else None,
        )
    except InvalidInput as exc:
        return error_page(request, 400, "Rollback refused", exc.detail)
    latest = restored.versions.order_by("-number").values_list("number", "restored_from")[0]
    messages.success(
        request,
        f"Skill {skill.tool_name} rolled back to version {latest[1]} (now version {latest[0]}).",
    )
    return redirect("ui:skill", tool_name=skill.tool_name)
