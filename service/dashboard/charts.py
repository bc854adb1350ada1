"""Charts for the dashboard: matplotlib drawn on the server into inline SVG (no JavaScript)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from markupsafe import Markup
from matplotlib.ticker import MaxNLocator

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.fonttype": "none",
        "figure.dpi": 96,
    }
)
COLOURS = ["#2f6fb0", "#d9822b", "#3a9a5b", "#b0413e", "#7a5fb5", "#8c8c8c"]


def _svg(figure: Any, title: str) -> Markup:
    buffer = io.StringIO()
    figure.tight_layout()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog and doctype: it goes inline
    return Markup(f'<figure class="chart" role="img" aria-label="{title}">{text}</figure>')  # noqa: S704


def bars(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    unit: str,
    *,
    errors: Sequence[tuple[float, float]] | None = None,
    highlight: str | None = None,
    counts: bool = False,
) -> Markup:
    """Horizontal bars, one per label (a configuration, a scheduler …); counts: whole-number
    ticks (devices, not 0.25 of one). The same figures draw the same chart: it is drawn once
    (the fleet page's counts change seldom; drawing takes tens of milliseconds)."""
    return _bars(
        title,
        tuple(labels),
        tuple(values),
        unit,
        tuple(errors) if errors is not None else None,
        highlight,
        counts,
    )


@lru_cache(maxsize=256)
def _bars(
    title: str,
    labels: tuple[str, ...],
    values: tuple[float, ...],
    unit: str,
    errors: tuple[tuple[float, float], ...] | None,
    highlight: str | None,
    counts: bool,
) -> Markup:
    height = 0.9 + 0.28 * len(labels)
    figure, axes = plt.subplots(figsize=(6.4, height))
    colours = [COLOURS[1] if label == highlight else COLOURS[0] for label in labels]
    xerr = None
    if errors is not None:
        xerr = [
            [v - lo for v, (lo, _) in zip(values, errors, strict=True)],
            [hi - v for v, (_, hi) in zip(values, errors, strict=True)],
        ]
    axes.barh(range(len(labels)), values, color=colours, xerr=xerr, capsize=3)
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlabel(unit)
    if counts:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(title, loc="left")
    return _svg(figure, title)


def changes(title: str, rows: Sequence[tuple[str, float, float, float]]) -> Markup:
    """Predicted change per objective (better is right), with its 80 % interval."""
    figure, axes = plt.subplots(figsize=(6.4, 0.9 + 0.35 * len(rows)))
    for index, (_, change, low, high) in enumerate(rows):
        colour = COLOURS[2] if change >= 0 else COLOURS[3]
        spread = [[(change - low) * 100], [(high - change) * 100]]
        axes.errorbar([change * 100], [index], xerr=spread, fmt="o", color=colour, capsize=4)
    axes.axvline(0, color="#999", linewidth=0.8)
    axes.set_yticks(range(len(rows)), [row[0] for row in rows])
    axes.invert_yaxis()
    axes.set_xlabel("predicted improvement, % (80 % interval)")
    axes.set_title(title, loc="left")
    return _svg(figure, title)


def timeline(
    title: str, times: Sequence[datetime], series: dict[str, Sequence[float | None]], unit: str
) -> Markup:
    figure, axes = plt.subplots(figsize=(6.4, 2.4))
    for index, (name, values) in enumerate(series.items()):
        points = [(t, v) for t, v in zip(times, values, strict=True) if v is not None]
        if points:
            axes.plot(
                [t for t, _ in points],  # type: ignore[arg-type]
                [v for _, v in points],
                label=name,
                color=COLOURS[index % len(COLOURS)],
                linewidth=1.2,
            )
    axes.set_ylabel(unit)
    axes.set_title(title, loc="left")
    if len(series) > 1:
        axes.legend(loc="upper left", fontsize=8, frameon=False)
    figure.autofmt_xdate()
    return _svg(figure, title)


def distribution(title: str, series: Mapping[str, Sequence[tuple[float, float, int]]]) -> Markup:
    """Latency distributions as step histograms on a log axis: per series, (low µs, high µs,
    count) buckets, drawn as the share of I/Os per bucket."""
    figure, axes = plt.subplots(figsize=(6.4, 2.6))
    for index, (name, buckets) in enumerate(series.items()):
        total = sum(count for _, _, count in buckets) or 1
        edges = [low for low, _, _ in buckets] + [buckets[-1][1]] if buckets else []
        shares = [100 * count / total for _, _, count in buckets]
        if shares:
            axes.stairs(shares, edges, label=name, color=COLOURS[index % len(COLOURS)])
    axes.set_xscale("log")
    axes.set_xlabel("µs")
    axes.set_ylabel("% of I/Os")
    axes.set_title(title, loc="left")
    if series:
        axes.legend(loc="upper right", fontsize=8, frameon=False)
    return _svg(figure, title)
