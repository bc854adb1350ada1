"""Charts for the dashboard, drawn on the server into inline SVG (no JavaScript): bars by
matplotlib; timelines and latency distributions by hand (see timeline)."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from markupsafe import Markup, escape

# Every chart is drawn at the width it is shown: a dashboard card's inner width at the grid's
# narrowest column (base.html: 380 px cards, 1 rem padding). Drawn at 614 px and shrunk into
# the cards, their text came out at about 5 px; wider cards show them at this size, not larger.
WIDTH_IN = 3.6  # inches at 96 dpi: 346 px
COLOURS = ["#2f6fb0", "#d9822b", "#3a9a5b", "#b0413e", "#7a5fb5", "#8c8c8c"]


@lru_cache(maxsize=1)
def _pyplot() -> Any:
    """matplotlib, imported when the first chart is drawn: it is a second of `serve`'s start
    otherwise (a busy host's fixtures timed out waiting for it), for pages not yet asked for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "svg.fonttype": "none",
            "figure.dpi": 96,
        }
    )
    return plt


def _wrap(text: str, width: int) -> list[str]:
    """Lines of at most about `width` characters, broken after a space, a comma or a slash
    (a configuration's label: "bfq (low_latency=1, slice_idle_us=8000)/interrupt"), a word
    longer than a line on its own line: a chart's text stays inside the chart."""
    lines: list[str] = []
    line = ""
    for token in re.findall(r"[^ ,/]+[,/]? ?|[,/] ?| ", text):
        if line and len(line) + len(token.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += token
    if line.strip() or not lines:
        lines.append(line.rstrip())
    return lines


TITLE_CHARS = 46  # a title's line at 12-13 px across the chart's width
LABEL_CHARS = 22  # a bar's label: at most about a third of the width


def _label_lines(label: str, most: int = 3) -> list[str]:
    """A bar's label in at most `most` lines: a configuration with many tunables made every
    row twelve lines tall; the table beside the chart names it in full."""
    lines = _wrap(label, LABEL_CHARS)
    if len(lines) <= most:
        return lines
    hidden = "".join(lines[most - 1 :]).count("=")  # a configuration's tunables left out
    return [*lines[: most - 1], f"… {hidden} more tunables" if hidden else "…"]


def _max_n_locator(**options: Any) -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(**options)


def _title(figure: Any, lines: list[str]) -> None:
    """The chart's title from the figure's left edge (an axes' title starts where its tick
    labels end, and a long one ran off the right)."""
    figure.suptitle("\n".join(lines), x=0.01, ha="left", fontsize=10)


def _svg(figure: Any, title: str) -> Markup:
    buffer = io.StringIO()
    figure.tight_layout()
    figure.savefig(buffer, format="svg")
    _pyplot().close(figure)
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
    wrapped = ["\n".join(_label_lines(label)) for label in labels]
    title_lines = _wrap(title, TITLE_CHARS)
    # every row as tall as the tallest label (8 pt lines, 0.135 in each), or they overlap
    lines = max((label.count("\n") + 1 for label in wrapped), default=1)
    height = 0.75 + 0.2 * len(title_lines) + len(labels) * (0.08 + 0.135 * lines)
    figure, axes = _pyplot().subplots(figsize=(WIDTH_IN, height))
    colours = [COLOURS[1] if label == highlight else COLOURS[0] for label in labels]
    xerr = None
    if errors is not None:
        xerr = [
            [v - lo for v, (lo, _) in zip(values, errors, strict=True)],
            [hi - v for v, (_, hi) in zip(values, errors, strict=True)],
        ]
    axes.barh(range(len(labels)), values, color=colours, xerr=xerr, capsize=3)
    axes.set_yticks(range(len(labels)), wrapped, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel(unit)
    if counts:
        axes.xaxis.set_major_locator(_max_n_locator(integer=True))
    _title(figure, title_lines)
    return _svg(figure, title)


def changes(title: str, rows: Sequence[tuple[str, float, float, float]]) -> Markup:
    """Predicted change per objective (better is right), with its 80 % interval."""
    title_lines = _wrap(title, TITLE_CHARS)
    height = 0.75 + 0.2 * len(title_lines) + 0.35 * len(rows)
    figure, axes = _pyplot().subplots(figsize=(WIDTH_IN, height))
    for index, (_, change, low, high) in enumerate(rows):
        colour = COLOURS[2] if change >= 0 else COLOURS[3]
        spread = [[(change - low) * 100], [(high - change) * 100]]
        axes.errorbar([change * 100], [index], xerr=spread, fmt="o", color=colour, capsize=4)
    axes.axvline(0, color="#999", linewidth=0.8)
    axes.set_yticks(range(len(rows)), [row[0] for row in rows])
    axes.invert_yaxis()
    axes.set_xlabel("predicted gain, % (80 % interval)")
    _title(figure, title_lines)
    return _svg(figure, title)


# timelines are drawn as SVG by hand, at matplotlib's size and in the same colours: matplotlib
# took 165-220 ms a chart (360-2,160 points), most of a device page's time; this takes 4.5-18 ms
_W, _H = round(WIDTH_IN * 96), 200  # px
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 12, 26, 44


def _tick_label(value: float) -> str:
    if value == 0:
        return "0"
    # short, or the tick labels run into the axis's unit: 125k, 1.5M
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(value) >= scale:
            shown = value / (scale if scale != 1e4 else 1e3)
            return f"{shown:.3g}{suffix}"
    return f"{value:g}"


def _time_ticks(low: datetime, high: datetime) -> tuple[list[datetime], str]:
    """About four ticks on round boundaries, and the strftime format that fits the span."""
    span = (high - low).total_seconds()
    steps = [60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86_400, 2 * 86_400]
    steps += [7 * 86_400, 14 * 86_400, 30 * 86_400]
    # labels fit the plot's 276 px: six of "14:00" or "11-25", four of "11-25 14:00"
    step = next((s for s in steps if span / s <= 6), steps[-1])
    if span > 86_400 and step < 86_400:
        step = next((s for s in steps if span / s <= 4), steps[-1])
    first = low.timestamp() // step * step + step
    ticks = []
    at = first
    while at <= high.timestamp():
        ticks.append(datetime.fromtimestamp(at, tz=low.tzinfo))
        at += step
    if step >= 86_400:
        return ticks, "%m-%d"
    return ticks, "%H:%M" if span <= 86_400 else "%m-%d %H:%M"


def timeline(
    title: str, times: Sequence[datetime], series: dict[str, Sequence[float | None]], unit: str
) -> Markup:
    """Series over time as an inline SVG line chart; a gap where a value is None."""
    values = [v for vs in series.values() for v in vs if v is not None]
    parts, top = _frame(title)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    if times and values:
        t0, t1 = min(times), max(times)
        lo, hi = min(0.0, min(values)), max(values)
        ticks = [
            float(v) for v in _max_n_locator(nbins=5).tick_values(lo, hi if hi > lo else lo + 1)
        ]
        lo, hi = min(ticks[0], lo), max(ticks[-1], hi)
        seconds = max((t1 - t0).total_seconds(), 1.0)

        def x(t: datetime) -> float:
            return _LEFT + plot_w * (t - t0).total_seconds() / seconds

        def y(v: float) -> float:
            return top + plot_h * (1 - (v - lo) / (hi - lo))

        for tick in ticks:
            if lo <= tick <= hi:
                parts.append(
                    f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}"'
                    f' y2="{y(tick):.1f}" stroke="#e6e6e6"/>'
                    f'<text x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                    f"{_tick_label(tick)}</text>"
                )
        marks, fmt = _time_ticks(t0, t1)
        for mark in marks:
            half = 3.5 * len(f"{mark:{fmt}}")  # px: half the label at 12 px
            if x(mark) + half > _W - 1 or x(mark) - half < _LEFT - 20:
                continue  # its label would leave the chart
            parts.append(
                f'<line x1="{x(mark):.1f}" x2="{x(mark):.1f}" y1="{top + plot_h}"'
                f' y2="{top + plot_h + 4}" stroke="#333"/>'
                f'<text x="{x(mark):.1f}" y="{top + plot_h + 18}" text-anchor="middle">'
                f"{mark:{fmt}}</text>"
            )
        for index, values_of in enumerate(series.values()):
            colour = COLOURS[index % len(COLOURS)]
            run: list[tuple[float, float]] = []
            for t, v in [*zip(times, values_of, strict=True), (t1, None)]:
                if v is not None:
                    run.append((x(t), y(v)))
                    continue
                if len(run) > 1:
                    points = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                    parts.append(
                        f'<polyline fill="none" stroke="{colour}" stroke-width="1.2"'
                        f' points="{points}"/>'
                    )
                elif run:  # a lone value between gaps: a dot
                    parts.append(
                        f'<circle cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}" r="1.5"'
                        f' fill="{colour}"/>'
                    )
                run = []
        if len(series) > 1:
            for index, name in enumerate(series):
                lx = _LEFT + 8 + 90 * index
                parts.append(
                    f'<line x1="{lx}" x2="{lx + 16}" y1="{top + 6}" y2="{top + 6}"'
                    f' stroke="{COLOURS[index % len(COLOURS)]}" stroke-width="2"/>'
                    f'<text x="{lx + 20}" y="{top + 10}" font-size="11">{escape(name)}</text>'
                )
    # the time axis's zone, as its label under the ticks (the page's times are UTC; a chart's
    # ticks said no zone)
    zone = (min(times).tzname() if times else None) or "UTC"
    return _framed(parts, title, top, unit, x_unit=f"time ({zone})")


def _frame(title: str) -> tuple[list[str], int]:
    """A hand-drawn chart's opening: the SVG element and its title (a long one wraps and the
    chart grows to hold it); and where its plot starts."""
    title_lines = _wrap(title, TITLE_CHARS)
    top = _TOP + 16 * (len(title_lines) - 1)
    height = _H + top - _TOP
    heading = "".join(
        f'<tspan x="4" dy="{0 if i == 0 else 16}">{escape(line)}</tspan>'
        for i, line in enumerate(title_lines)
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}"'
        f' viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="12">',
        f'<text x="4" y="16" font-size="13">{heading}</text>',
    ]
    return parts, top


