"""The agent's /metrics, in Prometheus conventions: blkpilot_device_* with device and class
labels, the scheduler as an info metric, watts as gauges and joules as counters."""

from __future__ import annotations

import gzip
import queue
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent.collectors.diskstats import DiskStats
from agent.contract import __version__
from agent.contract.histograms import LATENCY_SLOTS, latency_bounds
from agent.contract.wire import TelemetryWindow

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from agent.runner import Agent, AgentView

Family = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily | HistogramMetricFamily
DEVICE = ["device", "class"]

DISK_COUNTERS: dict[str, tuple[str, Callable[[DiskStats], float]]] = {
    "reads_completed": ("Reads completed.", lambda s: s.reads),
    "writes_completed": ("Writes completed.", lambda s: s.writes),
    "read_bytes": ("Bytes read.", lambda s: s.read_sectors * 512),
    "written_bytes": ("Bytes written.", lambda s: s.write_sectors * 512),
    "io_time_seconds": ("Time with I/O in flight.", lambda s: s.io_ms / 1000),
    "io_weighted_time_seconds": ("I/O time times queue depth.", lambda s: s.weighted_ms / 1000),
}

WINDOW_GAUGES: dict[str, tuple[str, Callable[[TelemetryWindow], float]]] = {
    "iops": ("I/Os per second, last window.", lambda w: w.iops),
    "latency_seconds": ("Mean I/O latency, last window.", lambda w: w.mean_latency_us / 1e6),
    "queue_depth": ("Mean I/Os in flight, last window.", lambda w: w.queue_depth),
    "utilisation_ratio": ("Share of the last window with I/O in flight.", lambda w: w.utilisation),
    "read_ratio": ("Reads' share of I/Os, last window.", lambda w: w.read_share),
    "request_bytes": ("Mean request size, last window.", lambda w: w.mean_request_bytes),
}


def _classes(view: AgentView) -> dict[str, str]:
    devices = view.discovery.devices if view.discovery else []
    return {d.name: d.inventory.device_class.value for d in devices}


def device_families(view: AgentView) -> Iterator[Family | LatencyHistogram]:
    info = InfoMetricFamily("blkpilot_device", "What a block device is.", labels=DEVICE)
    scheduler = InfoMetricFamily(
        "blkpilot_device_scheduler", "The device's current I/O scheduler.", labels=DEVICE
    )
    holds = GaugeMetricFamily(
        "blkpilot_device_holds_data", "1 if the device holds data.", labels=DEVICE
    )
    for found in view.discovery.devices if view.discovery else []:
        inv = found.inventory
        labels = [inv.name, inv.device_class.value]
        rotational = str(int(inv.rotational))
        info.add_metric(
            labels, {"transport": inv.transport.value, "model": inv.model, "rotational": rotational}
        )
        current = inv.capabilities.current_scheduler
        scheduler.add_metric(labels, {"scheduler": current.value if current else "unknown"})
        holds.add_metric(labels, int(inv.holds_data))
    yield from (info, scheduler, holds)

    classes = _classes(view)
    for name, (help_text, counter_value) in DISK_COUNTERS.items():
        counter = CounterMetricFamily(f"blkpilot_device_{name}", help_text, labels=DEVICE)
        for device, stats in sorted(view.disks.items()):
            if device in classes:
                counter.add_metric([device, classes[device]], counter_value(stats))
        yield counter
    for name, (help_text, gauge_value) in WINDOW_GAUGES.items():
        gauge = GaugeMetricFamily(f"blkpilot_device_{name}", help_text, labels=DEVICE)
        for device, window in sorted(view.latest.items()):
            if device in classes:
                gauge.add_metric([device, classes[device]], gauge_value(window))
        yield gauge
    per_joule = GaugeMetricFamily(
        "blkpilot_device_bytes_per_joule",
        "The device's bytes over the node's energy, last window (only with a power source).",
        labels=DEVICE,
    )
    for device, window in sorted(view.latest.items()):
        if device in classes and window.energy_joules:
            moved = window.read_bytes + window.write_bytes
            per_joule.add_metric([device, classes[device]], moved / window.energy_joules)
    yield per_joule
    in_flight = GaugeMetricFamily("blkpilot_device_in_flight", "I/Os in flight.", labels=DEVICE)
    drift = GaugeMetricFamily(
        "blkpilot_device_drift", "Applied attributes changed by something else.", labels=DEVICE
    )
    for device, stats in sorted(view.disks.items()):
        if device in classes:
            in_flight.add_metric([device, classes[device]], stats.in_flight)
            drift.add_metric([device, classes[device]], len(view.drift.get(device, [])))
    yield from (in_flight, drift)
    yield from latency_families(view, classes)
    p99 = GaugeMetricFamily(
        "blkpilot_device_latency_p99_seconds",
        "Device-time p99 over reads and writes, last window (only with eBPF).",
        labels=DEVICE,
    )
    for device, window in sorted(view.latest.items()):
        value = window.percentiles_us()["p99_us"]
        if device in classes and value is not None:
            p99.add_metric([device, classes[device]], value / 1e6)
    yield p99


