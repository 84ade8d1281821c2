"""Forms of the UI. They parse what a person types (JSON, lists of names); the services judge it.

A service refuses bad input with ``InvalidInput`` whose ``errors`` carry JSON Pointers
(``/verifier_username``, ``/policy/concurrency``, ``/settings/tools/allow/0``);
:func:`add_service_errors` puts each message at the form field the pointer names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms

from loops.models import AutonomyLevel, LoopPattern, MissedFirePolicy, TriggerType
from orchestrator.runtime.types import Effect


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."


class JsonField(forms.CharField):
    """JSON typed as text; ``kind`` is the JSON type the value must have (object or array)."""

    widget = forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "mono"})

    def __init__(self, *, kind: type = dict, **kwargs: Any) -> None:
        self.kind = kind
        kwargs.setdefault("strip", True)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text in ("", None):
            return None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(_json_error(exc), code="invalid_json") from exc
        if not isinstance(parsed, self.kind):
            name = "object ({…})" if self.kind is dict else "array ([…])"
            raise forms.ValidationError(f"Must be a JSON {name}.", code="invalid_type")
        return parsed

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict | list):
            return json.dumps(value, indent=2, ensure_ascii=False)
        return value


class NameListField(forms.CharField):
    """Names separated by commas or new lines (or a JSON array of strings)."""

    widget = forms.Textarea(attrs={"rows": 3, "spellcheck": "false"})

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = (super().to_python(value) or "").strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise forms.ValidationError(_json_error(exc), code="invalid_json") from exc
            if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
                raise forms.ValidationError("Must be a JSON array of strings.")
            return [x.strip() for x in parsed if x.strip()]
        return [part.strip() for part in re.split(r"[,\n]", text) if part.strip()]

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        return value


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def add_service_errors(
    form: forms.Form, errors: Iterable[Mapping[str, Any]], fallback: str | None = None
) -> None:
    """Attach each ``{pointer, detail}`` to the field its pointer starts with.

    Deeper parts of the pointer prefix the message (``concurrency: …``) so a JSON field shows
    where inside it the problem is. Pointers that name no field go to ``fallback`` (or to the
    form's own errors).
    """
    for error in errors:
        parts = [_unescape(p) for p in str(error.get("pointer", "")).strip("/").split("/") if p]
        detail = str(error.get("detail", "Invalid."))
        if parts and parts[0] in form.fields:
            name: str | None = parts[0]
            inner = parts[1:]
        else:
            name = fallback if fallback in form.fields else None
            inner = parts
        form.add_error(name, f"{'.'.join(inner)}: {detail}" if inner else detail)


# --- Patterns ---------------------------------------------------------------------------------


_TEXT = {"class": "wide"}
_TAG_INPUT = forms.TextInput(attrs={"list": "harness-tags"})


class PatternForm(forms.Form):
    """Every editable field of a loop pattern. ``key`` only when creating one."""

    key = forms.SlugField(max_length=100, help_text="Letters, digits, '-' or '_'. Cannot change.")
    title = forms.CharField(max_length=200, required=False, widget=forms.TextInput(_TEXT))
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    goal_template = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        help_text="Jinja, sandboxed: {{ inputs.get('file') }}, {{ event }}, {{ pattern.key }}.",
    )
    autonomy_level = forms.ChoiceField(choices=AutonomyLevel.choices)
    trigger_type = forms.ChoiceField(choices=TriggerType.choices)
    cron_expression = forms.CharField(
        max_length=100, required=False, help_text="Cron triggers only, e.g. 0 6 * * 1-5."
    )
    timezone = forms.CharField(max_length=64, initial="UTC", help_text="For cron triggers.")
    missed_fire_policy = forms.ChoiceField(choices=MissedFirePolicy.choices)
    event_key = forms.CharField(max_length=100, required=False, help_text="Event triggers only.")
    leader_username = forms.CharField(max_length=150, help_text="Plans; changes nothing.")
    maker_usernames = NameListField(
        required=False, help_text="Comma-separated or one per line; each runs the plan in turn."
    )
    verifier_username = forms.CharField(
        max_length=150, help_text="Judges independently: must differ from the leader and makers."
    )
    leader_harness_tag = forms.CharField(max_length=100, initial="default", widget=_TAG_INPUT)
    maker_harness_tag = forms.CharField(max_length=100, initial="default", widget=_TAG_INPUT)
    verifier_harness_tag = forms.CharField(max_length=100, initial="safe", widget=_TAG_INPUT)
    repository_key = forms.CharField(max_length=200, required=False)
    repository_root = forms.CharField(max_length=500, required=False, widget=forms.TextInput(_TEXT))
    base_ref = forms.CharField(max_length=200, required=False)
    acting_on = NameListField(
        required=False, label="Acting on", help_text="Paths the run locks, one per line."
    )
    policy = JsonField(
        kind=dict,
        required=False,
        help_text=(
            "JSON object: concurrency, budgets, approvals, toolLoop, requiredChecks, harness."
        ),
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["key"]

    @classmethod
    def initial_of(cls, pattern: LoopPattern) -> dict[str, Any]:
        return {name: getattr(pattern, name) for name in cls.base_fields if name != "key"}

    def service_fields(self) -> dict[str, Any]:
        """Cleaned data as the pattern services take it."""
        data = dict(self.cleaned_data)
        data.pop("key", None)
        data["policy"] = data.get("policy") or {}
        return data


class TriggerForm(forms.Form):
    inputs = JsonField(
        kind=dict,
        required=False,
        initial="{}",
        help_text="A JSON object; the goal template reads it as inputs.",
    )


class ActionForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)


# --- Policies ---------------------------------------------------------------------------------


class DraftForm(forms.Form):
    settings = JsonField(
        kind=dict,
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false", "class": "mono"}),
        help_text="Sections: tools, memory, delegation, limits, isolation, observability.",
    )
    note = forms.CharField(max_length=500, required=False, widget=forms.TextInput(_TEXT))


def default_tools_json() -> str:
    """The builtin file tools as the compile preview's starting tool list."""
    from orchestrator.runtime.tools.files import builtin_file_tools

    tools = [
        {"name": tool.spec.name, "effect": tool.spec.effect.value} for tool in builtin_file_tools()
    ]
    return json.dumps(tools, indent=2)


class CompileForm(forms.Form):
    """What a role would run under: profile, pattern layer, employee, run overrides, tools."""

    tag = forms.CharField(
        max_length=120,
        help_text="A profile tag, or tag@version.",
        widget=forms.TextInput(attrs={"list": "compile-tags"}),
    )
    pattern = JsonField(kind=dict, required=False, label="Pattern layer")
    employee = forms.CharField(
        max_length=150,
        required=False,
        label="Employee username",
        widget=forms.TextInput(attrs={"list": "compile-employees"}),
    )
    employee_layer = JsonField(kind=dict, required=False, label="Employee layer")
    overrides = JsonField(kind=dict, required=False, label="Run overrides")
    tools = JsonField(
        kind=list,
        required=False,
        help_text='Tools to plan: [{"name": "write_file", "effect": "write"}, …]',
    )

    def clean_tools(self) -> list[dict[str, Any]]:
        tools = self.cleaned_data.get("tools") or []
        effects = {e.value for e in Effect}
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise forms.ValidationError(f"[{index}]: each tool needs a name.")
            if tool.get("effect", "read") not in effects:
                raise forms.ValidationError(
                    f"[{index}]: effect must be one of {', '.join(sorted(effects))}."
                )
        return tools
