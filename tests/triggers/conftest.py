"""Fixtures for trigger tests: cron and event patterns, harness profiles after a flush."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.models import HarnessProfile
from harness.services import profile_create
from loops.models import LoopPattern
from tests.support.factories import make_pattern

#: A Monday well away from any DST change, so tests read as plain arithmetic.
T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


def cron_pattern(expression: str = "* * * * *", **fields: Any) -> LoopPattern:
    return make_pattern(trigger_type="cron", cron_expression=expression, **fields)


def event_pattern(event_key: str, **fields: Any) -> LoopPattern:
    return make_pattern(trigger_type="event", event_key=event_key, **fields)


@pytest.fixture
def seeded_profiles(transactional_db: None) -> None:
    """The seeded harness profiles, which a transactional test's flush removes for the next."""
    seeds = importlib.import_module("harness.migrations.0002_seed_profiles").SEEDS
    for tag, seed in seeds.items():
        if not HarnessProfile.objects.filter(tag=tag).exists():
            profile_create(tag=tag, settings=seed["settings"], description=seed["description"])


@pytest.fixture
def make_cron() -> Callable[..., LoopPattern]:
    return cron_pattern
