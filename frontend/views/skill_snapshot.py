"""The snapshot page (``/ui/skills/snapshot``): download every skill as one snapshot, upload one,
preview what its import would do, then apply it.

Operators only, for the page and the download too (a snapshot holds every program and file, as
``GET/POST /api/v1/skills/snapshot``). The preview is ``snapshot_import`` with ``dry_run`` and
``replace`` (so it lists the skills that differ instead of stopping at the first 409); the apply
form carries the previewed file back (base64, pinned by its SHA-256) and needs the confirm box.
Every refusal of the service is shown at the form, with the status the API would give.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from django import forms
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import actor_of, ui_view
from orchestrator.accounts.roles import Role
from orchestrator.errors import Conflict, DomainError, InvalidInput
from skillhub.services.snapshots import ImportReport, snapshot_export, snapshot_import

_TEMPLATE = "frontend/skills/snapshot.html"
#: Room the apply form needs besides the base64 of the file (CSRF token, other fields).
_FORM_OVERHEAD = 16 * 1024


class SnapshotForm(forms.Form):
    """An uploaded snapshot (or, when applying, the previewed one carried back in base64)."""

    file = forms.FileField(
        required=False,
        label="Snapshot file",
        help_text="A .zip written by Download (or manage.py skills_snapshot export). The "
        "preview changes nothing.",
        widget=forms.ClearableFileInput(attrs={"accept": ".zip,application/zip"}),
    )
    snapshot = forms.CharField(required=False, strip=False, widget=forms.HiddenInput)
    sha256 = forms.RegexField(regex=r"^[0-9a-f]{64}$", required=False, widget=forms.HiddenInput)
    replace = forms.BooleanField(
        required=False,
        label="Replace the skills that differ",
        help_text="Each becomes exactly the snapshot's skill; without it, nothing is imported "
        "while one differs.",
    )
    confirm = forms.BooleanField(required=False, label="I have read the preview: apply it")


def _page(
    request: HttpRequest, form: SnapshotForm, status: int = 200, **extra: Any
) -> HttpResponse:
    context = {"form": form, "max_bytes": _page_max_bytes(), **extra}
    return render(request, _TEMPLATE, context, status=status)


def _page_max_bytes() -> int:
    """Largest snapshot the apply form can carry back within the body limit."""
    return max(0, (int(settings.LOOPWRIGHT_MAX_BODY_BYTES) - _FORM_OVERHEAD) * 3 // 4)


def _refuse(form: SnapshotForm, exc: DomainError) -> int:
    """The service's refusal at the form (each pointer named); the API's status for it."""
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    conflicts = exc.extra.get("conflicts") if isinstance(exc, Conflict) else None
    if conflicts:
        form.add_error(
            "replace",
            f"These skills exist here and differ from the snapshot: {', '.join(conflicts)}. "
            "Tick this box to replace them, or leave them and import nothing.",
        )
    elif errors:
        for error in errors:
            form.add_error("file", f"{error.get('pointer') or '/'}: {error.get('detail')}")
    else:
        form.add_error(None, str(exc.detail))
    return 409 if isinstance(exc, Conflict) else 400


def _uploaded(form: SnapshotForm, applying: bool) -> bytes | None:
    """The snapshot's bytes: the upload, or when applying the previewed file (its SHA-256
    checked); None with an error on the form."""
    data = form.cleaned_data
    if not applying:
        upload = data.get("file")
        if upload is None:
            form.add_error("file", "Choose a snapshot file (.zip) to preview.")
            return None
        return bytes(upload.read())
    try:
        raw = base64.b64decode(data.get("snapshot") or "", validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw or hashlib.sha256(raw).hexdigest() != data.get("sha256"):
        form.add_error(None, "The previewed snapshot did not come back intact: preview again.")
        return None
    return raw


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def skill_snapshot_view(request: HttpRequest) -> HttpResponse:
    """GET: download link and upload form. POST ``step=preview``: the dry run's report;
    POST ``step=apply``: the import, then what it did."""
    if request.method != "POST":
        return _page(request, SnapshotForm())
    form = SnapshotForm(request.POST, request.FILES)
    applying = request.POST.get("step") == "apply"
    raw = _uploaded(form, applying) if form.is_valid() else None
    if raw is None:  # the upload form again, with the reason
        return _page(request, form, status=400)
    return _apply(request, form, raw) if applying else _preview(request, form, raw)


def _dry_run(raw: bytes, actor: str) -> ImportReport:
    """What an import with ``replace`` would do: the skills that differ are listed, not a 409."""
    return snapshot_import(data=raw, actor=actor, replace=True, dry_run=True)


def _preview(request: HttpRequest, form: SnapshotForm, raw: bytes) -> HttpResponse:
    if len(raw) > _page_max_bytes():
        form.add_error(
            "file",
            f"This snapshot ({len(raw)} bytes) is larger than the page can apply "
            f"({_page_max_bytes()} bytes): use manage.py skills_snapshot import.",
        )
        return _page(request, form, status=400)
    try:
        report = _dry_run(raw, actor_of(request))
    except DomainError as exc:
        return _page(request, form, status=_refuse(form, exc))
    carried = SnapshotForm(
        initial={
            "snapshot": base64.b64encode(raw).decode("ascii"),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "replace": bool(form.cleaned_data.get("replace")),
        }
    )
    return _page(request, carried, preview=report, size=len(raw))


def _apply(request: HttpRequest, form: SnapshotForm, raw: bytes) -> HttpResponse:
    """The import; a refusal is shown with the preview again, the form keeping the file."""
    replace = bool(form.cleaned_data.get("replace"))
    try:
        if not form.cleaned_data.get("confirm"):
            form.add_error("confirm", "Tick this box to apply the previewed snapshot.")
            raise InvalidInput("not confirmed")
        report = snapshot_import(data=raw, actor=actor_of(request), replace=replace)
    except DomainError as exc:
        status = 400 if form.has_error("confirm") else _refuse(form, exc)
        try:
            preview: ImportReport | None = _dry_run(raw, actor_of(request))
        except DomainError:
            preview = None
        return _page(request, form, status=status, preview=preview, size=len(raw), applying=True)
    return _page(request, SnapshotForm(), result=report)


@ui_view(write=Role.OPERATOR, form_page=True)
def skill_snapshot_download(request: HttpRequest) -> HttpResponse:
    """Every skill as a snapshot zip (as ``GET /api/v1/skills/snapshot``)."""
    export = snapshot_export()
    response = HttpResponse(export.data, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
    response["X-Manifest-SHA256"] = export.manifest_sha256
    response["X-Content-Type-Options"] = "nosniff"
    return response
