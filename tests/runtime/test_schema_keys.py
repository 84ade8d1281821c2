"""An unknown key's error names the keys allowed where it stands (``runtime.schema_keys``)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.schema_keys import allowed_keys, unknown_key_detail


class Limit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: int | None = None
    cost: float | None = None


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_run: Limit | None = Field(default=None, alias="perRun")
    limits: list[Limit] = []
    free: dict[str, Any] = {}


def detail_of(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        Policy.model_validate(data)
    return unknown_key_detail(Policy, caught.value.errors()[0])


def test_the_allowed_keys_are_named_at_every_depth() -> None:
    assert detail_of({"perRn": {}}) == "Unknown key 'perRn': allowed keys are free, limits, perRun."
    assert detail_of({"perRun": {"tokenz": 1}}) == (
        "Unknown key 'tokenz': allowed keys are cost, tokens."
    )
    assert detail_of({"limits": [{}, {"costs": 1}]}).endswith("allowed keys are cost, tokens.")
    assert allowed_keys(Policy, ["free"]) is None  # free-form: no keys to offer
    assert detail_of({"perRun": {"tokens": "x"}}).startswith("Input should be a valid integer")
