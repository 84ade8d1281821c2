"""Streaming through the OpenAI-compatible endpoint: what Loopwright adds to the first byte.

* **Time to first byte over the model's own.** A scripted streaming model server (this module's
  ``model-server``: asyncio, keep-alive, chunked SSE, the first ``content`` delta after a fixed
  delay, then a few more) is hit directly and through ``POST /v1/chat/completions`` with
  ``stream=True`` on a real uvicorn web process (``orchestrator.asgi``), alternately, by the same
  client. The time to first byte of the answer is the time from sending the request to the first
  chunk carrying non-empty ``content``; the overhead is p50(through) - p50(direct) (target
  <= 5 ms), the ratio p50(through) / p50(direct).
* **Connections.** The model server counts the connections it accepts; the client reads every
  stream to the end of its body, so its keep-alive connection is reused, and the row says how
  many connections the whole sequential phase took (the web process's reuse shows there).
* **Concurrent streams.** 100 streams started at once through the one web process (and, as the
  reference, at the model server directly): every stream must end with ``[DONE]`` and the whole
  answer; errors, p50 / p95 time to first byte and p50 / p95 total time are reported.

The employee has no tools (the loop makes one model call and answers), so what is measured is
the endpoint's own path: token check, grant, employee and harness, the request-scoped loop, SSE.
The database is a scratch one: SQLite unless ``DATABASE_URL`` names a PostgreSQL server (then
PostgreSQL, with Redis at ``LOOPWRIGHT_BENCH_REDIS`` when reachable).
``python -m bench.gateway_stream [--smoke]`` prints the rows; ``python -m bench gateway_stream``
runs it with the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx2

from bench.common import (
    BENCH_REDIS,
    Proc,
    ScratchDatabase,
    child_main,
    free_port,
    log_dir,
    percentile,
    redis_available,
    row,
    run_child,
    wait_http,
    web_proc,
)

#: p50 of (through the endpoint) - (the model directly), time to first byte of the answer.
TARGET_OVERHEAD_MS = 5.0
CONCURRENT = 100
#: The scripted model: its first content chunk after this long, then ``CHUNKS - 1`` more.
MODEL_TTFB_S, CHUNKS, CHUNK_GAP_S = 0.02, 8, 0.002
WORDS = ("Loopwright ", "streams ", "this ", "answer ", "one ", "word ", "at ", "a time.")
ANSWER = "".join(WORDS[i % len(WORDS)] for i in range(CHUNKS))
EMPLOYEE = "bench-streamer"


# --- the scripted streaming model server (its own process) ---------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


_TAG = re.compile(r"\[tag (\S+)\]")
_USAGE = {"prompt_tokens": 10, "completion_tokens": CHUNKS, "total_tokens": 10 + CHUNKS}


class _StreamingModel:
    """Answers every chat completion with :data:`ANSWER`, streamed when asked to."""

    def __init__(self, ttfb: float, gap: float) -> None:
        self.ttfb, self.gap = ttfb, gap
        #: ``[tag X]`` of a request's last message → when it arrived (``time.monotonic()``,
        #: one clock for every process of the machine).
        self.arrivals: dict[str, float] = {}
        self.connections = 0  # accepted so far (keep-alive reuse shows as fewer)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
        raw = await reader.readexactly(int(headers.get("content-length") or 0))
        body = json.loads(raw or b"{}")
        keep = headers.get("connection", "").lower() != "close"
        connection = b"keep-alive" if keep else b"close"
        if lines[0].startswith("GET /bench/arrivals"):
            state = {"arrivals": self.arrivals, "connections": self.connections}
            self.arrivals = {}
            await self._json(writer, state, connection)
            return keep
        found = _TAG.search(str((body.get("messages") or [{}])[-1].get("content")))
        if found:
            self.arrivals[found.group(1)] = arrived
        if body.get("stream") is not True:
            await asyncio.sleep(max(0.0, self.ttfb - (time.monotonic() - arrived)))
            message = {"role": "assistant", "content": ANSWER}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            completion = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0,
                          "model": "bench-model", "choices": [choice], "usage": _USAGE}  # fmt: skip
            await self._json(writer, completion, connection)
            return keep
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: "
                     b"no-cache\r\nTransfer-Encoding: chunked\r\nConnection: " + connection
                     + b"\r\n\r\n")  # fmt: skip
        await writer.drain()
        await asyncio.sleep(max(0.0, self.ttfb - (time.monotonic() - arrived)))
        for i in range(CHUNKS):
            if i:
                await asyncio.sleep(self.gap)
            delta = {"role": "assistant", "content": WORDS[0]} if i == 0 else {}
            delta["content"] = WORDS[i % len(WORDS)]
            await self._send(writer, _chunk(delta))
        usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
                 "model": "bench-model", "choices": [], "usage": _USAGE}  # fmt: skip
        tail = _chunk({}, "stop") + f"data: {json.dumps(usage)}\n\n".encode() + b"data: [DONE]\n\n"
        # The last chunk and the end of the body in one write, as a server that flushes them
        # together: a client that stops at [DONE] still finds the end in what it received.
        writer.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n0\r\n\r\n")
        await writer.drain()
        return keep

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, payload: Any, connection: bytes) -> None:
        data = json.dumps(payload).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: "
                     + connection + f"\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                     + data)  # fmt: skip
        await writer.drain()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()


async def _serve(port: int, ttfb: float, gap: float) -> None:
    model = _StreamingModel(ttfb, gap)
    listener = await asyncio.start_server(model.handle, "127.0.0.1", port, backlog=1024)
    print(f"streaming model listening on {port}", flush=True)
    async with listener:
        await listener.serve_forever()


# --- the client ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTarget:
    url: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True)
class StreamSample:
    """One streamed request: ms to the first content byte and to the stream's end; error or "".
    ``sent`` and ``first`` are ``time.monotonic()`` (to place the model's arrival between)."""

    ttfb_ms: float
    total_ms: float
    error: str = ""
    sent: float = 0.0
    first: float = 0.0


async def stream_once(
    client: Any, url: str, body: dict[str, Any], headers: dict[str, str]
) -> StreamSample:
    """POST ``body`` (stream=True) and read the SSE answer to its end (``[DONE]`` and the end
    of the body, so the keep-alive connection is reused)."""
    started = time.monotonic()
    first: float | None = None
    text: list[str] = []
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                return StreamSample(0.0, 0.0, f"HTTP {response.status_code}: {detail}")
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True  # read on to the end: the connection is then kept alive
                    continue
                chunk = json.loads(data)
                if chunk.get("error"):
                    return StreamSample(0.0, 0.0, f"error chunk: {chunk['error']}")
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first or time.monotonic()
                        text.append(piece)
    except Exception as exc:  # a failed stream is a counted error, not a crashed benchmark
        return StreamSample(0.0, 0.0, f"{type(exc).__name__}: {exc}")
    ended = time.monotonic()
    if not done or first is None or "".join(text) != ANSWER:
        return StreamSample(0.0, 0.0, f"incomplete stream (done={done}): {''.join(text)[:80]!r}")
    return StreamSample((first - started) * 1000, (ended - started) * 1000, "", started, first)


def tagged(target: StreamTarget, tag: str) -> dict[str, Any]:
    """``target``'s body with ``[tag <tag>]`` in its last message (the model server notes when
    that request arrived)."""
    messages = [dict(m) for m in target.body["messages"]]
    messages[-1]["content"] = f"{messages[-1]['content']} [tag {tag}]"
    return {**target.body, "messages": messages}


async def sequential_pairs(
    direct: StreamTarget, through: StreamTarget, runs: int, warmup: int, arrivals_url: str
) -> dict[str, Any]:
    """Alternate direct and through requests; TTFB of each, and where the model's arrival
    splits it (``before``: request sent → model request arrived, ``after``: → first content)."""
    out: dict[str, list[float]] = {"direct": [], "through": []}
    kept: dict[str, tuple[str, StreamSample]] = {}
    errors: list[str] = []
    async with httpx2.AsyncClient(timeout=60) as a, httpx2.AsyncClient(timeout=60) as b:
        for i in range(warmup + runs):
            pairs = [("direct", a, direct), ("through", b, through)]
            for name, client, target in pairs if i % 2 else reversed(pairs):
                tag = f"{name}-{i}"
                sample = await stream_once(client, target.url, tagged(target, tag), target.headers)
                if sample.error:
                    errors.append(f"{name}: {sample.error}")
                elif i >= warmup:
                    out[name].append(sample.ttfb_ms)
                    kept[tag] = (name, sample)
        state = (await a.get(arrivals_url)).json()
        arrivals = state["arrivals"]
    split: dict[str, list[float]] = {}
    for tag, (name, sample) in kept.items():
        if tag in arrivals:
            split.setdefault(f"{name}_before", []).append((arrivals[tag] - sample.sent) * 1000)
            split.setdefault(f"{name}_after", []).append((sample.first - arrivals[tag]) * 1000)
    return {
        **out,
        **split,
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "model_connections": state["connections"],
    }


async def concurrent_streams(target: StreamTarget, n: int) -> dict[str, Any]:
    """Start ``n`` streams at once; errors, and TTFB / total of those that succeeded (ms)."""
    limits = httpx2.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        samples = await asyncio.gather(
            *(stream_once(client, target.url, target.body, target.headers) for _ in range(n))
        )
        wall = (time.perf_counter() - started) * 1000
    good = [s for s in samples if not s.error]
    errors = [s.error for s in samples if s.error]
    return {
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "ttfb": [s.ttfb_ms for s in good],
        "total": [s.total_ms for s in good],
        "wall_ms": wall,
    }


# --- the measuring child (Django set up) ---------------------------------------------------------


def _world(model_url: str) -> str:
    """The employee on the model server, a user granted it and that user's API token."""
    from gateway.services import grant_create
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import api_token_create, user_ensure
    from orchestrator.agents.services import employee_create, model_endpoint_create

    endpoint = model_endpoint_create(
        name="bench-stream-model", provider="openai", base_url=model_url, model="bench-model",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    employee = employee_create(
        username=EMPLOYEE, endpoint=endpoint, system_prompt="Bench streamer.", tools=[],
        streaming=True,
    )  # fmt: skip
    user = user_ensure(username="bench-client", roles=[Role.OPERATOR])
    grant_create(employee=employee, user=user, actor="bench")
    return str(api_token_create(user=user, name="bench-stream"))


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    logs = log_dir("gateway-stream")
    model_port = free_port()
    model = Proc(
        "streaming-model",
        [sys.executable, "-m", "bench.gateway_stream", "model-server", "--port", str(model_port)],
        {"PYTHONUNBUFFERED": "1"},
        logs,
    ).start()
    model.wait_for_log("streaming model listening", 60)
    model_url = f"http://127.0.0.1:{model_port}/v1"
    token = _world(model_url)
    web_port = free_port()
    env = {k: os.environ[k] for k in ("DATABASE_URL", "LOOPWRIGHT_VAR_DIR") if k in os.environ}
    web = web_proc({**env, "LOG_LEVEL": "WARNING"}, logs, web_port).start()
    wait_http(f"http://127.0.0.1:{web_port}/healthz")
    messages = [{"role": "user", "content": "Say something."}]
    direct = StreamTarget(
        f"{model_url}/chat/completions",
        {"model": "bench-model", "messages": messages, "stream": True},
        {},
    )
    through = StreamTarget(
        f"http://127.0.0.1:{web_port}/v1/chat/completions",
        {"model": EMPLOYEE, "messages": messages, "stream": True},
        {"Authorization": f"Bearer {token}"},
    )
    try:
        cpu_before = web.cpu_seconds()
        arrivals = f"http://127.0.0.1:{model_port}/bench/arrivals"
        sequential = asyncio.run(
            sequential_pairs(direct, through, args.runs, args.warmup, arrivals)
        )
        sequential["web_cpu_ms_per_request"] = (
            (web.cpu_seconds() - cpu_before) * 1000 / (args.runs + args.warmup)
        )
        crowd_direct = asyncio.run(concurrent_streams(direct, args.concurrent))
        cpu_before = web.cpu_seconds()
        crowd = asyncio.run(concurrent_streams(through, args.concurrent))
        crowd["web_cpu_s"] = web.cpu_seconds() - cpu_before
        crowd["web_memory_mb"] = web.memory_mb()
        if crowd["errors"] or sequential["errors"]:
            crowd["web_log_tail"] = web.log(3000)
    finally:
        web.stop()
        model.stop()
    return {"sequential": sequential, "crowd": crowd, "crowd_direct": crowd_direct}


# --- rows ----------------------------------------------------------------------------------------


def _vendor() -> str:
    url = os.environ.get("DATABASE_URL", "")
    return "postgresql" if url.startswith(("postgres://", "postgresql://")) else "sqlite"


def _p(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 2) if values else None


def rows_of(result: dict[str, Any], vendor: str, concurrent: int) -> list[dict[str, Any]]:
    """The benchmark's rows from the child's figures."""
    seq = result["sequential"]
    direct, through = seq["direct"], seq["through"]
    d50 = statistics.median(direct) if direct else None
    t50 = statistics.median(through) if through else None
    overhead = t50 - d50 if t50 is not None and d50 is not None else None
    paired = [t - d for t, d in zip(through, direct, strict=False)]
    crowd, ref = result["crowd"], result["crowd_direct"]
    c50, r50 = _p(crowd["ttfb"], 50), _p(ref["ttfb"], 50)

    def added(part: str) -> float | None:
        ours, model = seq.get(f"through_{part}"), seq.get(f"direct_{part}")
        if not ours or not model:
            return None
        return round(statistics.median(ours) - statistics.median(model), 2)

    return [
        row(
            f"streamed answer: time to first byte through /v1/chat/completions over the "
            f"model's own, p50 overhead ({vendor})",
            f"p50 overhead <= {TARGET_OVERHEAD_MS:g} ms",
            passed=overhead is not None and overhead <= TARGET_OVERHEAD_MS and seq["errors"] == 0,
            median_ms=overhead,
            ratio=round(t50 / d50, 3) if t50 and d50 else None,
            reference=f"model's own TTFB p50 {d50:.2f} ms, through p50 {t50:.2f} ms"
            if d50 is not None and t50 is not None
            else "no samples",
            p95_overhead_ms=_p(paired, 95),
            # Where the overhead is: before the model request arrives (token, grant, employee,
            # harness, loop set-up) and after (the first chunk relayed back as SSE).
            overhead_before_model_ms=added("before"),
            overhead_after_model_ms=added("after"),
            web_cpu_ms_per_request=round(seq["web_cpu_ms_per_request"], 2),
            # Connections the model server accepted over the sequential phase (2 keep-alive
            # clients would make this 2 when the web process reuses its model connections).
            model_connections=seq["model_connections"],
            through_p95_ms=_p(through, 95),
            errors=seq["errors"],
            first_errors=seq["first_errors"] or None,
            runs=len(through),
        ),
        row(
            f"{concurrent} concurrent streams on one web process: errors ({vendor})",
            "0 errors",
            passed=crowd["errors"] == 0,
            median=float(crowd["errors"]),
            unit="errors",
            ttfb_p50_ms=c50,
            ttfb_p95_ms=_p(crowd["ttfb"], 95),
            total_p50_ms=_p(crowd["total"], 50),
            total_p95_ms=_p(crowd["total"], 95),
            wall_ms=round(crowd["wall_ms"], 1),
            web_cpu_s=round(crowd["web_cpu_s"], 2),
            web_memory_mb=crowd["web_memory_mb"],
            first_errors=crowd["first_errors"] or None,
            web_log_tail=crowd.get("web_log_tail"),
        ),
        row(
            f"{concurrent} concurrent streams: time to first byte p50 (p95 beside) ({vendor})",
            "informative",
            passed=None,
            median_ms=c50,
            p95_ms=_p(crowd["ttfb"], 95),
            ratio=round(c50 / r50, 3) if c50 and r50 else None,
            reference=f"{concurrent} concurrent at the model directly: TTFB p50 {r50} ms, "
            f"p95 {_p(ref['ttfb'], 95)} ms, errors {ref['errors']}",
        ),
        row(
            f"{concurrent} concurrent streams: time to the end p50 (p95 beside) ({vendor})",
            "informative",
            passed=None,
            median_ms=_p(crowd["total"], 50),
            p95_ms=_p(crowd["total"], 95),
            reference=f"directly: total p50 {_p(ref['total'], 50)} ms, "
            f"p95 {_p(ref['total'], 95)} ms",
        ),
    ]


def run(smoke: bool = False) -> list[dict[str, Any]]:
    """The benchmark's rows (smoke: 20 pairs and 20 concurrent streams, a few seconds)."""
    vendor = _vendor()
    runs, concurrent = (20, 20) if smoke else (300, CONCURRENT)
    logs = log_dir("gateway-stream")
    with ScratchDatabase("gateway_stream", vendor) as database:
        extra: dict[str, str] = {"REDIS_URL": ""}
        if vendor == "postgresql" and redis_available():
            extra = {"REDIS_URL": BENCH_REDIS, "CELERY_BROKER_URL": BENCH_REDIS}
        args = ["--runs", str(runs), "--warmup", "5", "--concurrent", str(concurrent)]
        result = run_child(
            "bench.gateway_stream", database.env(**extra), args, timeout=900, log_dir=logs
        )
    return rows_of(result, vendor, concurrent)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "model-server":
        parser = argparse.ArgumentParser(prog="python -m bench.gateway_stream model-server")
        parser.add_argument("command")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--ttfb", type=float, default=MODEL_TTFB_S)
        parser.add_argument("--gap", type=float, default=CHUNK_GAP_S)
        args = parser.parse_args(argv)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args.port, args.ttfb, args.gap))
        return
    if argv and argv[0] == "child":
        parser = argparse.ArgumentParser()
        parser.add_argument("child")
        parser.add_argument("--out", required=True)
        parser.add_argument("--runs", type=int, default=100)
        parser.add_argument("--warmup", type=int, default=5)
        parser.add_argument("--concurrent", type=int, default=CONCURRENT)
        child_main(_measure, parser.parse_args(argv))
        return
    for result in run(smoke="--smoke" in argv):
        print(result)


if __name__ == "__main__":
    main(sys.argv[1:])
