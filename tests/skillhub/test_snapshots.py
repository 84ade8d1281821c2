"""Skill Hub snapshots (docs/skills.md, Snapshots): export over the API, wipe, import with the
command, and every field, review setting and file comes back byte for byte; tampered snapshots
(a changed byte, a missing or extra entry, a bad manifest, an invalid skill) are refused with a
400 naming the problem and nothing written; same-name skills need ``replace``; dry runs write
nothing."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from orchestrator.agents.services import employee_create, model_endpoint_create
from skillhub.models import Skill, SkillLoopConfig
from skillhub.services import snapshot_format
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import NODE_UPPER, NUMBERS, PY_ADD, TEXT

pytestmark = pytest.mark.django_db
SNAPSHOT = "/api/v1/skills/snapshot"
PROBLEM = "application/problem+json"
FIELDS = (
    "tool_name", "title", "description", "instructions", "code_template", "language",
    "input_schema", "interaction_schema", "packages", "timeout_seconds", "max_output_size_mb",
    "enabled", "auto_call", "tool_scope", "employees", "source", "source_ref", "source_path",
    "source_commit",
)  # fmt: skip


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


def _skills() -> None:
    """Three skills with files, an interaction schema, packages, a specified scope, a review
    config and Git source fields."""
    endpoint = model_endpoint_create(
        name="ep-snap", provider="openai", base_url="http://127.0.0.1:9/v1", model="m"
    )
    employee_create(username="snap_emp", endpoint=endpoint, tools=[])
    files = {"lib/helper.py": b"X = 1\n", "data.bin": bytes(range(256)) * 4}
    py = skill_create(
        actor="t", tool_name="py_add", title="Add", description="Adds", code_template=PY_ADD,
        language="python", input_schema=NUMBERS, instructions="Use it.",
        interaction_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        packages=["json", "xml.etree"], timeout_seconds=17, max_output_size_mb=3,
        auto_call=True, tool_scope="specified", employees=["snap_emp"], archive=_zip(files),
    )  # fmt: skip
    SkillLoopConfig.objects.create(
        skill=py, requires_review=True, review_prompt="Check it", review_schema={"type": "object"}
    )
    skill_create(
        actor="t", tool_name="node_upper", title="Upper", code_template=NODE_UPPER,
        language="node", input_schema=TEXT, enabled=False, tool_scope="custom",
        packages=["lodash", "@scope/name"],
    )  # fmt: skip
    git = skill_create(
        actor="t", tool_name="git_one", title="From Git", code_template="print(1)\n",
        language="python", input_schema={"type": "object"}, source="git",
        source_ref="https://example.org/r.git", source_path="skills/one", archive=_zip({"a": b""}),
    )  # fmt: skip
    Skill.objects.filter(pk=git.pk).update(source_commit="a" * 40)


def _state() -> dict[str, Any]:
    """Every field, archive byte and review setting of every skill."""
    state = {}
    for skill in Skill.objects.order_by("tool_name"):
        config = SkillLoopConfig.objects.filter(skill=skill).first()
        state[skill.tool_name] = {
            **{name: getattr(skill, name) for name in FIELDS},
            "archive": None if skill.archive is None else bytes(skill.archive),
            "review": None
            if config is None
            else (config.requires_review, config.review_prompt, config.review_schema),
        }
    return state


def _export(client: APIClient) -> bytes:
    response = client.get(SNAPSHOT)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/zip"
    digest = response["X-Manifest-SHA256"]
    assert digest[:16] in response["Content-Disposition"]
    return response.content


def _import(client: APIClient, data: bytes, query: str = "") -> Any:
    return client.generic("POST", f"{SNAPSHOT}{query}", data, content_type="application/zip")


def test_a_snapshot_round_trip_restores_every_field_and_file(
    operator_client: APIClient, tmp_path: Path
) -> None:
    _skills()
    before = _state()
    data = _export(operator_client)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert (
            zf.read("manifest.json.sha256").decode().split()[0]
            == hashlib.sha256(zf.read("manifest.json")).hexdigest()
        )
    assert manifest["format_version"] == 1 and "loopwright_version" in manifest
    py = next(s for s in manifest["skills"] if s["tool_name"] == "py_add")
    assert {f["name"] for f in py["archive"]["files"]} == {"lib/helper.py", "data.bin"}
    assert py["review"]["review_prompt"] == "Check it"

    Skill.objects.all().delete()
    target = tmp_path / "snap.zip"
    target.write_bytes(data)
    out = io.StringIO()
    call_command("skills_snapshot", "import", str(target), stdout=out)
    assert sorted(json.loads(out.getvalue())["created"]) == sorted(before)
    after = _state()
    for name in before:
        for key in before[name]:
            assert after[name][key] == before[name][key], (name, key)
    assert after == before

    again = _import(operator_client, data)
    assert again.status_code == 200, again.content
    assert sorted(again.json()["unchanged"]) == sorted(before) and again.json()["created"] == []


def test_the_command_exports_chosen_skills(
    make_skill: Callable[..., Skill], tmp_path: Path
) -> None:
    make_skill("one")
    make_skill("two")
    target = tmp_path / "one.zip"
    call_command(
        "skills_snapshot", "export", str(target), "--tool-name", "one", stdout=io.StringIO()
    )
    with zipfile.ZipFile(target) as zf:
        names = [s["tool_name"] for s in json.loads(zf.read("manifest.json"))["skills"]]
    assert names == ["one"]
    with pytest.raises(CommandError, match="nope"):
        call_command("skills_snapshot", "export", str(target), "--tool-name", "nope")


def test_a_differing_skill_needs_replace_and_a_dry_run_writes_nothing(
    operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill("py_add")
    data = _export(operator_client)
    Skill.objects.filter(tool_name="py_add").update(title="Edited", timeout_seconds=99)
    make_skill("local_only")

    refused = _import(operator_client, data)
    assert refused.status_code == 409 and refused["Content-Type"] == PROBLEM
    assert refused.json()["conflicts"] == ["py_add"]
    dry = _import(operator_client, data, "?replace=true&dry_run=true")
    assert dry.status_code == 200, dry.content
    assert dry.json()["updated"] == [
        {"tool_name": "py_add", "fields": ["title", "timeout_seconds"]}
    ]
    assert Skill.objects.get(tool_name="py_add").title == "Edited"

    done = _import(operator_client, data, "?replace=true")
    assert done.status_code == 200 and done.json()["dry_run"] is False
    restored = Skill.objects.get(tool_name="py_add")
    assert (restored.title, restored.timeout_seconds) == ("py add", 20)
    assert Skill.objects.filter(tool_name="local_only").exists()  # kept: imports never delete


def _rewrite(data: bytes, change: Callable[[dict[str, bytes]], None], *, resum: bool) -> bytes:
    """The snapshot with its entries changed; ``resum`` recomputes the manifest's checksum."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    change(entries)
    if resum:
        digest = hashlib.sha256(entries["manifest.json"]).hexdigest()
        entries["manifest.json.sha256"] = f"{digest}  manifest.json\n".encode()
    return _zip(entries)


