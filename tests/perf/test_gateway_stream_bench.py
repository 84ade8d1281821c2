"""The streaming benchmark's own parts, without the web process: its scripted model server and
the client that measures time to first byte (``bench/gateway_stream.py``; the whole benchmark
runs in smoke mode in tests/perf/test_bench_smoke.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import gateway_stream as bench
from bench.common import Proc, free_port


@pytest.fixture
def model_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.gateway_stream", "model-server", "--port", str(port)]
    server = Proc("streaming-model", argv, {"PYTHONUNBUFFERED": "1"}, tmp_path).start()
    try:
        server.wait_for_log("streaming model listening", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(timeout=5)


def _target(model_url: str) -> bench.StreamTarget:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "stream": True}
    return bench.StreamTarget(f"{model_url}/v1/chat/completions", body, {})


def test_the_client_times_the_first_content_and_keeps_its_connection(model_url: str) -> None:
    """Each stream is read to its end: the answer is whole, the first content comes after the
    model's scripted delay, the arrival splits it, and one keep-alive connection per client."""
    target = _target(model_url)
    result = asyncio.run(
        bench.sequential_pairs(target, target, 4, 1, f"{model_url}/bench/arrivals")
    )
    assert result["errors"] == 0, result["first_errors"]
    assert len(result["direct"]) == len(result["through"]) == 4
    assert all(ttfb >= bench.MODEL_TTFB_S * 1000 for ttfb in result["direct"])
    assert all(after >= bench.MODEL_TTFB_S * 1000 for after in result["direct_after"])
    assert all(before >= 0 for before in result["through_before"])
    assert result["model_connections"] == 2


def test_concurrent_streams_count_a_failure_as_an_error(model_url: str) -> None:
    crowd = asyncio.run(bench.concurrent_streams(_target(model_url), 10))
    assert crowd["errors"] == 0 and len(crowd["ttfb"]) == 10
    nobody = bench.StreamTarget(f"http://127.0.0.1:{free_port()}/v1/chat/completions", {}, {})
    failed = asyncio.run(bench.concurrent_streams(nobody, 3))  # nothing listens there
    assert failed["errors"] == 3 and failed["ttfb"] == []


def test_rows_judge_the_overhead_and_the_errors() -> None:
    sequential = {
        "direct": [20.0, 21.0, 22.0],
        "through": [24.0, 25.0, 26.0],
        "direct_before": [1.0] * 3,
        "through_before": [4.0] * 3,
        "direct_after": [20.0] * 3,
        "through_after": [21.0] * 3,
        "errors": 0,
        "first_errors": [],
        "model_connections": 2,
        "web_cpu_ms_per_request": 3.0,
    }
    crowd = {
        "errors": 1,
        "first_errors": ["HTTP 500"],
        "ttfb": [30.0, 40.0],
        "total": [50.0, 60.0],
        "wall_ms": 70.0,
        "web_cpu_s": 0.1,
        "web_memory_mb": {"rss": 1.0, "peak": 1.0},
    }
    reference = {**crowd, "errors": 0, "ttfb": [10.0, 20.0]}
    result = {"sequential": sequential, "crowd": crowd, "crowd_direct": reference}
    first, errors, ttfb, _total = bench.rows_of(result, "sqlite", 100)
    assert first["median_ms"] == 4.0 and first["passed"]
    assert (first["overhead_before_model_ms"], first["overhead_after_model_ms"]) == (3.0, 1.0)
    assert errors["median"] == 1.0 and not errors["passed"]
    assert ttfb["median_ms"] == 35.0 and ttfb["ratio"] == round(35.0 / 15.0, 3)
