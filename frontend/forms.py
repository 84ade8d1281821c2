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
from orchestrator.jsonlimits import JsonRefused, loads_bounded
from runtime.tools.files import builtin_file_tools
from runtime.types import Effect
from skillhub.models import SkillLanguage, SkillSource


def _json_error(exc: ValueError) -> str:
    if isinstance(exc, JsonRefused):
        return exc.detail
    if isinstance(exc, json.JSONDecodeError):
        return f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    return f"Not valid JSON: {exc}."


def _loads(text: str) -> Any:
    """JSON typed into a form, held to the API's bounds (depth, NUL characters, surrogates,
    non-finite numbers: :mod:`orchestrator.jsonlimits`); ``ValueError`` when refused."""
    return loads_bounded(text)


class JsonField(forms.CharField):
    """JSON typed as text; ``kind`` is the JSON type the value must have (object or array)."""

    widget = forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "mono"})

    def __init__(self, *, kind: type = dict, schema: str = "", **kwargs: Any) -> None:
        self.kind = kind
        kwargs.setdefault("strip", True)
        super().__init__(**kwargs)
        if schema:  # checked as it is typed against /ui/schemas/<schema>.json (editor.js)
            self.widget.attrs["data-json-schema"] = f"/ui/schemas/{schema}.json"

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text in ("", None):
            return None
        try:
            parsed = _loads(text)
        except ValueError as exc:
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
                parsed = _loads(text)
            except ValueError as exc:
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
#: An employee's username, with the employees offered (a <datalist id="employee-names">).
_EMPLOYEE_INPUT = forms.TextInput(attrs={"list": "employee-names", "autocomplete": "off"})


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
    leader_username = forms.CharField(
        max_length=150, help_text="Plans; changes nothing.", widget=_EMPLOYEE_INPUT
    )
    maker_usernames = NameListField(
        required=False,
        help_text="Comma-separated or one per line; each runs the plan in turn.",
        widget=forms.Textarea(
            attrs={"rows": 3, "spellcheck": "false", "data-pick-from": "employee-names"}
        ),
    )
    verifier_username = forms.CharField(
        max_length=150,
        help_text="Judges independently: must differ from the leader and makers.",
        widget=_EMPLOYEE_INPUT,
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
        schema="pattern-policy",
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
    harness_overrides = JsonField(
        kind=dict,
        schema="harness-settings",
        required=False,
        label="Harness overrides",
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "class": "mono"}),
        help_text=(
            'Optional: this run\'s own harness layer, e.g. {"limits": {"maxInvocations": 3}}. '
            "It can only tighten; a value looser than the profile's, the pattern's or the "
            "employee's is not applied, and the run page says so."
        ),
    )


# --- Employees --------------------------------------------------------------------------------


class EmployeeHarnessForm(forms.Form):
    """An AI employee's own harness layers; the employee services judge them."""

    harness_tag = forms.CharField(
        max_length=120,
        required=False,
        label="Harness profile",
        widget=_TAG_INPUT,
        help_text="A published profile (tag or tag@N) stacked on the employee's runs; blank: none.",
    )
    harness = JsonField(
        kind=dict,
        schema="harness-settings",
        required=False,
        label="Inline harness settings",
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false", "class": "mono"}),
        help_text=(
            "Layer settings as in a profile, e.g. "
            '{"limits": {"recursionLimit": 5}, "tools": {"deny": ["write"]}}; blank: none.'
        ),
    )

    @classmethod
    def initial_of(cls, employee: Any) -> dict[str, Any]:
        return {"harness_tag": employee.harness_tag, "harness": employee.harness or None}

    def service_fields(self) -> dict[str, Any]:
        return {
            "harness_tag": self.cleaned_data.get("harness_tag") or "",
            "harness": self.cleaned_data.get("harness") or {},
        }


class ActionForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)


# --- Policies ---------------------------------------------------------------------------------


class DraftForm(forms.Form):
    settings = JsonField(
        kind=dict,
        schema="harness-settings",
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false", "class": "mono"}),
        help_text=(
            "Sections: tools, limits, paths, isolation, delegation, observability "
            "(memory: off only)."
        ),
    )
    note = forms.CharField(max_length=500, required=False, widget=forms.TextInput(_TEXT))


