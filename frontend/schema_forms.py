"""The decision form of an approval whose call has forms (docs/approvals.md): its arguments as
fields of its ``interaction_schema``, the review as fields of its ``review_schema``.

Holds: the fields are built by the pure :mod:`frontend.schema_fields`, and what was posted is
read back through it (never through Django's own coercion), so the page offers exactly what
the parser accepts; the service then validates the arguments against the tool's schema and
the review against the schema the approval captured, and its errors come back at the fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms

from frontend.forms import DecideForm, add_service_errors
from frontend.schema_fields import (
    FormField,
    is_whole,
    merged_input,
    parse_values,
    posted_values,
    schema_fields,
)


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _number(value: Any) -> Any:
    """A bound as HTML shows it: ``0``, not ``0.0``."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _widget(field: FormField, attrs: dict[str, Any]) -> forms.Widget:
    if field.kind == "select":
        blank = [("", "—")]
        return forms.Select(attrs=attrs, choices=blank + [(c, c) for c in field.choices])
    if field.kind == "checkbox":
        return forms.CheckboxInput(attrs=attrs)
    if field.kind == "checkboxes":
        return forms.CheckboxSelectMultiple(attrs=attrs, choices=[(c, c) for c in field.choices])
    if field.kind in ("integer", "number"):
        bounds = {
            "min": field.minimum,
            "max": field.maximum,
            "step": "1" if field.kind == "integer" else "any",
        }
        shown = {k: _number(v) for k, v in bounds.items() if v is not None}
        return forms.NumberInput(attrs={**attrs, **shown})
    if field.kind == "text":
        return forms.TextInput(attrs={**attrs, "maxlength": field.max_length})
    if field.kind == "json":
        return forms.Textarea(attrs={**attrs, "rows": 4, "spellcheck": "false", "class": "mono"})
    extra = {"maxlength": field.max_length} if field.max_length else {}
    return forms.Textarea(attrs={**attrs, "rows": 3, **extra})


def _initial(field: FormField, shown: list[str]) -> Any:
    if field.kind == "checkbox":
        return bool(shown)
    if field.kind == "checkboxes":
        return shown
    return shown[0] if shown else ""


#: Property names that are safe as a form field's name and in an HTML id.
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class SchemaFieldset:
    """The fields of one schema on a form, named ``<prefix>__<property>`` (``<prefix>_<n>``
    for a property whose name is not safe in a name and an id; no clash: one underscore)."""

    def __init__(self, prefix: str, schema: Any) -> None:
        self.prefix = prefix
        self.fields = schema_fields(schema)
        self.names = [
            f"{prefix}__{f.name}" if _SAFE.match(f.name) else f"{prefix}_{i}"
            for i, f in enumerate(self.fields)
        ]

    def add_to(self, form: forms.Form, value: Any) -> None:
        shown = posted_values(self.fields, value)
        for field, name in zip(self.fields, self.names, strict=True):
            help_text = field.help + (" (JSON)" if field.kind == "json" else "")
            form.fields[name] = forms.CharField(
                label=field.label,
                required=False,  # what is required is the schema's call, checked by the service
                initial=_initial(field, shown[field.name]),
                help_text=help_text.strip(),
                widget=_widget(field, {"data-kind": field.kind, "data-name": field.name}),
            )

    def posted(self, data: Any) -> dict[str, list[str]]:
        return {f.name: list(data.getlist(n)) for f, n in zip(self.fields, self.names, strict=True)}

    def name_of(self, property_name: str) -> str:
        return self.names[[f.name for f in self.fields].index(property_name)]

    def field_at(self, pointer: str, root: str) -> tuple[str, str] | None:
        """The form field a service error at ``pointer`` (under ``root``) belongs to, and the
        rest of its path; None when it is not under ``root``."""
        if pointer != root and not pointer.startswith(f"{root}/"):
            return None
        parts = [_unescape(p) for p in pointer[len(root) :].split("/") if p]
        if is_whole(self.fields):
            return self.names[0], ".".join(parts)
        if parts and parts[0] in [f.name for f in self.fields]:
            return self.name_of(parts[0]), ".".join(parts[1:])
        return None

    def bound(self, form: forms.Form) -> list[tuple[FormField, Any]]:
        return [(f, form[n]) for f, n in zip(self.fields, self.names, strict=True)]


class SchemaDecideForm(DecideForm):
    """:class:`DecideForm` with the call's arguments as fields (when the approval has an
    interaction schema: the JSON ``input`` is then gone) and the review as fields (when it has
    a review schema). ``cleaned_data["review"]`` is the typed review (None without one)."""

    def __init__(self, *args: Any, approval: Any, **kwargs: Any) -> None:
        super().__init__(*args, proposed=approval.arguments, **kwargs)
        self.input_set: SchemaFieldset | None = None
        self.review_set: SchemaFieldset | None = None
        if approval.interaction_schema is not None and approval.kind == "call":
            self.input_set = SchemaFieldset("arg", approval.interaction_schema)
            del self.fields["input"]
            self.input_set.add_to(self, approval.arguments)
        if approval.review_schema is not None:
            self.review_set = SchemaFieldset("review", approval.review_schema)
            self.review_set.add_to(self, approval.review)

    @property
    def input_fields(self) -> list[tuple[FormField, Any]]:
        return self.input_set.bound(self) if self.input_set is not None else []

    @property
    def review_fields(self) -> list[tuple[FormField, Any]]:
        return self.review_set.bound(self) if self.review_set is not None else []

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        cleaned["review"] = None
        if self.input_set is not None:
            merged, problems = merged_input(
                self.input_set.fields, self.proposed, self.input_set.posted(self.data)
            )
            self._problems(self.input_set, problems)
            if cleaned.get("decision") == "approve" and not problems:
                cleaned["edited"] = None if merged == self.proposed else merged
        if self.review_set is not None:
            review, problems = parse_values(
                self.review_set.fields, self.review_set.posted(self.data)
            )
            self._problems(self.review_set, problems)
            cleaned["review"] = review
        return cleaned

    def _problems(self, fieldset: SchemaFieldset, problems: Mapping[str, str]) -> None:
        for name, problem in problems.items():
            self.add_error(fieldset.name_of(name), problem)

    def add_service_errors(self, errors: Iterable[Mapping[str, Any]]) -> None:
        """The service's ``{pointer, detail}`` at the fields they name (``/input/…`` at an
        argument's field, ``/review/…`` at the review's); the rest as :func:`add_service_errors`."""
        rest = []
        for error in errors:
            pointer, detail = str(error.get("pointer", "")), str(error.get("detail", "Invalid."))
            for fieldset, root in ((self.input_set, "/input"), (self.review_set, "/review")):
                found = fieldset.field_at(pointer, root) if fieldset is not None else None
                if found is not None:
                    name, inner = found
                    self.add_error(name, f"{inner}: {detail}" if inner else detail)
                    break
            else:
                rest.append(error)
        fallback = "input" if "input" in self.fields else None
        add_service_errors(self, rest, fallback=fallback)
