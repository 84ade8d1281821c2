"""The peer: LangGraph with its PostgreSQL checkpointer, running the same loops as our benches.

Optional (``uv sync --extra bench``); when LangGraph is not installed its rows say so and the
other benchmarks omit their ratios. The graph is the standard LangGraph agent loop: an ``agent``
node (the model) and a prebuilt ``ToolNode``, ``tools_condition`` between them, messages in a
``MessagesState``-like channel, a ``PostgresSaver`` checkpointing every super-step on a scratch
``lw_bench_peer_*`` database of the same server.

* **Per-step overhead**: the same instant in-process model as ``bench.step_overhead`` (one call
  of a no-op tool per step, alternating two tools, then the answer), 20- and 100-step runs; a
  step is the time between two consecutive model calls, as for ours.
* **Throughput**: 200 concurrent runs x 10 model steps (9 tool calls, then the answer) in one
  process, or split over as many processes as the compared service has workers, started
  together (``AsyncPostgresSaver`` over a connection pool in each), the model being the same
  loopback HTTP model server as ours with 50 ms latency.
* **Resume**: a run parks at ``interrupt()`` before a gated tool; the human decision is a
  ``Command(resume=...)`` sent from a new connection; timed to the tool's start.

**Durability.** LangGraph's default (``durability="async"``) writes a super-step's checkpoint
while the next step already runs, so a crash can lose the step that just finished. Ours writes
every model step and tool result before the next one starts, which is LangGraph's
``durability="sync"``. The ratios of the other benchmarks compare with the peer in ``sync``
mode, the same guarantee; the peer's rows show both modes.

``python -m bench.peer_langgraph [--smoke]`` prints the peer's own rows.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import operator
import statistics
import sys
import time
import uuid
from typing import Annotated, Any, TypedDict, cast

from bench import common

NOT_INSTALLED = "peer not installed (uv sync --extra bench)"
#: The durability of the peer our figures are compared with (see the module docstring).
SAME_GUARANTEE = "sync"
MODES = ("sync", "async")


def available() -> bool:
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


# --- the graph --------------------------------------------------------------------------------


try:  # module level: LangGraph resolves the state's annotations in this module's namespace
    from langgraph.graph.message import add_messages
except ImportError:  # the peer is optional
    add_messages = operator.add


class State(TypedDict):
    messages: Annotated[list[Any], add_messages]
    steps: Annotated[int, operator.add]


def _state_type() -> Any:
    return State


def _tools(marks: dict[str, float] | None = None) -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def bench_noop(i: int) -> str:
        """Does nothing."""
        return "ok"

    @tool
    def bench_peek(i: int) -> str:
        """Does nothing."""
        return "ok"

    @tool
    def write(path: str, content: str) -> str:
        """Gated write: records when it starts."""
        if marks is not None:
            marks["started"] = time.monotonic()
        return "written"

    return [bench_noop, bench_peek, write]


def _ai_call(made: int) -> Any:
    from langchain_core.messages import AIMessage

    name = common.noop_tool_for(made)
    return AIMessage(content="", tool_calls=[{"name": name, "args": {"i": made}, "id": f"c{made}"}])


def _instant_graph(steps: int, calls: list[float], checkpointer: Any) -> Any:
    """Agent (instant model) + ToolNode, checkpointed on every super-step."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    def agent(state: State) -> dict[str, Any]:
        calls.append(time.perf_counter())
        made = state.get("steps", 0)
        if made < steps:
            return {"messages": [_ai_call(made)], "steps": 1}
        return {"messages": [AIMessage(content=f"Done after {made} tool calls.")]}

    graph = StateGraph(_state_type())
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(_tools()[:2]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def _step_overhead(
    url: str, steps: int, runs: int, repeats: int, durability: str
) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres import PostgresSaver

    p50s, p99s = [], []
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        for repeat in range(repeats + 1):  # the first round warms up
            deltas: list[float] = []
            for _ in range(runs):
                calls: list[float] = []
                graph = _instant_graph(steps, calls, saver)
                config = {
                    "configurable": {"thread_id": uuid.uuid4().hex},
                    "recursion_limit": 10_000,
                }
                graph.invoke(
                    {"messages": [HumanMessage("Bench")], "steps": 0},
                    config,
                    durability=durability,
                )
                deltas += [(b - a) * 1000 for a, b in itertools.pairwise(calls)]
            if repeat:
                p50s.append(statistics.median(deltas))
                p99s.append(common.percentile(deltas, 99))
    return {
        "p50": statistics.median(p50s),
        "p99": statistics.median(p99s),
        "spread": common.spread(p50s),
        "repeat_p50s": [round(v, 3) for v in p50s],
    }


# --- throughput: 200 concurrent runs against the loopback model server ----------------------------


def _http_graph(model_url: str, http: Any, checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage, convert_to_openai_messages
    from langgraph.graph import START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    tools = _tools()[:2]
    wire_tools = [
        {
            "type": "function",
            "function": {"name": t.name, "parameters": t.args_schema.model_json_schema()},
        }
        for t in tools
    ]

    async def agent(state: State) -> dict[str, Any]:
        body = {
            "model": "bench-model",
            "messages": convert_to_openai_messages(state["messages"]),
            "tools": wire_tools,
        }
        response = await http.post(f"{model_url}/chat/completions", json=body)
        message = response.json()["choices"][0]["message"]
        calls = [
            {
                "name": c["function"]["name"],
                "args": json.loads(c["function"]["arguments"]),
                "id": c["id"],
            }
            for c in message.get("tool_calls") or []
        ]
        return {"messages": [AIMessage(content=message.get("content") or "", tool_calls=calls)]}

    graph = StateGraph(_state_type())
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


async def _throughput_async(
    url: str, model_url: str, runs: int, steps: int, durability: str, start_at: float = 0.0
) -> dict[str, Any]:
    """``runs`` concurrent runs in this process; with ``start_at`` (wall clock) they start then,
    so several processes start together. The saver's tables exist already."""
    import httpx2
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with (
        AsyncConnectionPool(url, min_size=4, max_size=10, kwargs=kwargs, open=False) as pool,
        httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=runs)) as http,
    ):
        saver = AsyncPostgresSaver(cast(Any, pool))
        graph = _http_graph(model_url, http, saver)
        durations: list[float] = []
        tag = uuid.uuid4().hex[:6]

        async def one(n: int) -> None:
            started = time.perf_counter()
            spec = common.bench_goal_inputs(tag=f"peer{tag}{n}", steps=steps - 1)["spec"]
            config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 1000}
            state = {"messages": [HumanMessage(f"Bench {spec}")], "steps": 0}
            await graph.ainvoke(state, config, durability=durability)
            durations.append(time.perf_counter() - started)

        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.time()
        await asyncio.gather(*(one(n) for n in range(runs)))
        ended = time.time()
    return {"began": began, "ended": ended, "max_run_s": max(durations)}