def default_tools_json() -> str:
    """The builtin file tools as the compile preview's starting tool list."""
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
    pattern = JsonField(kind=dict, schema="harness-settings", required=False, label="Pattern layer")
    employee = forms.CharField(
        max_length=150,
        required=False,
        label="Employee username",
        widget=forms.TextInput(attrs={"list": "compile-employees"}),
    )
    employee_layer = JsonField(
        kind=dict, schema="harness-settings", required=False, label="Employee layer"
    )
    overrides = JsonField(
        kind=dict, schema="harness-settings", required=False, label="Run overrides"
    )
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


# --- Approvals --------------------------------------------------------------------------------


class DecideForm(forms.Form):
    """One decision on a gated call. ``input`` holds the arguments as the approver left them:
    unchanged means "approve as proposed"; changed means "approve these instead" (the service
    validates them against the tool's schema and the run's policy). A rejection ignores it.
    A question a call asked (kind ``input``) is answered with ``answer`` instead."""

    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject"), ("answer", "Answer")]
    )
    answer = forms.CharField(
        label="Your answer",
        max_length=10_000,
        required=False,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Sent to the agent that asked, on the same task; the call then goes on.",
    )
    input = forms.CharField(
        label="Arguments (JSON)",
        required=False,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false", "class": "mono"}),
        help_text="Edit them to approve a changed call; they must fit the tool's parameters.",
    )
    reason = forms.CharField(
        label="Reason",
        max_length=2000,
        required=False,
        help_text="Shown in the run's history; a rejection's reason is what the model is told.",
    )

    def __init__(self, *args: Any, proposed: dict[str, Any], **kwargs: Any) -> None:
        kwargs.setdefault("initial", {"input": json.dumps(proposed, indent=2, ensure_ascii=False)})
        super().__init__(*args, **kwargs)
        self.proposed = proposed

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        cleaned["edited"] = None
        if cleaned.get("decision") == "answer" and not cleaned.get("answer"):
            self.add_error("answer", "Write the answer to send, or reject the question.")
        if cleaned.get("decision") != "approve" or not cleaned.get("input"):
            return cleaned
        try:
            parsed = _loads(cleaned["input"])
        except ValueError as exc:
            self.add_error("input", _json_error(exc))
            return cleaned
        if not isinstance(parsed, dict):
            self.add_error("input", "Must be a JSON object ({…}) of the tool's arguments.")
        elif parsed != self.proposed:
            cleaned["edited"] = parsed
        return cleaned


# --- Skills -----------------------------------------------------------------------------------


