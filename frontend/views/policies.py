"""Policy (harness) profiles: list, versions, diff, draft editing, publish, compile preview."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from frontend.access import actor_of, ui_view
from frontend.diffs import json_diff
from frontend.forms import CompileForm, DraftForm, add_service_errors, default_tools_json
from frontend.selectors import agents, policies
from harness.models import HarnessProfile, HarnessProfileVersion
from harness.services import harness_preview, profile_publish, profile_save_draft
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput
from runtime.types import Effect, ToolSpec


@ui_view()
def policy_list(request: HttpRequest) -> HttpResponse:
    return render(request, "frontend/policies/list.html", {"profiles": policies.profiles()})


def _default_diff_pair(versions: list[HarnessProfileVersion]) -> tuple[int, int] | None:
    """The newest version against the one before it."""
    if len(versions) < 2:
        return None
    return versions[1].version, versions[0].version


@ui_view()
def policy_detail(request: HttpRequest, tag: str) -> HttpResponse:
    profile = policies.profile_detail(tag)
    versions = policies.profile_versions(profile)
    context = {
        "profile": profile,
        "versions": versions,
        "draft": next((v for v in versions if v.status == "draft"), None),
        "diff_pair": _default_diff_pair(versions),
    }
    return render(request, "frontend/policies/detail.html", context)


@ui_view()
def policy_version(request: HttpRequest, tag: str, version: int) -> HttpResponse:
    profile = policies.profile_detail(tag)
    found = policies.profile_version(profile, version)
    context = {"profile": profile, "version": found}
    return render(request, "frontend/policies/version.html", context)


def _version_number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@ui_view()
def policy_diff(request: HttpRequest, tag: str) -> HttpResponse:
    """``?from=N&to=M``: what changed between two versions of a profile."""
    profile = policies.profile_detail(tag)
    versions = policies.profile_versions(profile)
    pair = _default_diff_pair(versions) or (versions[0].version, versions[0].version)
    old_number = _version_number(request.GET.get("from")) or pair[0]
    new_number = _version_number(request.GET.get("to")) or pair[1]
    old = policies.profile_version(profile, old_number)
    new = policies.profile_version(profile, new_number)
    lines = json_diff(old.settings, new.settings, f"{tag}@{old.version}", f"{tag}@{new.version}")
    context = {"profile": profile, "versions": versions, "old": old, "new": new, "lines": lines}
    return render(request, "frontend/policies/diff.html", context)


def _draft_initial(profile: HarnessProfile) -> dict[str, Any]:
    draft = policies.profile_draft(profile)
    source = draft or profile.current_version
    return {
        "settings": source.settings if source else {},
        "note": draft.note if draft else "",
    }


@ui_view(methods=("GET", "POST"), write=Role.ADMIN, form_page=True)
def policy_draft(request: HttpRequest, tag: str) -> HttpResponse:
    """Edit the open draft (or open the next version from the current settings)."""
    profile = policies.profile_detail(tag)
    form = DraftForm(request.POST or None, initial=_draft_initial(profile))
    if request.method == "POST" and form.is_valid():
        try:
            saved = profile_save_draft(
                tag=profile.tag,
                settings=form.cleaned_data["settings"],
                note=form.cleaned_data["note"],
                created_by=actor_of(request),
            )
        except DomainError as exc:
            errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
            add_service_errors(form, errors or [{"pointer": "", "detail": exc.detail}], "settings")
        else:
            messages.success(request, f"Draft version {saved.version} saved. Publish it to use it.")
            return redirect("ui:policy", tag=profile.tag)
    context = {"profile": profile, "form": form, "draft": policies.profile_draft(profile)}
    status = 400 if form.is_bound else 200
    return render(request, "frontend/policies/draft.html", context, status=status)


@ui_view(methods=("POST",), write=Role.ADMIN)
def policy_publish(request: HttpRequest, tag: str) -> HttpResponse:
    profile = policies.profile_detail(tag)
    try:
        published = profile_publish(
            tag=profile.tag,
            version=_version_number(request.POST.get("version")),
            published_by=actor_of(request),
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
        # A refused publish (the registration check) names every pattern, role and tool.
        for error in exc.extra.get("errors") or []:
            if error.get("pattern"):
                messages.error(request, f"Pattern {error['pattern']}: {error['detail']}")
    else:
        messages.success(request, f"Version {published.version} of {tag} is now published.")
    return redirect("ui:policy", tag=profile.tag)


def _tool_specs(tools: list[dict[str, Any]]) -> list[ToolSpec]:
    return [
        ToolSpec(
            name=tool["name"],
            description=str(tool.get("description", "")),
            parameters=dict(tool.get("parameters") or {}),
            effect=Effect(tool.get("effect", "read")),
            enforceable=bool(tool.get("enforceable", True)),
        )
        for tool in tools
    ]


def _compile_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compile service points into its API body; point at this form's fields instead."""
    out = []
    for error in errors:
        pointer = str(error.get("pointer", ""))
        if pointer.startswith("/employee/harness"):
            pointer = "/employee_layer" + pointer[len("/employee/harness") :]
        elif pointer.startswith("/profile"):
            pointer = "/tag" + pointer[len("/profile") :]
        out.append({**error, "pointer": pointer})
    return out


def _preview(form: CompileForm) -> dict[str, Any] | None:
    data = form.cleaned_data
    try:
        compilation, plan = harness_preview(
            tag=data["tag"],
            pattern_layer=data.get("pattern"),
            employee_username=data.get("employee") or None,
            employee_layer=data.get("employee_layer"),
            run_overrides=data.get("overrides"),
            tools=_tool_specs(data.get("tools") or []),
        )
    except DomainError as exc:
        errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
        add_service_errors(
            form, _compile_errors(errors or [{"pointer": "", "detail": exc.detail}]), "tag"
        )
        return None
    snapshot = compilation.snapshot()
    return {**snapshot, "tool_plan": plan.as_list()}


@ui_view()
def policy_compile(request: HttpRequest) -> HttpResponse:
    """Preview what a role would run under. A GET form: it changes nothing, so any role may."""
    bound = "tag" in request.GET
    initial = {"tag": request.GET.get("tag") or "default", "tools": default_tools_json()}
    form = CompileForm(request.GET if bound else None, initial=initial)
    result = _preview(form) if bound and form.is_valid() else None
    context = {
        "form": form,
        "result": result,
        "tags": policies.published_tags(),
        "employees": agents.employee_usernames(),
    }
    return render(request, "frontend/policies/compile.html", context)