def _throughput_part(
    url: str, model_url: str, runs: int, steps: int, durability: str, start_at: float
) -> dict[str, Any]:
    """One process's share of the runs (a ``spawn``-ed pool process)."""
    return asyncio.run(_throughput_async(url, model_url, runs, steps, durability, start_at))


async def _setup_saver(url: str) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()


def _throughput_round(
    url: str, model_url: str, runs: int, steps: int, durability: str, processes: int
) -> dict[str, Any]:
    """``runs`` runs split over ``processes`` processes that start together."""
    if processes == 1:
        part = asyncio.run(_throughput_async(url, model_url, runs, steps, durability))
        parts = [part]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        shares = [runs // processes + (1 if n < runs % processes else 0) for n in range(processes)]
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes, mp_context=context) as pool:
            # Started once the processes are up and have imported LangGraph (a few seconds).
            start_at = time.time() + 8.0
            futures = [
                pool.submit(_throughput_part, url, model_url, share, steps, durability, start_at)
                for share in shares
            ]
            parts = [future.result(timeout=600) for future in futures]
    wall = max(p["ended"] for p in parts) - min(p["began"] for p in parts)
    return {"steps_per_s": runs * steps / wall, "max_run_s": max(p["max_run_s"] for p in parts)}


def _throughput(
    url: str, runs: int, steps: int, repeats: int, durability: str, processes: int = 1
) -> dict[str, Any]:
    logs = common.log_dir("peer-throughput")
    model = common.ModelServerProc(logs, latency=0.05).start()
    try:
        asyncio.run(_setup_saver(url))
        results = [
            _throughput_round(url, model.url, runs, steps, durability, processes)
            for _ in range(repeats)
        ]
    finally:
        model.stop()
    rates = [r["steps_per_s"] for r in results]
    return {
        "steps_per_s": statistics.median(rates),
        "spread": common.spread(rates),
        "max_run_s": statistics.median(r["max_run_s"] for r in results),
        "samples": [round(r, 1) for r in rates],
        "processes": processes,
    }


# --- resume after a human decision -------------------------------------------------------------


