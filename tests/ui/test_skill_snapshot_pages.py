"""The snapshot page (``/ui/skills/snapshot``) through Django's test client: operators download
every skill, upload a snapshot for a preview that writes nothing, then apply it (confirm box,
replace choice); the service's refusals are shown at the form (400/409 pages, never a 500).
Viewers get neither the page nor the download. The skill form offers the s3 source."""

from __future__ import annotations

import html
import io
import re
import zipfile
from collections.abc import Callable

import pytest
from django.test import Client

from skillhub.models import Skill
from skillhub.services.skills import skill_create, skill_update

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]
PAGE = "/skills/snapshot"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _skill(tool_name: str, code: str = "print({{a}})\n") -> Skill:
    return skill_create(
        actor="test", tool_name=tool_name, title=tool_name, code_template=code,
        language="python", input_schema=SCHEMA,
    )  # fmt: skip


def _download(client: Client) -> bytes:
    response = client.get(f"{PAGE}/download")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith('attachment; filename="loopwright-skills-')
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        assert "manifest.json" in zf.namelist()
    return bytes(response.content)


def _hidden(page: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)"', page)
    assert found, f"no hidden {name}"
    return html.unescape(found.group(1))


def _preview(client: Client, data: bytes) -> tuple[int, str]:
    upload = io.BytesIO(data)
    upload.name = "snap.zip"
    response = client.post(PAGE, {"step": "preview", "file": upload})
    return response.status_code, response.content.decode()


def test_an_operator_previews_then_applies_a_snapshot(client_as: ClientAs) -> None:
    operator = client_as("operator")
    _skill("alpha")
    _skill("beta")
    page = operator.get(PAGE).content.decode()
    assert "Download a snapshot of all skills" in page and 'name="file"' in page
    data = _download(operator)
    Skill.objects.get(tool_name="alpha").delete()
    skill_update(skill=Skill.objects.get(tool_name="beta"), code_template="print(2)\n")
    _skill("gamma")  # not in the snapshot: kept

    status, page = _preview(operator, data)
    assert status == 200, page
    assert 'id="plan-alpha"' in page and "created" in page
    assert 'id="plan-beta"' in page and "code_template" in page and "conflict" in page
    assert not Skill.objects.filter(tool_name="alpha").exists()  # the preview wrote nothing
    body = {
        "step": "apply",
        "snapshot": _hidden(page, "snapshot"),
        "sha256": _hidden(page, "sha256"),
    }

    unconfirmed = operator.post(PAGE, body)
    assert unconfirmed.status_code == 400
    assert "Tick this box to apply" in unconfirmed.content.decode()
    conflict = operator.post(PAGE, {**body, "confirm": "on"})
    assert conflict.status_code == 409
    text = conflict.content.decode()
    assert "differ from the snapshot: beta" in text and 'id="plan-beta"' in text
    assert not Skill.objects.filter(tool_name="alpha").exists()

    done = operator.post(PAGE, {**body, "confirm": "on", "replace": "on"})
    assert done.status_code == 200
    text = done.content.decode()
    assert "1 created, 1 replaced, 0 unchanged" in text and "replaced: code_template" in text
    assert Skill.objects.get(tool_name="alpha").created_by == "operator"
    assert Skill.objects.get(tool_name="beta").code_template == "print({{a}})\n"
    assert Skill.objects.filter(tool_name="gamma").exists()


def test_refusals_are_shown_at_the_form(client_as: ClientAs) -> None:
    operator = client_as("operator")
    status, page = _preview(operator, b"not a zip at all")
    assert status == 400
    assert "the snapshot is not a readable zip file" in html.unescape(page)
    empty = operator.post(PAGE, {"step": "preview"})
    assert empty.status_code == 400 and "Choose a snapshot file" in empty.content.decode()
    _skill("alpha")
    data = _download(operator)
    status, page = _preview(operator, data)
    assert status == 200 and "Nothing to apply" in page
    tampered = operator.post(PAGE, {
        "step": "apply", "snapshot": "eA==",
        "sha256": "0" * 64, "confirm": "on",
    })  # fmt: skip
    assert tampered.status_code == 400
    assert "did not come back intact" in tampered.content.decode()


def test_viewers_get_neither_the_page_nor_the_download(client_as: ClientAs) -> None:
    viewer = client_as("viewer")
    assert viewer.get(PAGE).status_code == 403
    assert viewer.get(f"{PAGE}/download").status_code == 403
    assert "Snapshots" not in viewer.get("/skills").content.decode()
    assert f'href="{PAGE}"' in client_as("operator").get("/skills").content.decode()


def test_the_skill_form_offers_s3_and_the_bucket_rule_is_shown(
    client_as: ClientAs, settings: object
) -> None:
    operator = client_as("operator")
    page = operator.get("/skills/new").content.decode()
    assert '<option value="s3">S3 bucket prefix</option>' in page
    assert "LOOPWRIGHT_SKILL_S3_BUCKETS" in page
    response = operator.post("/skills/new", {
        "tool_name": "from_s3", "title": "From S3", "language": "python",
        "input_schema": '{"type": "object", "properties": {}}', "code_template": "print(1)",
        "timeout_seconds": "20", "max_output_size_mb": "1", "tool_scope": "general",
        "source": "s3", "source_ref": "s3://not-listed/skills/",
    })  # fmt: skip
    assert response.status_code == 400
    text = html.unescape(response.content.decode())
    assert 'id="field-source_ref"' in text and "s3 skills are off" in text
    assert not Skill.objects.filter(tool_name="from_s3").exists()
