"""What people are told to open follows ``LOOPWRIGHT_PUBLIC_URL`` (seed_demo's instructions,
``manage.py up``'s banner, the settings the links use); the favicon answers; the engine's tables
are view-only in the Django admin while configuration stays editable."""

from __future__ import annotations

import importlib.util
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from orchestrator.management.commands.up import _open_at

ROOT = Path(__file__).resolve().parent.parent


def _public_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> str:
    """``PUBLIC_URL`` of a fresh copy of the settings module read under ``env``."""
    monkeypatch.delenv("LOOPWRIGHT_PUBLIC_URL", raising=False)
    monkeypatch.delenv("LOOPWRIGHT_PORT", raising=False)
    monkeypatch.setenv("LOOPWRIGHT_VAR_DIR", str(tmp_path / "var"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location(
        "settings_probe", ROOT / "orchestrator/settings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.PUBLIC_URL)


def test_the_public_url_comes_from_the_environment_or_the_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    public = _public_url(monkeypatch, tmp_path, LOOPWRIGHT_PUBLIC_URL="https://lw.example.test/")
    assert public == "https://lw.example.test"
    assert _public_url(monkeypatch, tmp_path, LOOPWRIGHT_PORT="8123") == "http://127.0.0.1:8123"


@pytest.mark.django_db
def test_seed_demo_prints_the_public_url(settings: Any) -> None:
    settings.PUBLIC_URL = "https://lw.example.test:9443"
    out = StringIO()
    call_command("seed_demo", "--no-run", stdout=out)
    text = out.getvalue()
    assert "Log in at https://lw.example.test:9443/ as 'admin'" in text
    assert "https://lw.example.test:9443/api/docs/" in text
    assert ":8000" not in text


def test_up_names_the_public_url_when_set(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.delenv("LOOPWRIGHT_PUBLIC_URL", raising=False)
    assert _open_at("0.0.0.0", 9000) == "http://127.0.0.1:9000/"  # noqa: S104
    monkeypatch.setenv("LOOPWRIGHT_PUBLIC_URL", "https://lw.example.test")
    settings.PUBLIC_URL = "https://lw.example.test"
    assert _open_at("0.0.0.0", 9000) == "https://lw.example.test/"  # noqa: S104


@pytest.mark.django_db
def test_the_favicon_answers() -> None:
    client = Client()
    icon = client.get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"].endswith("frontend/favicon.svg")
    svg = client.get(icon["Location"])
    assert svg.status_code == 200 and b"<svg" in b"".join(svg.streaming_content)  # type: ignore[attr-defined]
    page = client.get("/login")
    assert 'rel="icon" href="/static/frontend/favicon.svg"' in page.content.decode()


ENGINE_TABLES = (
    "loops/looprun", "loops/loopstep", "loops/pathlock", "skillhub/skillexecution",
    "gateway/chatcompletionrecord", "knowledge/knowledgedocument", "knowledge/retrieval",
)  # fmt: skip


@pytest.mark.django_db
def test_the_engines_tables_are_view_only_in_the_admin(admin_client: Client) -> None:
    from django.contrib import admin

    for label in ENGINE_TABLES:
        app, model = label.split("/")
        assert admin_client.get(f"/admin/{app}/{model}/").status_code == 200, label
        assert admin_client.get(f"/admin/{app}/{model}/add/").status_code == 403, label
        model_admin = next(
            a for m, a in admin.site._registry.items() if m._meta.label_lower == f"{app}.{model}"
        )
        request = admin_client.get("/admin/").wsgi_request
        assert not model_admin.has_change_permission(request), label
        assert not model_admin.has_delete_permission(request), label
        assert model_admin.has_view_permission(request), label
    # configuration stays editable
    assert admin_client.get("/admin/loops/looppattern/add/").status_code == 200
    assert admin_client.get("/admin/agents/employee/add/").status_code == 200
    # a token is never added by hand (it would have no secret); the API or the UI makes them
    assert admin_client.get("/admin/accounts/apitoken/add/").status_code == 403
