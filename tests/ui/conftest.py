"""Fixtures for the UI: personas that log in, Django test clients, and a real Chromium.

Browser tests drive Debian's ``chromium`` through Playwright's sync API against pytest-django's
``live_server`` (WSGI, threads). Playwright's sync API keeps an asyncio loop running in the test
thread, so Django would refuse ORM calls from that thread; ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set
for the browser tests only, and only while the browser is up. Never ``playwright install``: the
browser is the distribution's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from orchestrator.accounts.services import user_ensure
from orchestrator.sse import OPEN_STREAMS
from tests.conftest import PERSONAS
from tests.support.invokers import create_side_effect_tables
from tests.support.workers import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
PASSWORD = "correct horse battery staple"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(autouse=True)
def _fast_ui_settings(settings: Any) -> None:
    """Quick live streams and a cheap password hash (the live server shares these settings)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.LOOPWRIGHT_UI = {
        "SSE_POLL_SECONDS": 0.2,
        "SSE_HEARTBEAT_SECONDS": 0.2,
        "SSE_MAX_SECONDS": 30.0,
        "SSE_RETRY_MS": 300,
    }


def make_user(persona: str) -> User:
    """A user named after the persona, holding its roles, with :data:`PASSWORD`."""
    user = user_ensure(username=persona, roles=PERSONAS[persona])
    user.set_password(PASSWORD)
    user.save(update_fields=["password"])
    return user


@pytest.fixture
def client_as(db: None) -> Callable[[str], Client]:
    """``client_as("viewer")``: a Django test client logged in as that persona."""

    def make(persona: str) -> Client:
        client = Client()
        if persona != "anonymous":
            client.force_login(make_user(persona))
        return client

    return make


# --- Real browser -----------------------------------------------------------------------------


class Browser:
    """Opens pages in fresh Chromium profiles against the live server."""

    def __init__(self, playwright: Any, base_url: str, profiles: Path) -> None:
        self.playwright = playwright
        self.base_url = base_url
        self.profiles = profiles
        self.contexts: list[Any] = []

    def page(self, *, timezone_id: str = "UTC") -> Any:
        context = self.playwright.chromium.launch_persistent_context(
            user_data_dir=str(self.profiles / f"profile-{len(self.contexts)}"),
            executable_path=shutil.which("chromium"),
            headless=True,
            args=CHROMIUM_ARGS,
            timezone_id=timezone_id,
            locale="en-US",
            viewport={"width": 1366, "height": 900},
            base_url=self.base_url,
        )
        self.contexts.append(context)
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(15_000)
        return page

    def logged_in(self, persona: str, *, timezone_id: str = "UTC") -> Any:
        """A page logged in through the login form as ``persona`` (created if needed)."""
        make_user(persona)
        page = self.page(timezone_id=timezone_id)
        login(page, persona)
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


def login(page: Any, username: str) -> None:
    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")


def screenshot(page: Any, name: str) -> Path:
    """A full-page PNG under test-artifacts/screenshots/ (git-ignored), for people to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def browser(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is required for UI tests: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    playwright = sync_playwright().start()
    opened = Browser(playwright, live_server.url, tmp_path)
    try:
        yield opened
    finally:
        opened.close()
        # ORM calls made while Playwright's loop ran used a connection of their own context;
        # close it here, in that context, or it would outlive the test database.
        connections.close_all()
        playwright.stop()
    # The server notices a closed page at its next write (a heartbeat at the latest); wait for
    # its streams to end, so none outlives the test's database (a stream's read in flight on a
    # machine busy with the rest of the suite can take a while).
    wait_for(
        lambda: OPEN_STREAMS.count == 0,
        timeout=30,
        message=f"{OPEN_STREAMS.count} live stream(s) still open after the browser closed",
    )


@pytest.fixture
def worker_factory(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``celery worker`` processes (test-only SideEffectInvoker); killed afterwards."""
    started: list[WorkerProcess] = []
    create_side_effect_tables()

    def start(name: str = "ui", **env: str) -> WorkerProcess:
        worker = WorkerProcess(name, tmp_path, env).start()
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.kill()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ui: drives the UI in a real Chromium (Playwright)")
