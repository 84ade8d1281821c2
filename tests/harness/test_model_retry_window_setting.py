"""``limits.modelRetryWindowMs``: a bounded integer, merged by minimum, with a platform default
and its provenance."""

from __future__ import annotations

import pytest

from harness.compile import harness_compile, layer_from_settings
from harness.schema import (
    DEFAULT_PLATFORM,
    NUMBER_MAXIMA,
    HarnessSettings,
    SettingsInvalid,
    layer_validate,
)


def test_the_platform_bounds_a_model_wait_by_default() -> None:
    assert DEFAULT_PLATFORM["limits"]["modelRetryWindowMs"] == 30 * 60 * 1000
    assert NUMBER_MAXIMA["limits.modelRetryWindowMs"] == 7 * 24 * 3600 * 1000


@pytest.mark.parametrize("value", [-1, 7 * 24 * 3600 * 1000 + 1, "5", 1.5, True, None])
def test_only_an_integer_in_range_is_accepted(value: object) -> None:
    with pytest.raises(SettingsInvalid) as raised:
        layer_validate({"limits": {"modelRetryWindowMs": value}}, ("pattern",))
    assert [p["pointer"] for p in raised.value.problems] == ["/pattern/limits/modelRetryWindowMs"]


def test_the_strictest_layer_decides_and_is_named() -> None:
    platform = layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))
    profile = layer_from_settings(
        "profile:p@1", layer_validate({"limits": {"modelRetryWindowMs": 600_000}})
    )
    run = layer_from_settings("run", layer_validate({"limits": {"modelRetryWindowMs": 900_000}}))
    compiled = harness_compile([platform, profile, run])
    assert compiled.settings_dict()["limits"]["modelRetryWindowMs"] == 600_000
    assert compiled.provenance["limits.modelRetryWindowMs"] == "profile:p@1"
