"""Harness compilation and tool planning: 5 layers x 200 tools, well under a millisecond per call.

What is timed is what happens per role invocation and per trigger: merging already validated
layers (``harness_compile``) and planning a 200-tool toolset (``plan_tools``), plus planning from
a run's stored snapshot dict, which parses it first. Layer validation (pydantic) happens once
when a profile is saved or a run is triggered and is not part of the figure.

Rows: ``median_ms`` and ``p99_ms`` per call; ``spread`` is half the p10-p90 range relative to the
median. ``python -m bench.harness_compile [--smoke]`` prints the table.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from harness.compile import Layer, harness_compile, layer_from_settings, layer_parse, profile_layer
from harness.planner import plan_tools
from harness.schema import DEFAULT_PLATFORM, HarnessSettings, layer_validate
from runtime.types import Effect, ToolSpec

TOOLS = 200
TARGET_MS = 1.0


def toolset() -> list[ToolSpec]:
    effects = [Effect.READ, Effect.READ, Effect.WRITE, Effect.EXTERNAL]
    return [
        ToolSpec(
            name=f"tool_{i:03d}",
            description="",
            parameters={"type": "object", "properties": {}},
            effect=effects[i % len(effects)],
            enforceable=i % 50 != 49,
        )
        for i in range(TOOLS)
    ]


def layers() -> list[Layer]:
    """platform → profile → pattern → employee → run, each stating a realistic share of tools."""
    names = [f"tool_{i:03d}" for i in range(TOOLS)]
    profile = {
        "tools": {
            "allow": names[:190],
            "deny": names[195:],
            "effects": {n: "write" for n in names[:60:3]},
            "trustedPreHandlerTools": names[:100:2],
        },
        "limits": {"maxTokens": 500_000, "maxCost": 10},
        "paths": {"deny": ["secrets/**", "*.pem"], "maxFiles": 100},
        "isolation": {"networkAccess": "restricted", "allowedHosts": ["pypi.org", "*.github.com"]},
    }
    return [
        layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM)),
        profile_layer("profile:bench@1", layer_validate(profile)),
        layer_parse(
            "pattern",
            {"tools": {"allow": names[10:], "ask": names[100:120]}, "paths": {"maxFiles": 40}},
        ),
        layer_parse(
            "employee:alice",
            {"tools": {"deny": names[:5]}, "isolation": {"allowedHosts": ["pypi.org"]}},
        ),
        layer_parse("run", {"limits": {"maxCost": 2.5}, "paths": {"deny": [".env"]}}),
    ]


def _time_calls(call: Callable[[], Any], calls: int) -> list[float]:
    for _ in range(min(calls, 50)):  # warm caches and the interpreter's specialisations
        call()
    timings = []
    gc.disable()
    try:
        for _ in range(calls):
            started = time.perf_counter_ns()
            call()
            timings.append((time.perf_counter_ns() - started) / 1e6)
    finally:
        gc.enable()
    return timings


def _row(figure: str, timings: list[float]) -> dict[str, Any]:
    median = statistics.median(timings)
    deciles = statistics.quantiles(timings, n=10)
    percentiles = statistics.quantiles(timings, n=100)
    return {
        "figure": figure,
        "target": f"< {TARGET_MS:g} ms",
        "median_ms": round(median, 4),
        "p99_ms": round(percentiles[98], 4),
        "spread": f"±{(deciles[8] - deciles[0]) / 2 / median:.0%}",
        "passed": median < TARGET_MS,
    }


def run(smoke: bool = False) -> list[dict[str, Any]]:
    calls = 200 if smoke else 5000
    stack, tools = layers(), toolset()
    snapshot_settings = harness_compile(stack).settings_dict()
    return [
        _row(
            f"harness compile + tool plan, {len(stack)} layers x {TOOLS} tools",
            _time_calls(lambda: plan_tools(harness_compile(stack), tools), calls),
        ),
        _row(
            f"harness compile only, {len(stack)} layers",
            _time_calls(lambda: harness_compile(stack), calls),
        ),
        _row(
            f"tool plan from a stored snapshot (parse + plan), {TOOLS} tools",
            _time_calls(lambda: plan_tools(snapshot_settings, tools), calls),
        ),
    ]


def _print(rows: list[dict[str, Any]]) -> None:
    columns = ["figure", "target", "median_ms", "p99_ms", "spread", "passed"]
    table = [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    for line in [columns, *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    _print(run(smoke="--smoke" in sys.argv))