# Prometheus buckets: powers of two from 1.024 us to 1.07 s, where the eBPF histogram's slots
# have edges, so every bucket's count is exact
BUCKET_NS = [1 << k for k in range(10, 31)]
LATENCY_HISTOGRAMS = {
    "device_ns": (
        "blkpilot_device_io_latency_seconds",
        "Device time per I/O (issue to completion).",
    ),
    "queue_ns": ("blkpilot_device_io_queue_seconds", "Time in the scheduler (insert to issue)."),
}


@dataclass
class LatencyHistogram:
    """A family of eBPF latency histograms, per device and operation, kept as cumulative
    buckets and written to the text format directly (`text`): the scrape's largest part — 16
    devices' buckets as prometheus_client families and their exposition were 1.4 ms a scrape,
    this 0.4 (CPU time, in-process). `family()` is the same family for a registry, sample for
    sample, and `text` is that family's exposition (tests/agent/test_exporter.py compares)."""

    name: str
    documentation: str
    # (device, class, op), its cumulative buckets (with +Inf, last), the sum in seconds
    series: list[tuple[tuple[str, str, str], list[tuple[str, int]], float]] = field(
        default_factory=list
    )

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[*DEVICE, "op"])
        for labels, buckets, total in self.series:
            family.add_metric(list(labels), buckets, total)
        return family

    def text(self) -> str:
        name = self.name
        out = [f"# HELP {name} {_help(self.documentation)}\n# TYPE {name} histogram\n"]
        add = out.append
        for (device, device_class, op), buckets, total in self.series:
            # labels in name order, as the exposition sorts them: class, device, le, op
            where = f'class="{_label(device_class)}",device="{_label(device)}"'
            head, tail = f'{name}_bucket{{{where},le="', f'",op="{_label(op)}"}} '
            for bound, count in buckets:
                add(f"{head}{bound}{tail}{_value(count)}\n")
            labels = f'{{{where},op="{_label(op)}"}}'
            add(f"{name}_count{labels} {_value(buckets[-1][1])}\n")
            add(f"{name}_sum{labels} {_value(total)}\n")
        return "".join(out)


def latency_families(view: AgentView, classes: dict[str, str]) -> Iterator[LatencyHistogram]:
    """Cumulative histograms from eBPF, per device and operation (absent without eBPF)."""
    snapshot = view.latency
    if snapshot is None:
        return
    for kind, (name, help_text) in LATENCY_HISTOGRAMS.items():
        family = LatencyHistogram(name, help_text)
        merged: dict[tuple[str, str], dict[int, int]] = {}
        sums: dict[tuple[str, str], int] = {}
        for key, counts in snapshot.histograms.items():
            device, operation, found_kind, _ = key
            if found_kind != kind or device not in classes:
                continue
            into = merged.setdefault((device, operation.value), {})
            for slot, count in counts.items():
                into[slot] = into.get(slot, 0) + count
            total = sums.get((device, operation.value), 0)
            sums[(device, operation.value)] = total + snapshot.sums.get(key, 0)
        for (device, op), counts in sorted(merged.items()):
            labels = (device, classes[device], op)
            family.series.append((labels, cumulative_buckets(counts), sums[(device, op)] / 1e9))
        yield family