def _framed(parts: list[str], title: str, top: int, unit: str, x_unit: str = "") -> Markup:
    """The chart closed: its axes, their units, and the figure around it."""
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    parts.append(
        f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{top}" y2="{top + plot_h}" stroke="#333"/>'
        f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"'
        f' stroke="#333"/>'
        f'<text transform="translate(14 {top + plot_h / 2:.0f}) rotate(-90)"'
        f' text-anchor="middle">{escape(unit)}</text>'
    )
    if x_unit:
        parts.append(
            f'<text x="{_LEFT + plot_w / 2:.0f}" y="{top + plot_h + 36}"'
            f' text-anchor="middle">{escape(x_unit)}</text>'
        )
    parts.append("</svg>")
    return Markup(  # noqa: S704 - every text in it is escaped
        f'<figure class="chart" role="img" aria-label="{escape(title)}">{"".join(parts)}</figure>'
    )


def distribution(title: str, series: Mapping[str, Sequence[tuple[float, float, int]]]) -> Markup:
    """Latency distributions as step histograms on a log axis, drawn by hand like timeline:
    per series, (low µs, high µs, count) buckets in increasing order, each drawn over its own
    span as its share of the series' I/Os, down to none across the slots between buckets."""
    parts, top = _frame(title)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    shares = {
        name: [(low, high, 100 * count / (sum(c for _, _, c in buckets) or 1))
               for low, high, count in buckets]
        for name, buckets in series.items()
        if buckets
    }  # fmt: skip
    drawn = [bucket for buckets in shares.values() for bucket in buckets]
    if drawn:
        # the axis's ends on decades around every bucket; a bucket from 0 (the slot of 0 ns)
        # starts at 1 ns on a log axis
        lows = [max(low, 1e-3) for low, _, _ in drawn]
        first = math.floor(math.log10(min(lows)))
        last = max(math.ceil(math.log10(max(high for _, high, _ in drawn))), first + 1)
        # room above the highest bucket for the legend, a line a series
        peak = max(share for _, _, share in drawn) * (1 + 0.18 * len(shares))
        ticks = [float(v) for v in _max_n_locator(nbins=4).tick_values(0.0, peak)]
        hi = max(ticks[-1], peak)

        def x(value: float) -> float:
            at = (math.log10(max(value, 1e-3)) - first) / (last - first)
            return _LEFT + plot_w * at

        def y(share: float) -> float:
            return top + plot_h * (1 - share / hi)

        for tick in ticks:
            if 0 <= tick <= hi:
                parts.append(
                    f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}"'
                    f' y2="{y(tick):.1f}" stroke="#e6e6e6"/>'
                    f'<text x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                    f"{_tick_label(tick)}</text>"
                )
        decades = range(first, last + 1)
        # a label on every decade that fits 5 characters' room (36 px at 12 px), else every
        # other one
        every = 1 if plot_w / (last - first) >= 36 else 2
        for power in decades:
            at = x(10.0**power)
            parts.append(
                f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}"'
                f' stroke="#333"/>'
            )
            label = _tick_label(10.0**power)
            if (power - first) % every == 0 and at + 3.5 * len(label) <= _W - 1:
                parts.append(
                    f'<text x="{at:.1f}" y="{top + plot_h + 18}" text-anchor="middle">'
                    f"{label}</text>"
                )
        base = y(0.0)
        for index, (name, buckets) in enumerate(shares.items()):
            colour = COLOURS[index % len(COLOURS)]
            points: list[tuple[float, float]] = []
            for low, high, share in buckets:
                left, right, level = x(low), x(high), y(share)
                if not points or abs(points[-1][0] - left) > 0.05:  # a gap: down to none
                    if points:
                        points.append((points[-1][0], base))
                    points.append((left, base))
                points += [(left, level), (right, level)]
            points.append((points[-1][0], base))
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{path}"/>'
            )
            ly = top + 6 + 14 * index
            parts.append(
                f'<line x1="{_LEFT + 8}" x2="{_LEFT + 24}" y1="{ly}" y2="{ly}"'
                f' stroke="{colour}" stroke-width="2"/>'
                f'<text x="{_LEFT + 28}" y="{ly + 4}" font-size="11">{escape(name)}</text>'
            )
    return _framed(parts, title, top, "% of I/Os", "µs")
