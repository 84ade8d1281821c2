"""The span tree of a run as a pure function of its rows (``loops.spans``), and the W3C
``traceparent`` parsing the trigger API uses (``orchestrator.tracecontext``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from loops.spans import RunFacts, Span, build_spans, sampled, span_tree
from orchestrator.tracecontext import trace_id_of

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ON = {"enabled": True, "tracingRetentionDays": 7, "captureInputs": True, "captureOutputs": True}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def snap(observability: dict[str, Any], effects: dict[str, str] | None = None) -> dict[str, Any]:
    return {"settings": {"observability": observability, "tools": {"effects": effects or {}}}}


def facts(
    *, status: str = "succeeded", finished: float | None = 60, maker: dict[str, Any] = ON
) -> RunFacts:
    return RunFacts(
        run_id="r1",
        trace_id=TRACE,
        name="run demo",
        status=status,
        created_at=at(0),
        started_at=at(1),
        finished_at=at(finished) if finished is not None else None,
        failure_reason="" if status == "succeeded" else "it broke",
        harness_snapshots={
            "leader": snap(ON),
            "makers": {"mk": snap(maker, {"mcp__docs__search": "external"})},
            "verifier": snap(ON),
        },
        role_bindings={"leader": "ld", "makers": ["mk"], "verifier": "vf"},
    )


def step(seq: int, invocation: str, kind: str, name: str, start: float, end: float | None,
         **extra: Any) -> dict[str, Any]:  # fmt: skip
    role = invocation.split(":")[0].split("/")[0]
    row = {
        "seq": seq,
        "role": role,
        "invocation": invocation,
        "kind": kind,
        "status": "completed" if end is not None else "started",
        "name": name,
        "request": {},
        "response": None,
        "error": "",
        "tokens_in": 0,
        "tokens_out": 0,
        "cost": 0,
        "started_at": at(start),
        "finished_at": at(end) if end is not None else None,
    }
    row.update(extra)
    return row


def model(seq: int, invocation: str, start: float, end: float, tokens: int = 100) -> dict[str, Any]:
    response = {"model": "gpt-x", "endpoint": "ep-main", "message": {"content": "hi"}}
    return step(seq, invocation, "model", "gpt-x", start, end, tokens_in=tokens,
                tokens_out=tokens // 2, cost=0.01, response=response, request={"step": seq})  # fmt: skip


def call(seq: int, invocation: str, name: str, start: float, end: float | None, model_seq: int,
         index: int = 0, effect: str = "read", **extra: Any) -> dict[str, Any]:  # fmt: skip
    request = {"model_seq": model_seq, "index": index, "arguments": {"q": 1}, "effect": effect}
    return step(seq, invocation, "tool", name, start, end, request=request,
                response={"content": "ok"}, **extra)  # fmt: skip


def journal() -> list[dict[str, Any]]:
    return [
        model(1, "leader", 2, 4),
        model(2, "maker:0", 5, 6),
        call(3, "maker:0", "read", 6, 7, model_seq=2),
        call(4, "maker:0", "mcp__docs__search", 6, 8, model_seq=2, index=1),
        call(5, "maker:0", "skill_hub_lint", 6, 9, model_seq=2, index=2, effect="write"),
        call(6, "maker:0", "a2a__helper", 6, 10, model_seq=2, index=3, effect="external"),
        call(7, "maker:0", "dispatch_sub_agent_task", 10, 20, model_seq=2, index=4, effect="write"),
        model(8, "maker:0/sub:2.4", 11, 12, tokens=10),
        call(9, "maker:0", "write", 21, 30, model_seq=2, index=5, effect="write"),
        model(10, "maker:0", 31, 32),
        step(11, "maker:0", "notice", "output_correction", 32, 32),
        model(12, "verifier", 40, 45),
    ]


APPROVAL = {
    "id": "a1",
    "step_seq": 9,
    "role": "maker",
    "invocation": "maker:0",
    "tool_name": "write",
    "status": "approved",
    "decided_by": "ann",
    "created_at": at(21),
    "decided_at": at(28),
}


def by_name(spans: list[Span]) -> dict[str, Span]:
    return {s.name: s for s in spans}


def test_the_tree_nests_run_invocations_calls_sub_agents_and_approval_waits() -> None:
    spans = build_spans(facts(), journal(), [APPROVAL], {"maker:0": at(4.5)})
    [root] = span_tree(spans)
    assert (root["kind"], root["name"], root["parent_span_id"]) == ("run", "run demo", "")
    assert [c["name"] for c in root["children"]] == ["leader", "maker:0", "verifier"]
    maker = root["children"][1]
    assert maker["started_at"] == at(4.5)  # the invocation.started event, before its first step
    assert [c["kind"] for c in maker["children"]] == [
        "model", "tool", "mcp", "skill", "a2a", "subagent", "tool", "model",
    ]  # fmt: skip
    dispatch = maker["children"][5]
    [child] = dispatch["children"]
    assert (child["kind"], child["name"]) == ("invocation", "maker:0/sub:2.4")
    assert [g["tokens_in"] for g in child["children"]] == [10]
    [wait] = maker["children"][6]["children"]
    assert (wait["kind"], wait["duration_ms"], wait["attributes"]["decided_by"]) == (
        "approval",
        7000,
        "ann",
    )
    assert "output_correction" not in by_name(spans)


def test_spans_carry_model_endpoint_tokens_cost_and_the_raised_tier() -> None:
    spans = by_name(build_spans(facts(), journal(), [], {}))
    root = next(s for s in spans.values() if s.kind == "run")
    assert (root.tokens_in, root.tokens_out) == (100 * 4 + 10, 50 * 4 + 5)
    assert round(root.cost, 6) == 0.05
    chat = next(s for s in spans.values() if s.kind == "model")
    assert (chat.model, chat.endpoint, chat.tier) == ("gpt-x", "ep-main", "")
    tiers = {name: spans[name].tier for name in ("read", "mcp__docs__search", "write")}
    # mcp__docs__search is declared read, the maker's harness raises it to external.
    assert tiers == {"read": "read", "mcp__docs__search": "external", "write": "write"}
    maker = spans["maker:0"]
    # The maker's two model calls and its sub-agent's one.
    assert (maker.tokens_in, maker.started_at, maker.ended_at) == (100 + 100 + 10, at(5), at(32))
    assert spans["dispatch_sub_agent_task"].tokens_in == 10


def test_a_call_still_open_when_the_run_ended_ends_with_it_failed() -> None:
    rows = [model(1, "leader", 2, 4), call(2, "leader", "read", 4, None, model_seq=1)]
    spans = by_name(build_spans(facts(status="failed", finished=9), rows, [], {}))
    assert (spans["read"].ended_at, spans["read"].status) == (at(9), "error")
    assert spans["run demo"].status == "error" and spans["run demo"].error == "it broke"
    assert spans["leader"].status == "error"


def test_a_live_run_keeps_open_spans_open() -> None:
    rows = [model(1, "leader", 2, 4), call(2, "leader", "read", 4, None, model_seq=1)]
    spans = by_name(build_spans(facts(status="running", finished=None), rows, [], {}))
    assert spans["read"].ended_at is None and spans["read"].status == "running"
    assert spans["leader"].ended_at is None and spans["run demo"].status == "running"


def test_capture_settings_keep_or_drop_inputs_and_outputs_per_role() -> None:
    quiet = {**ON, "captureInputs": False, "captureOutputs": False}
    spans = build_spans(facts(maker=quiet), journal(), [], {})
    leader = next(s for s in spans if s.role == "leader" and s.kind == "model")
    maker = next(s for s in spans if s.role == "maker" and s.kind == "model")
    assert set(leader.attributes) == {"input", "output"}
    assert leader.attributes["output"]["message"] == {"content": "hi"}
    assert maker.attributes == {}


def test_a_role_with_spans_disabled_has_none_and_no_role_means_no_tree() -> None:
    spans = build_spans(facts(maker={**ON, "enabled": False}), journal(), [APPROVAL], {})
    assert {s.role for s in spans} == {"", "leader", "verifier"}
    off = snap({"enabled": False})
    fields = {name: getattr(facts(), name) for name in RunFacts.__slots__}
    run = RunFacts(
        **{**fields, "harness_snapshots": {"leader": off, "makers": {"mk": off}, "verifier": off}}
    )
    assert build_spans(run, journal(), [APPROVAL], {}) == []


def test_span_ids_are_stable_and_differ_between_runs_of_one_trace() -> None:
    first = [s.span_id for s in build_spans(facts(), journal(), [], {})]
    again = [s.span_id for s in build_spans(facts(), journal(), [], {})]
    other = RunFacts(**{**{n: getattr(facts(), n) for n in RunFacts.__slots__}, "run_id": "r2"})
    assert first == again and len(set(first)) == len(first)
    assert not set(first) & {s.span_id for s in build_spans(other, journal(), [], {})}
    assert all(len(i) == 16 and int(i, 16) for i in first)


def test_traceparent_gives_its_trace_id_only_when_valid() -> None:
    good = f"00-{TRACE}-00f067aa0ba902b7-01"
    assert trace_id_of(good) == TRACE
    assert trace_id_of(f"01-{TRACE}-00f067aa0ba902b7-01-later") == TRACE  # a later version
    for bad in (
        None,
        "",
        f"ff-{TRACE}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",
        f"00-{TRACE}-00f067aa0ba902b7-01-extra",
        "garbage",
    ):
        assert trace_id_of(bad) == "", bad


def test_a_model_call_starts_its_measured_duration_before_its_row_was_written() -> None:
    row = model(1, "leader", 4, 4)
    row["duration_ms"] = 1500  # the row is written when the answer is in
    spans = by_name(build_spans(facts(), [row], [], {}))
    assert (spans["gpt-x"].started_at, spans["gpt-x"].ended_at) == (at(2.5), at(4))
    assert spans["leader"].started_at == at(2.5)


def test_redaction_patterns_mask_what_matches_in_captured_inputs_and_outputs() -> None:
    rules = {**ON, "redact": ["sk-[a-z0-9]+", "[0-9]{4}-[0-9]{4}"]}
    row = call(2, "maker:0", "http_get", 5, 6, model_seq=1)
    row["request"]["arguments"] = {"key": "sk-abc123", "list": ["card 1234-5678", 7]}
    row["response"] = {"content": "used sk-abc123 and sk-zz9"}
    spans = by_name(build_spans(facts(maker=rules), [model(1, "maker:0", 4, 5), row], [], {}))
    captured = spans["http_get"].attributes
    assert captured["input"]["arguments"] == {"key": "***", "list": ["card ***", 7]}
    assert captured["output"] == {"content": "used *** and ***"}
    assert row["request"]["arguments"]["key"] == "sk-abc123"  # the step itself is untouched


def test_sampling_keeps_the_spans_of_the_runs_whose_trace_is_in_the_sample() -> None:
    # TRACE's low 64 bits are 0xa3ce929d0e0e4736, 0.64 of 2^64: in a sample of 0.7, not of 0.6.
    kept = build_spans(facts(maker={**ON, "samplingRate": 0.7}), journal(), [APPROVAL], {})
    dropped = build_spans(facts(maker={**ON, "samplingRate": 0.6}), journal(), [APPROVAL], {})
    assert "maker" in {s.role for s in kept}
    assert {s.role for s in dropped} == {"", "leader", "verifier"}

    rng = random.Random(7)
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(4000)]
    for rate in (0.0, 0.1, 0.5, 1.0):
        share = sum(sampled(t, rate) for t in traces) / len(traces)
        assert abs(share - rate) < 0.03, (rate, share)
    # Consistent: a trace in the sample of a rate is in the sample of every higher rate.
    assert all(sampled(t, 0.5) for t in traces if sampled(t, 0.1))
