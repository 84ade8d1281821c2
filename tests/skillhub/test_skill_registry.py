"""Registry install and the version chain over the REST API, with a real HTTP server on
loopback serving the index and the package zips (the outbound policy allows loopback here).

Install → disabled → enable → update (disabled again) → rollback restores the exact previous
code; a second rollback goes further back; a bad checksum changes nothing."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator import guard
from runtime import outbound
from runtime.outbound import OutboundPolicy
from skillhub.models import Skill, SkillVersion
from tests.support.git_server import GitHttpServer

SKILL_MD = """---
title: Word count
description: Counts words
inputSchema: {"type": "object", "properties": {"text": {"type": "string"}}}
---
Count the words of `text`.
"""


def package(code: str, extra: str) -> bytes:
    """A package zip in one top folder, as a registry would publish it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("word_count/SKILL.md", SKILL_MD)
        zf.writestr("word_count/main.py", code)
        zf.writestr("word_count/data/stopwords.txt", extra)
    return buffer.getvalue()


class Registry:
    def __init__(self, root: Path, server: GitHttpServer) -> None:
        self.root, self.server = root, server
        self.url = f"http://127.0.0.1:{server.port}/index.json"

    def publish(self, version: str, code: str, *, sha256: str | None = None) -> None:
        data = package(code, f"stopwords {version}\n")
        (self.root / f"word_count-{version}.zip").write_bytes(data)
        entry = {"name": "word_count", "version": version, "url": f"word_count-{version}.zip",
                 "sha256": sha256 or hashlib.sha256(data).hexdigest()}  # fmt: skip
        (self.root / "index.json").write_text(json.dumps({"skills": [entry]}))


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    root = tmp_path / "registry"
    root.mkdir()
    with GitHttpServer(root) as server:
        yield Registry(root, server)


def post(client: APIClient, path: str, body: dict[str, Any], code: int = 200) -> Any:
    response = client.post(f"/api/v1/skills/{path}", body, format="json")
    assert response.status_code == code, response.content
    return response.json()


def install(client: APIClient, registry: Registry, code: int = 200) -> Any:
    return post(
        client, "registry/install", {"index_url": registry.url, "names": ["word_count"]}, code
    )


V1 = "print(len({{text}}.split()))\n"
V2 = "print(len([w for w in {{text}}.split() if w]))\n"


def test_install_enable_update_and_roll_back_through_the_chain(
    operator_client: APIClient, viewer_client: APIClient, registry: Registry
) -> None:
    registry.publish("1.0.0", V1)
    listed = post(operator_client, "registry/list", {"index_url": registry.url})
    assert [(s["name"], s["status"]) for s in listed["skills"]] == [("word_count", "new")]
    assert install(operator_client, registry)["installed"] == ["word_count"]
    skill = Skill.objects.get(tool_name="word_count")
    assert (skill.enabled, skill.code_template, skill.source) == (False, V1, "registry")
    assert skill.source_path == "word_count@1.0.0" and skill.archive

    enabled = operator_client.patch("/api/v1/skills/word_count", {"enabled": True}, format="json")
    assert enabled.status_code == 200, enabled.content
    registry.publish("2.0.0", V2)
    listed = post(operator_client, "registry/list", {"index_url": registry.url})
    assert listed["skills"][0]["status"] == "update"
    assert listed["skills"][0]["installed"]["version"] == "1.0.0"
    assert install(operator_client, registry)["updated"] == ["word_count"]
    skill.refresh_from_db()
    assert (skill.enabled, skill.code_template, skill.source_path) == (
        False, V2, "word_count@2.0.0",
    )  # fmt: skip

    before_update = SkillVersion.objects.get(skill=skill, number=2)
    rolled = post(operator_client, "word_count/rollback", {"reason": "v2 miscounts"})
    assert rolled["code_template"] == V1 and rolled["enabled"] is True
    skill.refresh_from_db()
    assert bytes(skill.archive) == bytes(before_update.archive)
    assert skill.source_path == "word_count@1.0.0"

    rolled = post(operator_client, "word_count/rollback", {"reason": "back to the install"})
    assert rolled["code_template"] == V1 and rolled["enabled"] is False

    chain = viewer_client.get("/api/v1/skills/word_count/versions").json()
    assert [(v["number"], v["kind"], v["restored_from"]) for v in chain] == [
        (5, "rollback", 1), (4, "rollback", 2), (3, "registry", None), (2, "update", None),
        (1, "registry", None),
    ]  # fmt: skip
    assert chain[0]["actor"] == "operator" and chain[0]["reason"] == "back to the install"
    forward = post(operator_client, "word_count/rollback", {"reason": "redo", "version": 3})
    assert forward["code_template"] == V2


def test_a_bad_checksum_changes_nothing(operator_client: APIClient, registry: Registry) -> None:
    registry.publish("1.0.0", V1)
    install(operator_client, registry)
    registry.publish("2.0.0", V2, sha256="0" * 64)
    problem = install(operator_client, registry, code=400)
    assert "sha256 mismatch" in problem["detail"], problem
    skill = Skill.objects.get(tool_name="word_count")
    assert skill.code_template == V1 and skill.versions.count() == 1


def test_rollback_needs_a_reason_and_an_operator(
    operator_client: APIClient, viewer_client: APIClient, registry: Registry
) -> None:
    registry.publish("1.0.0", V1)
    install(operator_client, registry)
    assert post(operator_client, "word_count/rollback", {"reason": ""}, 400)
    refused = viewer_client.post("/api/v1/skills/word_count/rollback", {"reason": "x"})
    assert refused.status_code == 403
    problem = post(operator_client, "word_count/rollback", {"reason": "undo"}, 400)
    assert "no earlier version" in json.dumps(problem)
    assert post(operator_client, "word_count/rollback", {"reason": "x", "version": 9}, 404)


def test_the_outbound_guard_refuses_a_private_registry(
    operator_client: APIClient, registry: Registry
) -> None:
    registry.publish("1.0.0", V1)
    outbound.configure(OutboundPolicy(private="deny"))
    try:
        problem = install(operator_client, registry, code=400)
    finally:
        guard.apply()
    assert problem["type"].endswith("registry-error") and "outbound guard" in problem["detail"]
    assert registry.server.requests == [] and not Skill.objects.exists()
