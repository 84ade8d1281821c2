"""A skill's human review settings on its page: operators save them (the same service as the
API's ``PUT .../review``, which now also refuses a review schema that is not a JSON Schema),
an invalid schema is named at its field and changes nothing, viewers read them without a form."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from django.test import Client
from rest_framework.test import APIClient

from skillhub.models import Skill, SkillLoopConfig
from skillhub.services.skills import skill_create

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture
def skill() -> Skill:
    return skill_create(
        actor="test", tool_name="py_review", title="Reviewed", code_template="print(1)",
        language="python", input_schema={"type": "object", "properties": {}}, timeout_seconds=5,
    )  # fmt: skip


def test_operators_save_review_settings_and_a_bad_schema_is_named(
    client_as: ClientAs, skill: Skill
) -> None:
    operator = client_as("operator")
    bad = operator.post(
        "/skills/py_review/review",
        {"requires_review": "on", "review_prompt": "Check it", "review_schema": '{"type": 5}'},
    )
    assert bad.status_code == 400
    assert "Not a JSON Schema" in bad.content.decode()
    assert not SkillLoopConfig.objects.filter(skill=skill).exists()
    schema = {"type": "object", "properties": {"safe": {"type": "boolean"}}}
    saved = operator.post(
        "/skills/py_review/review",
        {"requires_review": "on", "review_prompt": "Check it", "review_schema": json.dumps(schema)},
    )
    assert saved.status_code == 302
    config = SkillLoopConfig.objects.get(skill=skill)
    assert (config.requires_review, config.review_prompt, config.review_schema) == (
        True, "Check it", schema,
    )  # fmt: skip
    page = client_as("viewer").get("/skills/py_review").content.decode()
    assert "Every agent call of this skill waits for a person" in page
    assert "Save review settings" not in page


def test_the_api_refuses_a_review_schema_that_is_not_a_json_schema(
    api_client_for: Callable[[str], APIClient], skill: Skill
) -> None:
    client = api_client_for("operator")
    body = {"requires_review": True, "review_prompt": "", "review_schema": {"type": 5}}
    refused = client.put("/api/v1/skills/py_review/review", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["pointer"] == "/review_schema"
