"""Bar charts as SVG geometry, for server-rendered charts (no script, no external asset). Pure.

:func:`stacked_bars` lays out one bar per day, each stacked from its series in order, on a
y axis rounded up to a 1-2-5 step; every bar segment carries the text of its tooltip (an SVG
``<title>``), so the numbers are one hover (or one screen-reader stop) away. The template
``frontend/_chart.html`` draws a :class:`Chart`; pages keep the same figures in a table too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 8, 10, 24
#: At most this many day labels under the x axis (every n-th day is labelled).
MAX_X_LABELS = 10


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    series: int  # the index of its series: the template's colour class
    title: str


@dataclass(frozen=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: int = WIDTH
    height: int = HEIGHT
    segments: list[Segment] = field(default_factory=list)
    x_labels: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    legend: list[tuple[int, str]] = field(default_factory=list)
    empty: bool = True

    @property
    def plot_left(self) -> int:
        return LEFT

    @property
    def plot_right(self) -> int:
        return self.width - RIGHT

    @property
    def baseline(self) -> int:
        return self.height - BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


def _plain(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def stacked_bars(
    title: str,
    days: Sequence[date],
    series: Mapping[str, Sequence[float]],
    *,
    fmt: Callable[[float], str] = _plain,
) -> Chart:
    """One bar per day of ``days`` stacked from ``series`` (label → one value per day), the
    first series at the bottom; tooltips read ``2026-12-04 · succeeded: 12``."""
    names = list(series)
    for name in names:
        if len(series[name]) != len(days):
            raise ValueError(f"series {name!r} has {len(series[name])} values for {len(days)} days")
    totals = [sum(float(series[n][i]) for n in names) for i in range(len(days))]
    top = nice_ceiling(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(days), 1)
    bar = max(slot * 0.7, 1.0)
    segments: list[Segment] = []
    for i, day in enumerate(days):
        x = LEFT + i * slot + (slot - bar) / 2
        y = float(HEIGHT - BOTTOM)
        for index, name in enumerate(names):
            value = float(series[name][i])
            if value <= 0:
                continue
            h = value / top * plot_h
            y -= h
            label = f"{day.isoformat()} · {name}: {fmt(value)}"
            segments.append(
                Segment(round(x, 1), round(y, 1), round(bar, 1), round(h, 1), index, label)
            )
    every = max(1, math.ceil(len(days) / MAX_X_LABELS))
    x_labels = [
        Tick(round(LEFT + i * slot + slot / 2, 1), day.strftime("%m-%d"))
        for i, day in enumerate(days)
        if i % every == 0 or i == len(days) - 1
    ]
    y_ticks = [Tick(round(HEIGHT - BOTTOM - f * plot_h, 1), fmt(top * f)) for f in (0, 0.5, 1)]
    return Chart(
        title=title,
        segments=segments,
        x_labels=x_labels,
        y_ticks=y_ticks,
        legend=list(enumerate(names)),
        empty=not any(totals),
    )
