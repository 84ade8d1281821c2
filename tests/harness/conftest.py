"""Fixtures for harness tests: a custom profile beside the seeded ones."""

from __future__ import annotations

from typing import Any

import pytest

from harness.models import HarnessProfile
from harness.services import profile_create

TEAM_SETTINGS: dict[str, Any] = {
    "tools": {"allow": ["read", "write"], "trustedPreHandlerTools": []},
    "limits": {"maxTokens": 1000},
}


@pytest.fixture
def team(db: None) -> HarnessProfile:
    """A profile tagged ``team`` with version 1 published."""
    return profile_create(tag="team", settings=TEAM_SETTINGS, description="the team's profile")
