"""The compile benchmark runs and reports its rows (timing itself is judged by ``python -m bench``)."""

from __future__ import annotations

from bench.harness_compile import layers, run, toolset
from harness.compile import harness_compile
from harness.planner import plan_tools
from runtime.policy import Decision


def test_the_benchmark_reports_median_p99_spread_and_a_verdict() -> None:
    rows = run(smoke=True)
    assert rows[0]["figure"] == "harness compile + tool plan, 5 layers x 200 tools"
    for row in rows:
        assert set(row) == {"figure", "target", "median_ms", "p99_ms", "spread", "passed"}
        assert 0 < row["median_ms"] <= row["p99_ms"]
        assert isinstance(row["passed"], bool)


def test_the_benchmark_plans_a_realistic_mix_of_decisions() -> None:
    plan = plan_tools(harness_compile(layers()), toolset())
    decisions = {t.decision for t in plan.tools}
    assert decisions == {Decision.ALLOW, Decision.ASK, Decision.DENY}


def test_the_benchmark_layers_are_valid_and_bind_the_new_sections() -> None:
    compiled = harness_compile(layers())
    settings = compiled.settings  # validates the complete result
    assert settings.paths.max_files == 40
    assert compiled.settings_dict()["paths"]["deny"] == ["*.pem", ".env", "secrets/**"]
    assert compiled.settings_dict()["isolation"]["allowedHosts"] == ["pypi.org"]
    assert compiled.provenance["isolation.allowedHosts"] == "employee:alice"