def _manifest_edit(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, bytes]], None]:
    def change(entries: dict[str, bytes]) -> None:
        manifest = json.loads(entries["manifest.json"])
        edit(manifest)
        entries["manifest.json"] = json.dumps(manifest).encode()

    return change


def _flip_archive_byte(entries: dict[str, bytes]) -> None:
    raw = bytearray(entries["skills/b_files/archive.zip"])
    raw[len(raw) // 2] ^= 0x01
    entries["skills/b_files/archive.zip"] = bytes(raw)


TAMPERED = {
    "changed archive byte": (_flip_archive_byte, True, "/skills/1/archive", "SHA-256"),
    "missing file": (
        lambda e: e.pop("skills/b_files/archive.zip"), True, "/skills/b_files/archive.zip", "no"
    ),
    "extra entry": (
        lambda e: e.update({"../evil": b"x"}), True, "/../evil", "unsafe"
    ),
    "manifest without its checksum": (
        _manifest_edit(lambda m: m.update(created_at="x")), False, "/manifest.json.sha256", "match"
    ),
    "unknown format version": (
        _manifest_edit(lambda m: m.update(format_version=2)), True, "/format_version", "version 2"
    ),
    "invalid skill": (
        _manifest_edit(lambda m: m["skills"][1].update(input_schema={"type": "string"})),
        True, "/skills/1/input_schema", "b_files",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_snapshot_is_refused_and_nothing_is_written(
    operator_client: APIClient, make_skill: Callable[..., Skill], case: str
) -> None:
    make_skill("a_plain")
    make_skill("b_files", archive=_zip({"main.txt": b"hello" * 100}))
    change, resum, pointer, words = TAMPERED[case]
    data = _rewrite(_export(operator_client), change, resum=resum)
    Skill.objects.all().delete()

    response = _import(operator_client, data)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["errors"][0]["pointer"] == pointer and words in body["detail"], body
    assert not Skill.objects.exists()


def test_a_symlink_or_oversized_snapshot_is_refused_before_reading(
    operator_client: APIClient, make_skill: Callable[..., Skill], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_skill("a_plain")
    data = _export(operator_client)
    link = zipfile.ZipInfo("skills/link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    refused = _import(operator_client, _with_entry(data, link, b"/etc/passwd"))
    assert refused.status_code == 400 and "symlink" in refused.json()["detail"]
    corrupt = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = zf.getinfo("manifest.json")  # its local header is 30 bytes + the name
    corrupt[manifest.header_offset + 30 + len("manifest.json") + 10] ^= 0xFF
    for broken in (bytes(corrupt), data[: len(data) // 2]):
        response = _import(operator_client, broken)
        assert response.status_code == 400 and response["Content-Type"] == PROBLEM

    monkeypatch.setattr(snapshot_format, "SNAPSHOT_MAX_UNPACKED", 100)
    bomb = _import(operator_client, data)
    assert bomb.status_code == 400 and "unpacks to more than 100" in bomb.json()["detail"]


def _with_entry(data: bytes, info: zipfile.ZipInfo, content: bytes) -> bytes:
    out = io.BytesIO(data)
    with zipfile.ZipFile(out, "a") as zf:
        zf.writestr(info, content)
    return out.getvalue()


def test_the_command_names_what_is_wrong(make_skill: Callable[..., Skill], tmp_path: Path) -> None:
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CommandError, match="not a readable zip"):
        call_command("skills_snapshot", "import", str(bad))
    with pytest.raises(CommandError, match="file: cannot read"):
        call_command("skills_snapshot", "import", str(tmp_path / "missing.zip"))


def test_only_operators_export_and_import(
    viewer_client: APIClient, operator_client: APIClient, make_skill: Callable[..., Skill]
) -> None:
    make_skill("a_plain")
    assert viewer_client.get(SNAPSHOT).status_code == 403
    data = _export(operator_client)
    assert _import(viewer_client, data).status_code == 403
    upload = io.BytesIO(data)
    upload.name = "snap.zip"
    multipart = operator_client.post(
        f"{SNAPSHOT}?dry_run=true", {"file": upload}, format="multipart"
    )
    assert multipart.status_code == 200 and multipart.json()["unchanged"] == ["a_plain"]
    wrong = operator_client.post(SNAPSHOT, {"skills": []}, format="json")
    assert wrong.status_code == 415 and wrong["Content-Type"] == PROBLEM
    flag = _import(operator_client, data, "?replace=maybe")
    assert flag.status_code == 400 and flag.json()["errors"][0]["pointer"] == "/replace"
    reserved = operator_client.post(
        "/api/v1/skills",
        {"tool_name": "snapshot", "title": "x", "code_template": "print(1)",
         "language": "python", "input_schema": {"type": "object"}},
        format="json",
    )  # fmt: skip
    assert reserved.status_code == 400 and reserved.json()["errors"][0]["pointer"] == "/tool_name"
