"""Loop patterns: list, detail, create and edit forms, and "Trigger now"."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from frontend.access import actor_of, ui_view
from frontend.forms import PatternForm, TriggerForm, add_service_errors
from frontend.selectors import patterns, policies
from frontend.selectors.agents import employee_usernames
from frontend.templatetags.ui import short_id
from loops.services.patterns import pattern_create, pattern_update
from loops.services.runs import run_harness_notices, run_trigger
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput


def _form_context(form: PatternForm, **extra: Any) -> dict[str, Any]:
    return {
        "form": form,
        "harness_tags": policies.published_tags(),
        "employee_names": employee_usernames(),
        **extra,
    }


def _refuse(form: Any, exc: DomainError, fallback: str | None = None) -> None:
    """Put a service's refusal on the form: field errors at their fields, else on top."""
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    if errors:
        add_service_errors(form, errors, fallback)
    else:
        form.add_error(fallback if isinstance(exc, InvalidInput) else None, exc.detail)


@ui_view()
def pattern_list(request: HttpRequest) -> HttpResponse:
    listed = patterns.patterns_with_last_run()
    return render(request, "frontend/patterns/list.html", {"patterns": listed})


@ui_view()
def pattern_detail(request: HttpRequest, key: str) -> HttpResponse:
    pattern = patterns.pattern_detail(key)
    context = {"pattern": pattern, "runs": patterns.pattern_recent_runs(pattern)}
    return render(request, "frontend/patterns/detail.html", context)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def pattern_create_view(request: HttpRequest) -> HttpResponse:
    form = PatternForm(request.POST or None, initial={"enabled": True})
    if request.method == "POST" and form.is_valid():
        try:
            pattern = pattern_create(
                key=form.cleaned_data["key"], actor=actor_of(request), **form.service_fields()
            )
        except DomainError as exc:
            _refuse(form, exc)
        else:
            messages.success(request, f"Pattern {pattern.key} created.")
            return redirect("ui:pattern", key=pattern.key)
    status = 400 if form.is_bound else 200
    return render(request, "frontend/patterns/form.html", _form_context(form), status=status)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def pattern_edit_view(request: HttpRequest, key: str) -> HttpResponse:
    pattern = patterns.pattern_detail(key)
    form = PatternForm(request.POST or None, initial=PatternForm.initial_of(pattern), editing=True)
    if request.method == "POST" and form.is_valid():
        try:
            updated = pattern_update(pattern=pattern, **form.service_fields())
        except DomainError as exc:
            _refuse(form, exc)
        else:
            messages.success(request, f"Pattern {updated.key} saved as version {updated.version}.")
            return redirect("ui:pattern", key=updated.key)
    status = 400 if form.is_bound else 200
    context = _form_context(form, pattern=pattern)
    return render(request, "frontend/patterns/form.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def pattern_trigger_view(request: HttpRequest, key: str) -> HttpResponse:
    """Start a run now with the inputs (and optional harness overrides) typed as JSON objects,
    then show it; overrides that were not applied are named in a warning and on the run page."""
    pattern = patterns.pattern_detail(key)
    form = TriggerForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            run = run_trigger(
                pattern=pattern,
                actor=actor_of(request),
                inputs=form.cleaned_data["inputs"] or {},
                harness_overrides=form.cleaned_data.get("harness_overrides"),
            )
        except DomainError as exc:
            _refuse(form, exc, fallback="inputs")
        else:
            messages.success(request, f"Run {short_id(run.id)} of {pattern.key} started.")
            notices = run_harness_notices(run)
            if notices:
                fields = ", ".join(sorted({str(n["field"]) for n in notices}))
                messages.warning(
                    request,
                    f"Harness overrides looser than an earlier layer were not applied ({fields}); "
                    "the run page lists what each role got and which layer set it.",
                )
            return redirect("ui:run", run_id=run.id)
    status = 400 if form.is_bound else 200
    context = {"form": form, "pattern": pattern}
    return render(request, "frontend/patterns/trigger.html", context, status=status)
