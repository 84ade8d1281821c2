"""The table ``python -m bench`` prints, whatever the benchmarks gave."""

from __future__ import annotations

import pytest

from bench.__main__ import _print_table


def test_a_table_with_no_rows_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """Every benchmark failed (each failure already reported): the table says there is nothing
    to show instead of raising over an empty list, and ``main`` still exits non-zero."""
    _print_table([])
    assert capsys.readouterr().out.strip() == "no benchmark gave a result"


def test_a_row_is_printed_under_the_headers(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"benchmark": "x", "figure": "f", "target": "t", "median_ms": 1.5, "passed": True}
    _print_table([row])
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["benchmark", "figure", "target"]
    assert line.split() == ["x", "f", "t", "1.5", "ms", "PASS"]