BUCKET_LABELS = [f"{bound / 1e9:.9g}" for bound in BUCKET_NS]


# the first Prometheus bucket each eBPF slot falls in (its upper edge at most the bucket's
# bound); len(BUCKET_NS) for slots only +Inf holds
_BUCKET_OF_SLOT = [
    next(
        (i for i, bound in enumerate(BUCKET_NS) if latency_bounds(slot)[1] <= bound), len(BUCKET_NS)
    )
    for slot in range(LATENCY_SLOTS)
]


def cumulative_buckets(counts: dict[int, int]) -> list[tuple[str, int]]:
    """Prometheus' cumulative buckets of slot counts: each slot's count added to its bucket
    (a table lookup), then summed up the buckets: no walk over the slots per bound, which was
    the exporter's main cost when it was scraped each second."""
    per_bucket = [0] * (len(BUCKET_NS) + 1)
    for slot, count in counts.items():
        per_bucket[_BUCKET_OF_SLOT[slot]] += count
    running = accumulate(per_bucket[:-1])  # the last: slots above every bound, +Inf's only
    return [*zip(BUCKET_LABELS, running, strict=True), ("+Inf", sum(counts.values()))]


def node_families(view: AgentView) -> Iterator[Family]:
    labels = ["source", "zone", "scope"]
    watts = GaugeMetricFamily("blkpilot_node_power_watts", "Power, last window.", labels=labels)
    for energy in view.node.energies if view.node else []:
        watts.add_metric([energy.source, energy.zone, energy.scope.value], energy.watts)
    joules = CounterMetricFamily(
        "blkpilot_node_energy_joules", "Energy measured since the agent started.", labels=labels
    )
    for (source, zone, scope), total in sorted(view.energy_totals.items()):
        joules.add_metric([source, zone, scope], total)
    yield from (watts, joules)
    if view.node and view.node.cpu_utilisation is not None:
        yield GaugeMetricFamily(
            "blkpilot_node_cpu_utilisation_ratio",
            "Busy share of all CPUs, last window.",
            value=view.node.cpu_utilisation,
        )
    if view.context_switches is not None:
        yield CounterMetricFamily(
            "blkpilot_node_context_switches", "Context switches.", value=view.context_switches
        )


