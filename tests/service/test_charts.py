"""The dashboard's hand-drawn charts (timelines, latency distributions): what they draw follows
the data."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from service.dashboard import charts

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def _svg(markup: str) -> ET.Element:
    # our own output, not untrusted input
    return ET.fromstring(markup[markup.index("<svg") : markup.rindex("</svg>") + 6])  # noqa: S314


def test_a_gap_splits_the_line_and_points_stay_inside_the_plot() -> None:
    times = [T0 + timedelta(seconds=10 * i) for i in range(10)]
    values: list[float | None] = [1.0, 2.0, 3.0, None, None, 5.0, 8.0, 2.0, None, 4.0]
    svg = _svg(charts.timeline("Mean latency", times, {"latency": values}, "µs"))
    lines = svg.findall(f"{SVG}polyline")
    assert [len(line.get("points", "").split()) for line in lines] == [3, 3]
    assert len(svg.findall(f"{SVG}circle")) == 1  # the lone last value
    ys = [float(p.split(",")[1]) for line in lines for p in line.get("points", "").split()]
    # larger values are drawn higher (smaller y), all within the plot area
    assert ys[1] < ys[0]
    assert ys[4] < ys[3]
    assert all(0 < y < float(svg.get("height", "0")) for y in ys)


def test_the_time_axis_names_its_zone() -> None:
    """Issue 67: the page said UTC and the charts' ticks said nothing."""
    times = [T0 + timedelta(minutes=10 * i) for i in range(10)]
    svg = _svg(charts.timeline("IOPS", times, {"iops": [float(i) for i in range(10)]}, "/s"))
    assert "time (UTC)" in [t.text for t in svg.iter(f"{SVG}text")]


def test_two_series_get_a_legend_and_text_is_escaped() -> None:
    times = [T0 + timedelta(hours=i) for i in range(48)]
    markup = charts.timeline(
        "p99 <script>", times, {"p50": [1.0] * 48, "p99 & more": [3.0] * 48}, "µs"
    )
    assert "<script>" not in markup
    assert "&lt;script&gt;" in markup
    svg = _svg(markup)
    texts = ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]
    assert "p50" in texts
    assert "p99 & more" in texts
    # two days: the ticks carry the date
    assert any(t and re.fullmatch(r"11-2\d \d\d:\d\d", t) for t in texts)


def test_no_data_still_draws_an_empty_frame() -> None:
    svg = _svg(charts.timeline("IOPS", [], {"IOPS": []}, "I/O per s"))
    assert svg.findall(f"{SVG}polyline") == []
    assert "IOPS" in ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]


def test_long_text_is_wrapped_to_the_width_the_chart_is_shown_at() -> None:
    """Charts are drawn at a dashboard card's width (346 px): a configuration's label breaks
    at its spaces, commas and slashes; a long title takes a second line and the chart grows
    to hold it; axis ticks stay short. tests/test_dashboard_browser.py measures the rendered
    text in Chromium."""
    label = "bfq (low_latency=1, slice_idle_us=8000)/interrupt"
    lines = charts._wrap(label, charts.LABEL_CHARS)
    assert lines == ["bfq (low_latency=1,", "slice_idle_us=8000)/", "interrupt"]
    assert "".join(lines) == label.replace(", ", ",")  # nothing lost but the space at a break
    assert charts._wrap("x" * 30, 10) == ["x" * 30]  # one word: its own line, not cut
    short = _svg(charts.timeline("IOPS", [T0], {"IOPS": [1.0]}, "I/O per s"))
    long = _svg(charts.timeline("Hourly history (rollups, kept past the raw windows)", [T0],
                                {"x": [1.0]}, "µs"))  # fmt: skip
    assert short.get("width") == long.get("width") == str(round(charts.WIDTH_IN * 96))
    assert float(long.get("height", 0)) > float(short.get("height", 0))
    (title,) = [t for t in long.iter(f"{SVG}text") if t.find(f"{SVG}tspan") is not None]
    assert [len(s.text or "") <= charts.TITLE_CHARS for s in title] == [True, True]
    assert [charts._tick_label(v) for v in (2000, 125_000, 1.5e6)] == ["2000", "125k", "1.5M"]
    many = "bfq (back_seek_max=16384, back_seek_penalty=2, fifo_expire_async=250, low_latency=1)"
    assert charts._label_lines(many) == ["bfq", "(back_seek_max=16384,", "… 3 more tunables"]


def test_a_distribution_is_drawn_on_a_log_axis_bucket_by_bucket() -> None:
    """The eBPF latency distribution, drawn by hand (matplotlib took 130 ms of CPU of a
    device page for it): each bucket over its own span as its share of the series' I/Os, higher
    shares higher, equal distances a decade, down to none across a gap between buckets; a
    legend line a series, its text escaped; nothing drawn outside the chart."""
    series = {
        "reads (30 I/Os)": [(10.0, 12.0, 10), (12.0, 14.0, 20)],  # 33 % and 67 %
        "writes <b> (4 I/Os)": [(100.0, 120.0, 1), (1000.0, 1200.0, 3)],  # a gap between
    }
    markup = charts.distribution("Latency distribution (eBPF, device time)", series)
    assert "<b>" not in markup
    svg = _svg(markup)
    reads, writes = (
        [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
        for line in svg.findall(f"{SVG}polyline")
    )
    base = max(y for _, y in reads)
    assert reads[0][1] == reads[-1][1] == base  # from none, back to none
    (low1, y1), (high1, _), (low2, y2), (high2, _) = reads[1:5]
    assert low1 < high1 == low2 < high2  # adjacent buckets: no drop between them
    assert y2 < y1 < base  # 67 % above 33 %
    # a decade is as wide at 10 µs as at 100: log10(12/10) and log10(120/100) alike
    (w_low, _), (w_high, _) = writes[1:3]
    assert w_high - w_low == pytest.approx(high1 - low1, abs=0.2)
    assert any(y == base for _, y in writes[3:-3])  # down to none across 120-1000 µs
    texts = {"".join(t.itertext()) for t in svg.iter(f"{SVG}text")}
    assert {"reads (30 I/Os)", "writes <b> (4 I/Os)", "µs", "% of I/Os", "10", "100"} <= texts
    width = float(svg.get("width", "0"))
    xs = [float(t.get("x", "0")) for t in svg.iter(f"{SVG}text") if t.get("x")]
    points = [x for line in (reads, writes) for x, _ in line]
    assert all(0 <= x <= width for x in xs + points)
    empty = _svg(charts.distribution("Latency distribution", {}))
    assert empty.findall(f"{SVG}polyline") == []
