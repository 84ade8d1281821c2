"""Sandbox overhead: a trivial skill from ``run_sandboxed`` call to result.

What is timed is everything a skill execution pays for isolation: taking a uid slot, writing the
run directory, the exec chain (choom, setpriv, nice, bwrap with namespaces, mounts and the
seccomp filter, prlimit), the interpreter's start, the final process sweep and the clean-up.
The reference is the same interpreter started bare (``python3 -I -S -c pass``), so ``ratio``
says how much the sandbox multiplies the start cost.

``python -m bench.sandbox_latency [--smoke]`` prints the table.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

from sandbox import Language, SandboxConfig, SandboxRequest, run_sandboxed

#: (median, p99) targets in ms. bwrap itself costs ~20 ms over a bare start on this machine
#: kind (docs/reliability.md section 4: 33 ms vs 16 ms); the rest is bookkeeping.
TARGETS_MS: dict[Language, tuple[float, float]] = {"python": (100.0, 300.0), "node": (250.0, 600.0)}
PROGRAMS: dict[Language, str] = {"python": "print(1)", "node": "console.log(1)"}
FIGURES: dict[Language, str] = {
    "python": "sandboxed trivial Python skill start-to-result",
    "node": "sandboxed trivial Node.js skill start-to-result",
}


def _time_runs(language: Language, runs: int) -> list[float]:
    request = SandboxRequest(language=language, code=PROGRAMS[language])
    run_sandboxed(request)  # the first run also pays for the backend probe
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        result = run_sandboxed(request)
        timings.append((time.perf_counter() - started) * 1000)
        if result.stdout != "1\n":
            raise RuntimeError(f"unexpected sandbox result: {result}")
    return timings


def _bare_start_ms(language: Language, runs: int) -> float:
    config = SandboxConfig.from_env()
    argv = (
        [config.python_path, "-I", "-S", "-c", "pass"]
        if language == "python"
        else [config.node_path, "-e", "0"]
    )
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, env={})
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def _p99(timings: list[float]) -> float:
    if len(timings) < 2:
        return timings[0]
    return statistics.quantiles(timings, n=100, method="inclusive")[98]


def _row(language: Language, runs: int) -> dict[str, Any]:
    timings = _time_runs(language, runs)
    bare = _bare_start_ms(language, max(5, runs // 5))
    median, p99 = statistics.median(timings), _p99(timings)
    target_median, target_p99 = TARGETS_MS[language]
    return {
        "figure": FIGURES[language],
        "target": f"median <= {target_median:g} ms, p99 <= {target_p99:g} ms",
        "median_ms": round(median, 1),
        "p99_ms": round(p99, 1),
        "ratio": round(median / bare, 2),
        "reference": f"bare interpreter start {bare:.1f} ms (median)",
        "runs": runs,
        "passed": median <= target_median and p99 <= target_p99,
    }


def run(smoke: bool = False) -> list[dict[str, Any]]:
    return [_row("python", 5 if smoke else 100), _row("node", 3 if smoke else 30)]


def _print(rows: list[dict[str, Any]]) -> None:
    columns = ["figure", "target", "median_ms", "p99_ms", "ratio", "reference", "passed"]
    table = [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    for line in [columns, *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    _print(run(smoke="--smoke" in sys.argv))
