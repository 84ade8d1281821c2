"""The Django admin keeps the API's rules: services write, published rows stay read-only, an
instruction in use cannot be deleted."""

from __future__ import annotations

import pytest
from django.test import Client

from instructions.models import Instruction, InstructionVersion
from tests.support.factories import make_pattern

pytestmark = pytest.mark.django_db

INSTRUCTIONS = "/admin/instructions/instruction"
VERSIONS = "/admin/instructions/instructionversion"


def test_the_admin_creates_through_the_service_and_guards_published_and_used_rows(
    admin_client: Client, tone: Instruction
) -> None:
    response = admin_client.post(f"{INSTRUCTIONS}/add/", {"name": "style", "text": "Use lists."})
    assert response.status_code == 302, response.content
    draft = InstructionVersion.objects.get(instruction__name="style")
    assert (draft.version, draft.status, draft.created_by) == (1, "draft", "admin")
    assert admin_client.get(f"{INSTRUCTIONS}/").status_code == 200
    assert admin_client.get(f"{INSTRUCTIONS}/{tone.pk}/change/").status_code == 200
    published = tone.versions.get(version=1)
    page = admin_client.get(f"{VERSIONS}/{published.pk}/change/")
    assert page.status_code == 200 and b'name="text"' not in page.content
    make_pattern(key="greet", goal_template="${instructions.tone}")
    assert admin_client.get(f"{INSTRUCTIONS}/{tone.pk}/delete/").status_code == 403
    assert (
        admin_client.post(f"{INSTRUCTIONS}/{tone.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert Instruction.objects.filter(name="tone").exists()
