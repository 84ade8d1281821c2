"""``python -m bench [--smoke] [NAME ...]``: every benchmark (or those named), as one table.

Each benchmark module exposes ``run(smoke: bool = False) -> list[dict]``; each row has at least
``figure``, ``target``, ``passed`` and a measured value (``median`` / ``median_ms``), optionally
``spread``, ``p99_ms``, ``unit``, ``ratio`` and ``reference``. Results are also written as JSON
under ``bench/results/`` for tracking. Smoke mode (used by CI) only checks that they work.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = [
    # The engine (issue 9): the database floor first, its figures are the others' references.
    "raw_reference",
    "step_overhead",
    # Spans (issue 22): the step figure with spans on over spans off, in the same run.
    "span_overhead",
    "throughput",
    "dispatch",
    "resume",
    "claims",
    # Behind PgBouncer (issue 25): the journal write inline vs psycopg's pipeline mode.
    "pooler_batches",
    "harness_compile",
    "sandbox_latency",
    "skill_latency",
    "scheduler",
    "approvals",
    # What a person or a script feels at the API (issue 28): four calls through uvicorn, idle.
    "api_latency",
    # A year of history (issue 28): the pages with 200,000 copied runs over a small database.
    "volume",
    # The OpenAI-compatible endpoint (issue 20): streamed first byte over the model's, 100 streams.
    "gateway_stream",
    # Live run streams (issue 22): 500 idle streams' database cost, an event's fan-out latency.
    "streams",
    # Knowledge bases (issue 23): full-text and hybrid search over 100,000 chunks, ingest.
    "knowledge",
    # LangGraph + PostgresSaver's own rows (optional extra ``bench``; says so when missing).
    "peer_langgraph",
]
RESULTS = Path(__file__).resolve().parent / "results"


def _value(row: dict[str, Any]) -> str:
    for key in ("median", "median_ms"):
        if key in row and row[key] is not None:
            unit = row.get("unit", "ms" if key == "median_ms" else "")
            return f"{row[key]:.3g} {unit}".strip()
    return "-"


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no benchmark gave a result")
        return
    headers = ["benchmark", "figure", "target", "measured", "spread", "ratio", "pass"]
    table = [
        [
            r["benchmark"],
            str(r.get("figure", "")),
            str(r.get("target", "")),
            _value(r),
            str(r.get("spread", "")),
            f"{r['ratio']:.2f}" if isinstance(r.get("ratio"), (int, float)) else "",
            "PASS" if r.get("passed") else "FAIL",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def _say_whether_the_peer_runs() -> None:
    from bench import peer_langgraph

    if not peer_langgraph.available():
        print(
            f"[peer_langgraph] skipped: {peer_langgraph.NOT_INSTALLED}; the rows say so and "
            "carry no ratio to LangGraph",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check they work")
    parser.add_argument("--only", action="append", choices=BENCHMARKS)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (of {', '.join(BENCHMARKS)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    args.only = [*(args.only or []), *args.names] or None
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    rows: list[dict[str, Any]] = []
    errors = 0
    _say_whether_the_peer_runs()
    for name in args.only or BENCHMARKS:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"bench.{name}":
                print(f"[{name}] not present yet", file=sys.stderr)
                continue
            raise
        started = time.monotonic()
        try:
            results = module.run(smoke=args.smoke)
        except Exception as exc:  # report and go on with the other benchmarks
            errors += 1
            print(f"[{name}] failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"[{name}] done in {time.monotonic() - started:.1f} s", file=sys.stderr)
        rows.extend({"benchmark": name, **row} for row in results)
    _print_table(rows)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"{'smoke' if args.smoke else 'bench'}-{stamp}.json"
    out.write_text(json.dumps(rows, indent=2, default=str))
    print(f"results written to {out}")
    if errors:
        return 1
    return 0 if args.smoke or all(r.get("passed") for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