class SkillForm(forms.Form):
    """The editable fields of a skill. ``tool_name`` is typed once; when editing it is shown
    read-only and ``skill_update`` refuses a different one (agents call the skill by it)."""

    tool_name = forms.CharField(
        max_length=48,
        label="Tool name",
        help_text="Lower-case letters, digits and '_'; agents call it skill_hub_<tool name>. "
        "Cannot change after creation.",
        widget=forms.TextInput(attrs={"class": "mono", "autocomplete": "off"}),
    )
    title = forms.CharField(max_length=200, widget=forms.TextInput(_TEXT))
    description = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the skill does; agents and MCP clients read it.",
    )
    instructions = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="How to use it, appended to the tool description.",
    )
    language = forms.ChoiceField(choices=SkillLanguage.choices)
    input_schema = JsonField(
        kind=dict,
        label="Input schema",
        initial='{\n  "type": "object",\n  "properties": {},\n  "required": []\n}',
        help_text='JSON Schema (2020-12) with "type": "object"; each {{placeholder}} of the '
        "code must be one of its properties.",
    )
    code_template = forms.CharField(
        label="Code template",
        strip=False,
        widget=forms.Textarea(
            attrs={
                "rows": 14,
                "spellcheck": "false",
                "class": "mono",
                "data-code-editor": "python",
                "data-language-from": "id_language",
            }
        ),
        help_text="The program; {{name}} is replaced by the input as a literal of the language. "
        "Files written under out/ are kept as output files. Inputs are also on stdin as JSON.",
    )
    packages = NameListField(
        required=False,
        help_text=(
            "Packages to install for the program, one per line: PyPI names (PyYAML, "
            "numpy==1.26.4) or npm names (lodash, @scope/name@1.2.3); installed before the "
            "first run, pinned, read-only in the sandbox (docs/skills.md). Deno skills take "
            "none."
        ),
    )
    timeout_seconds = forms.IntegerField(
        label="Timeout (seconds)", initial=30, help_text="1 to 600; the sandbox kills it after."
    )
    max_output_size_mb = forms.IntegerField(
        label="Max output (MB)", initial=1, help_text="1 to 100: stdout, stderr and each file."
    )
    enabled = forms.BooleanField(required=False, initial=True)
    auto_call = forms.BooleanField(
        required=False,
        label="Auto call (no approval gate: agents see the tool as read-only)",
    )
    tool_scope = forms.ChoiceField(
        label="Tool scope",
        choices=[
            ("general", "General (all employees)"),
            ("specified", "Specified employees"),
            ("custom", "Custom (bound per employee)"),
        ],
        initial="general",
    )
    employees = NameListField(
        required=False,
        help_text="Specified scope: employee usernames, comma-separated or one per line.",
    )

    source = forms.ChoiceField(
        label="Files from",
        required=False,
        choices=SkillSource.choices,
        initial=SkillSource.DB_ZIP,
        help_text="Where the files placed next to the program come from: the database (a zip "
        "uploaded through the API, or none); a local directory under an admin-listed root; "
        "S3: the objects under s3://bucket/prefix/ of a bucket an admin lists "
        "(LOOPWRIGHT_SKILL_S3_BUCKETS), fetched at each run; Git and registry skills are "
        "written by their imports.",
    )
    source_ref = forms.CharField(
        max_length=1000,
        required=False,
        label="Source location",
        help_text="Local directory: its absolute path. S3: s3://bucket/prefix/. Git: the "
        "repository URL. Empty for the database.",
        widget=forms.TextInput(attrs={"class": "wide mono", "spellcheck": "false"}),
    )

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editing = editing
        if editing:
            field = self.fields["tool_name"]
            field.required = False
            field.widget.attrs.update({"readonly": True, "aria-readonly": "true"})
            field.help_text = "Cannot change: agents and MCP clients call the skill by it."

    @classmethod
    def initial_of(cls, skill: Any) -> dict[str, Any]:
        return {name: getattr(skill, name) for name in cls.base_fields}

    def service_fields(self) -> dict[str, Any]:
        """Cleaned data as ``skill_create`` / ``skill_update`` take it (no ``tool_name``)."""
        data = dict(self.cleaned_data)
        data.pop("tool_name", None)
        if not data.get("source"):  # not sent: the skill keeps its source (db-zip when new)
            data.pop("source", None)
            data.pop("source_ref", None)
        return data


class SkillTestForm(forms.Form):
    inputs = JsonField(
        kind=dict,
        required=False,
        initial="{}",
        label="Inputs (JSON)",
        help_text="A JSON object matching the input schema.",
    )


class SkillImportForm(forms.Form):
    """The Git import page: a repository and a ref; ``commit`` pins the applied import to the
    commit the preview showed."""

    repository = forms.CharField(
        max_length=1000,
        label="Repository",
        help_text="An https:// Git URL whose root holds skills.json (schemes and hosts "
        "allowed: LOOPWRIGHT_GIT_SCHEMES, LOOPWRIGHT_GIT_HOSTS).",
        widget=forms.TextInput(attrs={"class": "wide mono", "spellcheck": "false"}),
    )
    ref = forms.CharField(
        max_length=200,
        required=False,
        initial="HEAD",
        label="Ref",
        help_text="A branch, tag or commit (HEAD when empty).",
        widget=forms.TextInput(attrs={"class": "mono", "spellcheck": "false"}),
    )
    commit = forms.RegexField(
        regex=r"^[0-9a-f]{40}([0-9a-f]{24})?$", required=False, widget=forms.HiddenInput
    )

    def clean_ref(self) -> str:
        return str(self.cleaned_data.get("ref") or "").strip() or "HEAD"


class SkillReviewForm(forms.Form):
    """A skill's human review settings (skillhub.services.review judges them)."""

    requires_review = forms.BooleanField(
        required=False,
        label="Every agent call waits for a person",
        help_text="Even where the harness or the pattern's autoAllowlist would allow it.",
    )
    review_prompt = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Shown to the reviewer with each call (it is the approval's reason).",
    )
    review_schema = JsonField(
        kind=dict,
        required=False,
        label="Review schema",
        help_text="Optional JSON Schema (an object) of what the reviewer checks.",
    )

    @classmethod
    def initial_of(cls, config: Any) -> dict[str, Any]:
        if config is None:
            return {"requires_review": False}
        return {
            "requires_review": config.requires_review,
            "review_prompt": config.review_prompt,
            "review_schema": config.review_schema,
        }
