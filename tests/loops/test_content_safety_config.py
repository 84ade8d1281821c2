"""The pattern's ``policy.contentSafety`` at save: an invalid configuration is a 400 naming each
problem with a JSON pointer under ``/policy/contentSafety``; a valid one is kept in its
normalized form (defaults filled in), which is what a run's policy snapshot carries."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from loops.policy import parse_policy
from orchestrator.errors import InvalidInput

pytestmark = pytest.mark.django_db
PATTERN = {
    "key": "cs-config",
    "goal_template": "Check {{ inputs.get('x', '') }}",
    "leader_username": "lead",
    "maker_usernames": ["maker"],
    "verifier_username": "checker",
}


def test_an_invalid_content_safety_configuration_is_a_400_with_pointers(
    api_client_for: Callable[[str], APIClient],
) -> None:
    rules = {
        "output": [{"name": "bad", "kind": "regex", "pattern": "("}],
        "input": [{"name": "x", "kind": "telepathy"}],
        "inputs": [],
    }
    body = {**PATTERN, "policy": {"contentSafety": rules, "maxAttempts": 0}}
    response = api_client_for("operator").post("/api/v1/patterns", body, format="json")
    assert response.status_code == 400, response.content
    pointers = {e["pointer"] for e in response.json()["errors"]}
    assert pointers == {
        "/policy/maxAttempts",
        "/policy/contentSafety/output/0/pattern",
        "/policy/contentSafety/input/0/kind",
        "/policy/contentSafety/inputs",
    }


def test_a_valid_content_safety_configuration_is_normalized() -> None:
    rules = {"output": [{"name": "no-falcon", "kind": "blocklist", "words": ["falcon"]}]}
    snapshot = parse_policy({"contentSafety": rules}).model_dump(mode="json")
    stored = snapshot["contentSafety"]
    assert stored["output"][0]["failMode"] == "closed" and stored["input"] == []
    assert parse_policy(snapshot).contentSafety == stored  # a snapshot parses again unchanged
    assert parse_policy({}).contentSafety is None
    with pytest.raises(InvalidInput):
        parse_policy({"contentSafety": "on"})