def agent_families(agent: Agent) -> Iterator[Family]:
    view, counts = agent.view, agent.counters
    yield GaugeMetricFamily(
        "blkpilot_agent_spool_batches", "Batches waiting to be sent.", value=view.spool_batches
    )
    yield GaugeMetricFamily(
        "blkpilot_agent_spool_bytes", "Bytes waiting to be sent.", value=view.spool_bytes
    )
    yield CounterMetricFamily(
        "blkpilot_agent_windows_collected",
        "Telemetry windows collected (each is spooled before it is sent).",
        value=counts.windows_collected,
    )
    yield CounterMetricFamily(
        "blkpilot_agent_windows_sent",
        "Telemetry windows the service stored; collected minus sent is in the spool, dropped"
        " or rejected.",
        value=counts.windows_sent,
    )
    yield CounterMetricFamily(
        "blkpilot_agent_token_renewals",
        "Node tokens renewed before they expired.",
        value=counts.token_renewals,
    )
    if agent.state is not None and agent.state.token_expires_at is not None:
        yield GaugeMetricFamily(
            "blkpilot_agent_token_expiry_timestamp_seconds",
            "When the node token expires (Unix time): alert when it comes near.",
            value=agent.state.token_expires_at.timestamp(),
        )
    yield CounterMetricFamily(
        "blkpilot_agent_spool_dropped_batches", "Dropped: spool full.", value=counts.spool_dropped
    )
    yield CounterMetricFamily(
        "blkpilot_agent_spool_rejected_batches",
        "Batches the service refused as invalid.",
        value=counts.spool_rejected,
    )
    yield CounterMetricFamily(
        "blkpilot_agent_spool_write_failures",
        "Collections the spool could not write (a full or read-only disk): kept in memory.",
        value=counts.spool_write_failures,
    )
    yield CounterMetricFamily(
        "blkpilot_agent_spool_unwritten_windows_dropped",
        "Windows dropped from memory while the spool could not be written.",
        value=counts.windows_unspooled_dropped,
    )
    yield CounterMetricFamily(
        "blkpilot_agent_batches_held_for_clock",
        "Telemetry batches the service found in its future (the node's clock ahead): held and"
        " sent again as real time catches up.",
        value=counts.batches_held_for_clock,
    )
    yield GaugeMetricFamily(
        "blkpilot_agent_clock_held",
        "1 while telemetry is held because the service finds it in its future.",
        value=1.0 if view.clock_hold else 0.0,
    )
    if view.clock_offset_s is not None:
        yield GaugeMetricFamily(
            "blkpilot_agent_clock_offset_seconds",
            "This node's clock less the service's, from the Date of its last answer (whole"
            " seconds; positive: the node is ahead). Past 300 s the service refuses telemetry.",
            value=view.clock_offset_s,
        )
    if view.last_push_ok is not None:
        yield GaugeMetricFamily(
            "blkpilot_agent_last_push_success_timestamp_seconds",
            "When the spool last drained completely.",
            value=view.last_push_ok,
        )
    failures = CounterMetricFamily(
        "blkpilot_agent_action_failures",
        "Turns of the agent's loop (collect, push, policy, inventory) that raised: logged, and"
        " tried again at the next turn while the others go on.",
        labels=["action"],
    )
    for action, count in sorted(counts.action_failures.items()):
        failures.add_metric([action], count)
    yield failures
    applies = CounterMetricFamily(
        "blkpilot_agent_policy_applies", "Policy applications.", labels=["outcome"]
    )
    for outcome, count in sorted(counts.applies.items()):
        applies.add_metric([outcome], count)
    yield applies
    yield CounterMetricFamily(
        "blkpilot_agent_drift_reports", "Drift reported.", value=counts.drift_reports
    )
    ebpf = GaugeMetricFamily(
        "blkpilot_agent_ebpf_available",
        "1 if per-I/O latency is traced with eBPF (live canary, percentiles); 0 with the"
        " reason it is not.",
        labels=["reason"],
    )
    ebpf.add_metric([agent.ebpf_unavailable], 0 if agent.ebpf_unavailable else 1)
    yield ebpf
    if agent.blklat is not None and agent.blklat.available:
        yield CounterMetricFamily(
            "blkpilot_agent_ebpf_requests_untimed",
            "Requests eBPF could not time: another request in flight held their slot of its"
            " request table (about one in 131072 per other request in flight).",
            value=agent.blklat.untimed(),
        )
    duration = GaugeMetricFamily(
        "blkpilot_agent_collector_duration_seconds", "Collector's last run.", labels=["collector"]
    )
    success = GaugeMetricFamily(
        "blkpilot_agent_collector_success", "1 if its last run worked.", labels=["collector"]
    )
    for name, status in sorted(agent.collectors.status.items()):
        duration.add_metric([name], status.seconds)
        success.add_metric([name], int(status.ok))
    yield from (duration, success)
    build = InfoMetricFamily("blkpilot_agent", "The agent's version and kernel.")
    kernel = view.discovery.kernel.release if view.discovery else ""
    build.add_metric([], {"version": __version__, "kernel": kernel})
    yield build


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def parts(self) -> Iterator[Family | LatencyHistogram]:
        """What a scrape exports, in order: families, and latency histograms kept as buckets
        (the exposition writes them directly)."""
        view = self.agent.view  # one consistent snapshot for the whole scrape
        yield from device_families(view)
        yield from node_families(view)
        yield from agent_families(self.agent)

    def collect(self) -> Iterator[Family]:
        for part in self.parts():
            yield part.family() if isinstance(part, LatencyHistogram) else part


def registry_for(agent: Agent) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return registry