def _resume(url: str, history: int, samples: int, durability: str) -> dict[str, Any]:
    import psycopg
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command, interrupt
    from psycopg.rows import dict_row

    marks: dict[str, float] = {}
    tools = _tools(marks)

    def agent(state: State) -> dict[str, Any]:
        made = state.get("steps", 0)
        if made < history:
            return {"messages": [_ai_call(made)], "steps": 1}
        if made == history:
            call = {"name": "write", "args": {"path": "b.txt", "content": "x"}, "id": "gate"}
            return {"messages": [AIMessage(content="", tool_calls=[call])], "steps": 1}
        return {"messages": [AIMessage(content="done")]}

    def gate(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        if any(c["name"] == "write" for c in getattr(last, "tool_calls", [])):
            interrupt({"approve": "write"})  # parks the run until a Command(resume=...)
        return {}

    def build(saver: Any) -> Any:
        graph = StateGraph(_state_type())
        graph.add_node("agent", agent)
        graph.add_node("gate", gate)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges(
            "agent", tools_condition, {"tools": "gate", "__end__": "__end__"}
        )
        graph.add_edge("gate", "tools")
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=saver)

    latencies = []
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        threads = []
        for _ in range(samples + 1):
            config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 10_000}
            state = {"messages": [HumanMessage("Bench")], "steps": 0}
            build(saver).invoke(state, config, durability=durability)
            threads.append(config)
    for n, config in enumerate(threads):
        marks.clear()
        started = time.monotonic()
        # The decision arrives in another process: a new connection and a new graph object.
        with psycopg.connect(
            url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            graph = build(PostgresSaver(conn))
            graph.invoke(Command(resume={"approved": True}), config, durability=durability)
        if n:  # the first one warms up
            latencies.append((marks["started"] - started) * 1000)
    return {
        "p50": statistics.median(latencies),
        "p99": common.percentile(latencies, 99),
    }


# --- cached measurement --------------------------------------------------------------------------

_cache: dict[tuple[Any, ...], dict[str, Any]] = {}


def _cached(key: tuple[Any, ...], measure: Any) -> dict[str, Any]:
    if not available():
        return {"p50": None, "note": NOT_INSTALLED}
    if key not in _cache:
        try:
            with common.ScratchDatabase("peer") as db:
                _cache[key] = measure(db.url)
        except Exception as exc:  # report, do not hide: the row says what failed
            _cache[key] = {"p50": None, "note": f"peer failed: {type(exc).__name__}: {exc}"[:300]}
    return _cache[key]


def step_overhead(
    steps: int, smoke: bool = False, durability: str = SAME_GUARANTEE
) -> dict[str, Any]:
    runs, repeats = (1, 1) if smoke else ((10, 3) if steps <= 20 else (3, 3))
    return _cached(
        ("steps", steps, smoke, durability),
        lambda url: _step_overhead(url, steps, runs, repeats, durability),
    )


def throughput(
    smoke: bool = False, durability: str = SAME_GUARANTEE, processes: int = 1
) -> dict[str, Any]:
    """200 runs x 10 steps in ``processes`` processes (the runs split between them)."""
    runs, steps, repeats = (10, 3, 1) if smoke else (200, 10, 3)
    return _cached(
        ("throughput", smoke, durability, processes),
        lambda url: _throughput(url, runs, steps, repeats, durability, processes),
    )


def resume(history: int, smoke: bool = False, durability: str = SAME_GUARANTEE) -> dict[str, Any]:
    samples = 3 if smoke else 30
    return _cached(
        ("resume", history, smoke, durability),
        lambda url: _resume(url, history, samples, durability),
    )


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not available():
        return [
            common.row(
                "LangGraph + PostgresSaver peer", "reference", passed=None, note=NOT_INSTALLED
            )
        ]
    rows = []
    for durability in MODES:
        rows += _rows(durability, smoke)
    return rows


def _mode(durability: str) -> str:
    same = " (our guarantee: the ratios compare with it)" if durability == SAME_GUARANTEE else ""
    return f'durability="{durability}"{same}'


def _rows(durability: str, smoke: bool) -> list[dict[str, Any]]:
    rows = []
    for steps in (20, 100):
        peer = step_overhead(steps, smoke, durability)
        rows.append(
            common.row(
                f"peer: LangGraph + PostgresSaver per-step overhead, {steps}-step runs, "
                f"{durability}",
                "reference",
                passed=None,
                median_ms=peer.get("p50"),
                p99_ms=_round(peer.get("p99")),
                spread=peer.get("spread"),
                note=peer.get("note"),
                durability=_mode(durability),
                reference="issue: 6.0 ms at 20 steps, 8.1 ms at 100",
            )
        )
    peer = throughput(smoke, durability)
    rows.append(
        common.row(
            "peer: LangGraph + PostgresSaver 200 runs x 10 steps, 50 ms model, one process, "
            f"{durability}",
            "reference",
            passed=None,
            median=peer.get("steps_per_s"),
            unit="steps/s",
            spread=peer.get("spread"),
            max_run_s=_round(peer.get("max_run_s")),
            note=peer.get("note"),
            durability=_mode(durability),
            reference="issue: ~118 steps/s",
        )
    )
    for history in (2, 50):
        peer = resume(history, smoke, durability)
        rows.append(
            common.row(
                f"peer: LangGraph resume (new connection) to tool start, {history} prior steps, "
                f"{durability}",
                "reference",
                passed=None,
                median_ms=peer.get("p50"),
                p99_ms=_round(peer.get("p99")),
                note=peer.get("note"),
                durability=_mode(durability),
                reference="issue: p50 ~20 ms, p99 ~33 ms",
            )
        )
    return rows


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_langgraph", description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    for line in run(smoke=args.smoke):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
