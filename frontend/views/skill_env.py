"""A skill's package environment buttons (the Packages section of its page): "Build now"
(initEnv) and "Clear" (clearStorage), through the same services as the API's
``/skills/{name}/env``. Operators and admins, as the skill API's writes."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from frontend.access import ui_view
from frontend.errors import error_page
from frontend.selectors import skills
from orchestrator.accounts.roles import Role
from orchestrator.errors import InvalidInput
from skillhub.services.environments import environment_clear, environment_init


@ui_view(methods=("POST",), write=Role.OPERATOR)
def skill_env_build_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    """Build (or reuse) the environment now; a package that cannot be had is a 400 page."""
    skill = skills.skill_of(tool_name)
    try:
        status = environment_init(skill=skill)
    except InvalidInput as exc:
        return error_page(request, 400, "Package environment not built", exc.detail)
    if status["status"] == "none":
        messages.info(request, f"Skill {skill.tool_name} declares no packages.")
    else:
        pins = status["pins"]
        shown = ", ".join(pins[:5]) + (f" and {len(pins) - 5} more" if len(pins) > 5 else "")
        messages.success(
            request,
            f"Package environment of {skill.tool_name} ready: {shown} "
            f"({status['size_bytes']} bytes).",
        )
    return redirect("ui:skill", tool_name=skill.tool_name)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def skill_env_clear_view(request: HttpRequest, tool_name: str) -> HttpResponse:
    """Delete the environment from this host's cache; the pins stay for the rebuild."""
    skill = skills.skill_of(tool_name)
    status = environment_clear(skill=skill)
    if status["removed"]:
        messages.success(request, f"Package environment of {skill.tool_name} cleared.")
    else:
        messages.info(request, f"Skill {skill.tool_name} had no package environment here.")
    return redirect("ui:skill", tool_name=skill.tool_name)