# gzip at level 1 for a scrape that asks for it: prometheus_client compresses at level 9, which
# took 0.8 ms a scrape of the agent's ~80 KB for a body 20 % smaller than level 1's (0.15 ms)
GZIP_LEVEL = 1
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# the exposition's type of each kind of family, and the suffix of its name
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_SUFFIXES = {"counter": "_total", "info": "_info"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")  # written as gauges of their own


# a sample's value as Go writes it (prometheus_client's own function, which it leaves untyped)
_value = cast(Callable[[float], str], floatToGoString)


def _label(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def exposition(families: Iterable[Metric | LatencyHistogram]) -> bytes:
    """Prometheus' text format 0.0.4, byte for byte as prometheus_client's generate_latest
    writes it (a test compares them on a real agent's families), in 40 % of its time (1.0
    against 2.5 ms for the 715 samples of 16 devices; a scrape cost the agent 5.8 ms in all):
    it does not check each sample's label names again (ours are fixed in this module)."""
    out: list[str] = []
    add = out.append
    for family in families:
        if isinstance(family, LatencyHistogram):
            add(family.text())
            continue
        name = family.name + _SUFFIXES.get(family.type, "")
        help_text = _help(family.documentation)
        add(f"# HELP {name} {help_text}\n# TYPE {name} {_TYPES.get(family.type, family.type)}\n")
        later: dict[str, list[str]] = {}  # OpenMetrics' own samples: gauges of their own, after
        for sample in family.samples:
            if sample.timestamp is not None:
                raise ValueError(f"{sample.name}: the agent's samples carry no timestamp")
            if sample.labels:
                labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(sample.labels.items()))
                line = f"{sample.name}{{{labels}}} {_value(sample.value)}\n"
            else:
                line = f"{sample.name} {_value(sample.value)}\n"
            suffix = sample.name[len(family.name) :]
            if suffix in _OPENMETRICS_ONLY and sample.name == family.name + suffix:
                later.setdefault(suffix, []).append(line)
            else:
                add(line)
        for suffix, lines in sorted(later.items()):
            add(f"# HELP {family.name}{suffix} {help_text}\n")
            add(f"# TYPE {family.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode()


# /metrics is served by a few long-lived threads, not a thread per request (its start was a
# third of a small scrape's CPU: 0.33-0.40 against 0.53-0.65 ms a request, measured in-process);
# a client that connects and says nothing holds its worker for REQUEST_TIMEOUT_S at most
METRICS_WORKERS = 4
REQUEST_TIMEOUT_S = 10.0


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape a second is not news


class PooledWSGIServer(WSGIServer):
    """A WSGI server whose requests are handled by METRICS_WORKERS threads started once."""

    def server_activate(self) -> None:
        super().server_activate()
        self._requests: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._workers = [
            threading.Thread(target=self._work, name=f"metrics-{n}", daemon=True)
            for n in range(METRICS_WORKERS)
        ]
        for worker in self._workers:
            worker.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._requests.put((request, client_address))

    def _work(self) -> None:
        while (item := self._requests.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # as socketserver does: said, and on to the next one
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        # (socketserver closes a server whose bind failed, before server_activate ran)
        for _ in getattr(self, "_workers", ()):
            self._requests.put(None)


# what a scrape writes: a registry's collect, or AgentCollector.parts (its latency histograms
# written directly)
Source = Callable[[], Iterable[Metric | LatencyHistogram]]


def metrics_app(source: Source) -> WSGIApplication:
    """/metrics in the text format 0.0.4 (as node_exporter serves it; Prometheus takes it
    whatever it asks for first), gzip'd at GZIP_LEVEL when the scraper accepts gzip."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b""]
        body = exposition(source())
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


def serve_metrics(address: str, port: int, source: Source) -> WSGIServer:
    """/metrics on address:port, from daemon threads (as prometheus_client's
    start_http_server, with the application above and a pool of workers); `shutdown` and
    `server_close` stop it."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]

    class Server(PooledWSGIServer):
        address_family = family

    server = make_server(address, port, metrics_app(source), Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
