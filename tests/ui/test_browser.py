"""The operator UI in a real Chromium against the live server (and a real worker for progress)."""

from __future__ import annotations

import importlib
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.apps import apps as django_apps
from playwright.sync_api import expect

from frontend.templatetags.ui import short_id
from harness.services import profile_save_draft
from loops.models import LoopPattern, LoopRun, RunStatus
from loops.services.patterns import pattern_create
from loops.services.runs import run_act, run_trigger
from tests.ui.conftest import PASSWORD, Browser, make_user, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _seeded_profiles(transactional_db: None) -> None:
    """The flush after a transactional test drops the migration-seeded policy profiles; put them
    back with the migration's own (idempotent) function. (``serialized_rollback`` fails when an
    earlier transactional test's flush has re-created content types.)"""
    importlib.import_module("harness.migrations.0002_seed_profiles").seed(django_apps, None)


def a_pattern(key: str = "greet", **fields: Any) -> LoopPattern:
    return pattern_create(
        key=key,
        actor="operator",
        title=fields.pop("title", "Improve a greeting"),
        goal_template=fields.pop("goal_template", "Improve {{ inputs.get('file', 'hello.txt') }}"),
        leader_username="leader",
        maker_usernames=["maker"],
        verifier_username="verifier",
        **fields,
    )


def a_run(pattern: LoopPattern | None = None, **inputs: Any) -> LoopRun:
    return run_trigger(pattern=pattern or a_pattern(), actor="operator", inputs=inputs)


