"""The options of `blkpilot agent canary`, named: the command reads as what it takes, and each
option's help is said once, here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

CanaryDevice = Annotated[str, typer.Argument(help="e.g. nvme0n1")]

Workload = Annotated[str | None, typer.Option(help="A named workload (synthetic canary).")]

WorkloadFile = Annotated[Path | None, typer.Option(help="A workload spec as JSON.")]

Scheduler = Annotated[str | None, typer.Option(help="The candidate's scheduler.")]

Tunable = Annotated[list[str], typer.Option(help="name=value; repeatable")]

NrRequests = Annotated[int | None, typer.Option()]

ReadAheadKb = Annotated[int | None, typer.Option()]

CandidateFile = Annotated[
    Path | None, typer.Option(help="The candidate as a whole configuration (JSON).")
]

Mode = Annotated[
    str,
    typer.Option(
        help="live: the device's own traffic (eBPF, nothing written); synthetic: the"
        " workload run on the device; auto: live where the device holds data."
    ),
]

Rounds = Annotated[
    int, typer.Option(min=3, max=100, help="Synthetic: rounds before the first look.")
]

MaxRounds = Annotated[
    int | None,
    typer.Option(
        min=3,
        max=300,
        help="Synthetic: the budget; more rounds while inconclusive, up to this many"
        " (default 3 x --rounds).",
    ),
]

RoundSeconds = Annotated[
    float, typer.Option(min=0.1, max=600, help="Synthetic: seconds per sample.")
]

Pairs = Annotated[
    int, typer.Option(min=3, max=1000, help="Live: interval pairs before the first look.")
]

MaxPairs = Annotated[
    int | None,
    typer.Option(
        min=3,
        max=3000,
        help="Live: the budget; more pairs while inconclusive, up to this many"
        " (default 3 x --pairs).",
    ),
]

IntervalS = Annotated[
    float, typer.Option(min=0.05, max=60, help="Live: shortest interval, seconds.")
]

MaxInterval = Annotated[
    float,
    typer.Option(
        min=0.05,
        max=600,
        help="Live: longest interval, seconds; intervals grow to hold 200 I/Os each, and"
        " thinner traffic cannot be judged (exit 4).",
    ),
]

MaxSeconds = Annotated[
    float,
    typer.Option(
        min=10,
        max=7200,
        help="Live: the budget in time, seconds of intervals; then a last look.",
    ),
]

LoopKind = Annotated[
    str,
    typer.Option(
        help="Live: closed (the device sets the application's pace: a lower data rate"
        " fails a candidate), open (its clients do: it does not), or auto (told from the"
        " baseline's own intervals)."
    ),
]

Alpha = Annotated[float, typer.Option(min=0.001, max=0.5)]

GuardRatio = Annotated[
    float,
    typer.Option(min=1.1, help="Live: end if a candidate's p99 passes this x, twice running."),
]

SliUrl = Annotated[
    str | None,
    typer.Option(
        help="Live: the application's Prometheus endpoint; its SLI is judged beside block"
        " latency, and a regression of either fails the canary."
    ),
]

SliMetric = Annotated[
    str | None,
    typer.Option(help="Live: the SLI's counter (with --sli-per) or histogram (without)."),
]

SliPer = Annotated[
    str | None,
    typer.Option(help="Live: the SLI's denominator counter: metric / per, a mean per event."),
]

SliLabel = Annotated[
    list[str], typer.Option(help="Live: key=value selecting the SLI's series; repeatable.")
]

SliTolerance = Annotated[
    float, typer.Option(min=0.001, max=1.0, help="Live: how much worse the SLI may get.")
]

SliDecides = Annotated[
    bool,
    typer.Option(help="Live: the SLI alone is needed for a pass; block latency can still fail it."),
]

SliFile = Annotated[
    Path | None, typer.Option(help="Live: the SLI as JSON (agent.contract.sli.AppSli).")
]

ReportVerdict = Annotated[bool, typer.Option(help="Send the verdict to the service.")]

Evidence = Annotated[
    Path | None,
    typer.Option(
        help="Write what was judged to this file (JSON): each metric's samples per arm in"
        " order (a pair's or a round's), live each pair's I/O rates, and the looks — to"
        " audit a verdict or judge it again."
    ),
]
