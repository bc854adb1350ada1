"""Every figure docs/benchmarks.md states in its table is the figure its record holds: a row
names the record (`NAME.json: key`, in bench/results/) and shows the recorded value, as it was
recorded or as a percentage of a share."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.record import RESULTS, ROOT

PAGE = ROOT / "docs" / "benchmarks.md"
RECORD = re.compile(r"`([a-z_]+\.json): ([a-z0-9_%]+)`")


def _shown(value: object) -> list[str]:
    """The ways a recorded value may be written in the page."""
    forms = [str(value)]
    if isinstance(value, int) and not isinstance(value, bool):
        forms.append(f"{value:,}")
    if isinstance(value, float) and 0 <= value <= 1:
        forms.append(f"{100 * value:.1f} %")
    return forms


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in PAGE.read_text().splitlines():
        found = RECORD.search(line)
        if line.startswith("|") and found:
            rows.append((line, found.group(1), found.group(2)))
    return rows


def test_the_results_page_is_short_and_names_its_records() -> None:
    assert len(PAGE.read_text().splitlines()) <= 300
    assert len(_rows()) >= 10


def test_each_figure_is_its_records() -> None:
    wrong = []
    for line, name, key in _rows():
        record = json.loads((RESULTS / name).read_text())
        assert key in record, f"{name} has no {key}"
        figure = line.split("|")[2]
        if not any(form in figure for form in _shown(record[key])):
            wrong.append(f"{name}: {key} = {record[key]!r}, the page says {figure.strip()!r}")
    assert not wrong, "\n".join(wrong)


def test_every_command_the_page_gives_is_a_benchmark_the_harness_knows() -> None:
    from bench.harness import BENCHES

    named = set(re.findall(r"python -m bench run ([a-z_]+)", PAGE.read_text()))
    assert named
    assert named <= set(BENCHES), named - set(BENCHES)


def test_the_page_links_only_to_what_exists() -> None:
    for path in re.findall(r"`(bench/results/[\w./-]+)`", PAGE.read_text()):
        if "NAME" not in path:
            assert Path(ROOT / path).exists(), path