def mark_page(page: Any) -> None:
    """A marker that a reload would wipe: proves later changes arrived without one."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def test_logging_in_shows_the_monitor_and_logging_out_returns_to_the_login_page(
    browser: Browser,
) -> None:
    page = browser.page()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login\?next=/$"))
    screenshot(page, "login")
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("wrong")
    make_user("operator")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("enter a correct username and password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    nav = page.get_by_role("navigation", name="Main")
    for name in ("Monitor", "Patterns", "Policies", "Employees", "API docs"):
        expect(nav.get_by_role("link", name=name)).to_be_visible()
    expect(page.locator(".user-role")).to_have_text("operator")
    expect(page.locator("#runs-empty")).to_contain_text("No runs yet")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/login$"))


def test_the_monitor_shows_new_runs_and_status_changes_without_a_reload(
    browser: Browser,
) -> None:
    pattern = a_pattern()
    page = browser.logged_in("operator")
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    mark_page(page)

    run = a_run(pattern)
    row = page.locator(f"#run-{run.id}")
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("queued")
    expect(row).to_contain_text("greet")
    expect(page.locator("#runs-empty")).to_be_hidden()

    run_act(run_id=run.id, action="pause", actor="operator")
    expect(row.locator(".badge")).to_have_text("paused")
    run_act(run_id=run.id, action="escalate", actor="operator")
    expect(row.locator(".badge")).to_have_text("waiting human")
    expect(page.locator("[data-count=waiting_human]")).to_have_text("1")
    expect(page.locator("#live-announcer")).to_contain_text("is now waiting human")

    second = a_run(pattern)
    expect(page.locator("#runs-body tr").first).to_have_id(f"run-{second.id}")
    assert_not_reloaded(page)
    screenshot(page, "monitor")


def test_a_filtered_monitor_drops_runs_that_stop_matching(browser: Browser) -> None:
    pattern = a_pattern()
    run = a_run(pattern)
    page = browser.logged_in("viewer")
    page.goto("/?status=queued")
    expect(page.locator(f"#run-{run.id}")).to_be_visible()
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    run_act(run_id=run.id, action="cancel", actor="operator")
    expect(page.locator(f"#run-{run.id}")).to_have_count(0)
    expect(page.locator("#runs-empty")).to_contain_text("No runs match these filters")


@pytest.mark.e2e
def test_a_run_page_follows_a_worker_until_the_run_succeeds(
    browser: Browser, worker_factory: Any
) -> None:
    run = a_run(a_pattern(), file="notes.md")
    page = browser.logged_in("operator")
    page.goto(f"/runs/{run.id}")
    expect(page.locator("#run-summary .badge").first).to_have_text("queued")
    expect(page.locator("#timeline-empty")).to_be_visible()
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    events_before = page.locator("#events-body tr").count()
    mark_page(page)

    worker = worker_factory("ui", LW_TEST_STEP_SLEEP="0.4", LW_TEST_STEPS="2")
    expect(page.locator("#inv-leader .step").first).to_be_visible(timeout=30_000)
    expect(page.locator("#run-summary .badge").first).to_have_text(re.compile("running|verifying"))
    expect(page.locator("#run-summary .badge").first).to_have_text("succeeded", timeout=60_000)
    assert worker.alive()

    timeline = page.locator("#timeline")
    expect(timeline.locator("section.invocation h3")).to_have_text(
        [re.compile("Leader"), re.compile("Maker 1"), re.compile("Verifier")]
    )
    expect(timeline.locator(".step")).to_have_count(6)
    expect(timeline.locator(".step .badge").filter(has_text="completed")).to_have_count(6)
    expect(page.locator("[data-live-indicator]")).to_contain_text("Finished: succeeded")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    expect(page.locator("#events-body tr")).to_have_count(run.events.count())
    assert run.events.count() > events_before
    expect(page.locator("#events-body")).to_contain_text("verification.verdict")
    expect(page.locator("#run-verdict")).to_contain_text("pass")
    expect(page.locator("#run-actions form")).to_have_count(0)  # nothing to do on success
    assert_not_reloaded(page)
    page.locator("details.snapshot").first.locator("summary").click()
    screenshot(page, "run-detail")


def test_an_operator_cancels_a_run_with_a_reason(browser: Browser) -> None:
    run = a_run()
    page = browser.logged_in("operator")
    page.goto(f"/runs/{run.id}")
    page.get_by_label("Reason for canceling").fill("wrong inputs")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".flash")).to_contain_text("Run canceled.")
    expect(page.locator("#run-summary .badge").first).to_have_text("canceled")
    expect(page.locator("#run-summary")).to_contain_text("Canceled by operator: wrong inputs")
    expect(page.locator("#events-body")).to_contain_text("run.canceled")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELED
    assert run.events.get(type="run.canceled").data == {"reason": "wrong inputs"}
    expect(page.get_by_role("button", name="Retry as a new run")).to_be_visible()


def test_retrying_a_canceled_run_opens_the_new_run(browser: Browser) -> None:
    run = a_run()
    run_act(run_id=run.id, action="cancel", actor="operator")
    page = browser.logged_in("operator")
    page.goto(f"/runs/{run.id}")
    page.get_by_role("button", name="Retry as a new run").click()
    new_run = LoopRun.objects.get(retry_of=run)
    expect(page).to_have_url(re.compile(rf"/runs/{new_run.id}$"))
    expect(page.locator("#run-summary")).to_contain_text(f"retry of {short_id(run.id)}")


def test_a_viewer_sees_no_actions_and_a_forged_post_is_refused(browser: Browser) -> None:
    run = a_run()
    page = browser.logged_in("viewer")
    page.goto(f"/runs/{run.id}")
    expect(page.locator("#run-summary .badge").first).to_have_text("queued")
    expect(page.locator("#run-actions form")).to_have_count(0)
    expect(page.locator(".user-role")).to_have_text("viewer")
    page.goto("/patterns/greet")
    expect(page.get_by_role("link", name="Trigger now")).to_have_count(0)
    expect(page.get_by_role("link", name="Edit")).to_have_count(0)

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"/runs/{run.id}/cancel",
        form={"reason": "forged"},
        headers={"X-CSRFToken": token, "Referer": browser.base_url + "/"},
    )
    assert forged.status == 403
    assert "text/html" in forged.headers["content-type"]
    assert "needs the operator role" in forged.text()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    page.goto("/patterns/new")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()


def test_pattern_form_errors_appear_at_their_fields(browser: Browser) -> None:
    page = browser.logged_in("operator")
    page.goto("/patterns")
    expect(page.locator(".empty-state")).to_contain_text("No patterns yet")
    page.get_by_role("link", name="New pattern").click()
    page.get_by_role("textbox", name="Key", exact=True).fill("review-docs")
    page.get_by_label("Goal template").fill("Review {{ inputs.get('path') }}")
    page.get_by_label("Leader username").fill("alice")
    page.get_by_label("Maker usernames").fill("bob, carol")
    page.get_by_label("Verifier username").fill("alice")
    page.get_by_role("textbox", name="Policy").fill('{"concurrency": 0}')
    page.get_by_role("button", name="Create pattern").click()

    policy = page.locator("#field-policy .field-errors")
    expect(policy).to_contain_text("concurrency")
    page.get_by_role("textbox", name="Policy").fill('{"concurrency": 2')
    page.get_by_role("button", name="Create pattern").click()
    expect(page.locator("#field-policy .field-errors")).to_contain_text("Not valid JSON")

    page.get_by_role("textbox", name="Policy").fill('{"concurrency": 2}')
    page.get_by_role("button", name="Create pattern").click()
    verifier = page.locator("#field-verifier_username .field-errors")
    expect(verifier).to_contain_text("The verifier must differ from the leader.")
    expect(page.get_by_label("Verifier username")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Maker usernames")).to_have_value("bob, carol")
    screenshot(page, "pattern-form-errors")

    page.get_by_label("Verifier username").fill("dave")
    page.get_by_role("button", name="Create pattern").click()
    expect(page.locator(".flash")).to_contain_text("Pattern review-docs created.")
    pattern = LoopPattern.objects.get(key="review-docs")
    assert pattern.maker_usernames == ["bob", "carol"]
    assert pattern.policy == {"concurrency": 2}
    page.goto("/patterns")
    expect(page.get_by_role("link", name="review-docs")).to_be_visible()
    screenshot(page, "patterns")


def test_triggering_a_pattern_with_inputs_opens_the_new_run(browser: Browser) -> None:
    a_pattern()
    page = browser.logged_in("operator")
    page.goto("/patterns/greet")
    page.get_by_role("link", name="Trigger now").click()
    page.get_by_label("Inputs").fill('["not", "an object"]')
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#field-inputs .field-errors")).to_contain_text("Must be a JSON object")
    page.get_by_label("Inputs").fill('{"file": "notes.md"}')
    page.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    run = LoopRun.objects.get()
    assert str(run.id) in page.url
    assert run.inputs == {"file": "notes.md"}
    expect(page.locator("#goal-heading + p")).to_have_text("Improve notes.md")
    expect(page.locator("#run-summary")).to_contain_text("manual by operator")


def test_timestamps_are_shown_in_the_viewers_time_zone(browser: Browser) -> None:
    run = a_run()
    LoopRun.objects.filter(pk=run.id).update(created_at=datetime(2026, 1, 15, 12, 0, tzinfo=UTC))
    for zone, text in (("Asia/Tokyo", "2026-01-15 21:00:00"), ("America/New_York", "07:00:00")):
        page = browser.logged_in("viewer", timezone_id=zone)
        page.goto(f"/runs/{run.id}")
        created = page.locator(".facts div", has_text="Created").locator("time")
        expect(created).to_contain_text(text)
        expect(created).to_have_attribute("datetime", "2026-01-15T12:00:00Z")
        expect(created).to_have_attribute("title", "2026-01-15 12:00:00 UTC")
        expect(page.locator("[data-timezone]")).to_contain_text(zone)


def test_an_unknown_run_is_an_html_404_page(browser: Browser) -> None:
    page = browser.logged_in("viewer")
    for path in (f"/runs/{uuid.uuid4()}", "/runs/not-a-run-id"):
        response = page.goto(path)
        assert response is not None and response.status == 404
        assert response.headers["content-type"].startswith("text/html")
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        assert "Traceback" not in page.content()
    screenshot(page, "not-found")


def test_an_admin_edits_publishes_and_compares_a_policy(browser: Browser) -> None:
    page = browser.logged_in("admin")
    page.goto("/policies")
    expect(page.get_by_role("link", name="file-heavy")).to_be_visible()
    screenshot(page, "policies")
    page.get_by_role("link", name="safe").click()
    page.get_by_role("link", name="New draft").click()
    current = json.loads(page.get_by_label("Settings").input_value())  # starts from v1
    assert current["limits"]["maxToolCalls"] == 1000
    page.get_by_label("Settings").fill('{"limits": {"maxToolCalls": -1}, "bogus": {}}')
    page.get_by_role("button", name="Save draft").click()
    errors = page.locator("#field-settings .field-errors li")
    expect(errors).to_have_count(2)
    expect(page.locator("#field-settings .field-errors")).to_contain_text("unknown key 'bogus'")
    expect(page.locator("#field-settings .field-errors")).to_contain_text(
        "limits.maxToolCalls: Input should be greater than or equal to 0"
    )
    current["limits"]["maxToolCalls"] = 7
    page.get_by_label("Settings").fill(json.dumps(current, indent=2))
    page.get_by_label("Note").fill("fewer tool calls")
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator(".flash")).to_contain_text("Draft version 2 saved")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Publish v2").click()
    expect(page.locator(".flash")).to_contain_text("Version 2 of safe is now published.")
    screenshot(page, "policy-detail")
    page.get_by_role("button", name="Show differences").click()
    removed, added = page.locator("pre.diff .diff-del"), page.locator("pre.diff .diff-add")
    expect(removed).to_have_count(1)
    expect(removed).to_contain_text('-    "maxToolCalls": 1000,')
    expect(added).to_have_count(1)
    expect(added).to_contain_text('+    "maxToolCalls": 7,')
    screenshot(page, "policy-diff")
    tools = '[{"name":"read","effect":"read"},{"name":"write","effect":"write"}]'
    page.goto(f"/policies/compile?tag=safe@1&tools={tools}")
    expect(page.locator("#compile-result")).to_contain_text("profile safe@1")
    plan = page.locator("#compile-result table").first.locator("tbody tr")
    expect(plan).to_have_count(2)
    expect(plan.nth(0)).to_contain_text("allow")
    expect(plan.nth(1)).to_contain_text("deny")
    screenshot(page, "policy-compile")


def test_a_draft_saved_by_someone_else_can_be_published_from_the_page(browser: Browser) -> None:
    profile_save_draft(tag="default", settings={"paths": {"maxFiles": 10}}, note="smaller")
    page = browser.logged_in("admin")
    page.goto("/policies/default")
    expect(page.locator(".alert-warn")).to_contain_text("Draft v2 is open: smaller")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Publish v2").click()
    expect(page.locator(".flash")).to_contain_text("Version 2 of default is now published.")
