"""The application's own SLI beside block latency: read from a Prometheus endpoint in every
live canary interval and judged with the same non-inferiority rule. On plain exposition text
first, then against a real exporter (prometheus-postgres-exporter) in front of PostgreSQL under
pgbench, on ext4 on a disk-backed loop device."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app_sli import SliReader, SliSnapshot, SliUnavailable
from agent.contract.sli import SLI_METRIC, AppSli
from agent.contract.verdict import MetricRule
from agent.contract.wire import CanaryVerdict
from agent.live_judge import LIVE_RULES, LiveSettings, decided_by, judge
from kernel.lab.devices import DataDevice, data_device
from tests.apps import Postgres, pgbench, postgres_exporter, postgres_on
from tests.proc import BLKPILOT

pytestmark = pytest.mark.timeout(900)

EXPOSITION = """\
# HELP pg_stat_wal_wal_sync WAL syncs
# TYPE pg_stat_wal_wal_sync counter
pg_stat_wal_wal_sync{server="a"} 100
pg_stat_wal_wal_sync{server="b"} 900
# HELP pg_stat_wal_wal_sync_time ms syncing WAL
# TYPE pg_stat_wal_wal_sync_time counter
pg_stat_wal_wal_sync_time{server="a"} 250.0
pg_stat_wal_wal_sync_time{server="b"} 1.0
# HELP rpc_seconds RPC latency
# TYPE rpc_seconds histogram
rpc_seconds_bucket{le="0.001"} 10
rpc_seconds_bucket{le="0.01"} 60
rpc_seconds_bucket{le="0.1"} 100
rpc_seconds_bucket{le="+Inf"} 100
rpc_seconds_sum 2.0
rpc_seconds_count 100
"""

RATIO = AppSli(
    url="http://127.0.0.1:1/metrics",
    kind="ratio",
    metric="pg_stat_wal_wal_sync_time",
    per="pg_stat_wal_wal_sync",
    labels={"server": "a"},
)


def test_a_ratio_is_the_interval_mean_per_event() -> None:
    reader = SliReader(RATIO)
    before = reader.parse(EXPOSITION)
    assert (before.numerator, before.denominator) == (250.0, 100.0)  # server "a" only
    after = SliSnapshot(numerator=400.0, denominator=150.0)
    assert reader.between(before, after) == pytest.approx(3.0)  # 150 ms over 50 syncs
    assert reader.between(before, before) is None  # nothing happened
    assert reader.between(after, before) is None  # a counter reset: the application restarted


def test_a_histogram_is_the_interval_quantile() -> None:
    spec = AppSli(url="http://x/metrics", kind="histogram", metric="rpc_seconds", quantile=0.5)
    reader = SliReader(spec)
    empty = SliSnapshot(buckets=dict.fromkeys((0.001, 0.01, 0.1, float("inf")), 0.0))
    snapshot = reader.parse(EXPOSITION)
    # rank 50 of 100 lies in (0.001, 0.01], 40 of its 50: Prometheus' histogram_quantile
    assert reader.between(empty, snapshot) == pytest.approx(0.001 + 0.009 * 40 / 50)


def test_a_missing_series_is_said() -> None:
    spec = RATIO.model_copy(update={"labels": {"server": "nowhere"}})
    with pytest.raises(SliUnavailable, match="no series pg_stat_wal_wal_sync_time"):
        SliReader(spec).parse(EXPOSITION)
    with pytest.raises(ValueError, match="names its denominator"):
        AppSli(url="http://x/metrics", kind="ratio", metric="a")


def test_an_sli_regression_fails_even_when_block_latency_holds() -> None:
    """Block latency unchanged, the application 30 % slower per commit: a fail on the SLI."""
    pairs = 12
    samples = {
        "A": {"lat_p50_us": [100.0] * pairs, "lat_p99_us": [400.0] * pairs,
              SLI_METRIC: [2.0 + 0.01 * i for i in range(pairs)]},
        "B": {"lat_p50_us": [100.5] * pairs, "lat_p99_us": [401.0] * pairs,
              SLI_METRIC: [2.6 + 0.01 * i for i in range(pairs)]},
    }  # fmt: skip
    settings = LiveSettings(sli=RATIO)
    assert settings.judged()[-1] == MetricRule(SLI_METRIC, False, 0.10)
    verdict, stats = judge(samples, settings.judged(), 0.05)
    assert verdict is CanaryVerdict.FAIL
    assert {s.metric: s.verdict for s in stats}[SLI_METRIC] is CanaryVerdict.FAIL
    assert judge(samples, LIVE_RULES, 0.05)[0] is not CanaryVerdict.FAIL  # blind without it


def _noisy_tail(pairs: int, seed: int, candidate_scale: float = 1.0) -> dict[str, list[float]]:
    """One arm's samples: block p99 that swings by a factor of e per interval (MariaDB's
    doublewrite bursts: a per-pair log-p99 spread of 0.84-1.33), a steady p50 and SLI."""
    import random

    rng = random.Random(seed)
    return {
        "lat_p50_us": [100.0 * candidate_scale * rng.uniform(0.99, 1.01) for _ in range(pairs)],
        "lat_p99_us": [4000.0 * candidate_scale * rng.lognormvariate(0, 1) for _ in range(pairs)],
        SLI_METRIC: [2.0 * rng.uniform(0.98, 1.02) for _ in range(pairs)],
    }


def test_an_sli_that_decides_passes_what_block_p99_cannot_tell() -> None:
    """An unchanged configuration whose block p99 swings too much per interval to pass at a
    10 % tolerance (inconclusive with the SLI beside it) passes where the SLI decides — and
    says it was the SLI; block latency still fails a candidate clearly past its tolerance
    (p50 1.5x), and without SLI samples block latency decides as before."""
    pairs = 40
    samples = {"A": _noisy_tail(pairs, 1), "B": _noisy_tail(pairs, 2)}
    beside = LiveSettings(sli=RATIO)
    verdict, _ = judge(samples, beside.judged(), 0.05, fail_only=beside.fail_only())
    assert verdict is CanaryVerdict.INCONCLUSIVE
    deciding = LiveSettings(sli=RATIO.model_copy(update={"decides": True}))
    fail_only = deciding.fail_only()
    assert {"lat_p50_us", "lat_p99_us", "bytes_per_s"} <= fail_only
    verdict, stats = judge(samples, deciding.judged(), 0.05, fail_only=fail_only)
    assert verdict is CanaryVerdict.PASS
    assert decided_by(verdict, stats, fail_only).startswith("decided by the application's SLI")
    slower = {"A": _noisy_tail(pairs, 1), "B": _noisy_tail(pairs, 2, candidate_scale=1.5)}
    slower["B"][SLI_METRIC] = list(slower["A"][SLI_METRIC])
    verdict, stats = judge(slower, deciding.judged(), 0.05, fail_only=fail_only)
    assert verdict is CanaryVerdict.FAIL
    assert decided_by(verdict, stats, fail_only).startswith("decided by latency")
    assert deciding.fail_only(sli_measured=False) == beside.fail_only()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DataDevice, Postgres]]:
    """PostgreSQL on ext4 on a disk-backed loop device (started once for this module)."""
    base = tmp_path_factory.mktemp("pgapp")
    with data_device(base / "pg.img", 1 << 30, base / "mnt", data_bytes=16 << 20) as device:
        (base / "mnt").chmod(0o755)
        with postgres_on(base / "mnt") as postgres:
            yield device, postgres


def test_a_live_canary_judges_pgbench_by_its_wal_sync_time(
    database: tuple[DataDevice, Postgres], tmp_path: Path
) -> None:
    """The SLI from the real exporter — milliseconds per WAL sync, the part of a commit the
    device decides — is read in every interval and judged beside block latency."""
    device, postgres = database
    with (
        pgbench(postgres, clients=4, scale=5) as progress,
        postgres_exporter(postgres, tmp_path) as url,
    ):
        sli = AppSli(
            url=url,
            kind="ratio",
            metric="pg_stat_wal_wal_sync_time",
            per="pg_stat_wal_wal_sync",
            description="ms per WAL sync",
        )
        (tmp_path / "sli.json").write_text(sli.model_dump_json())
        canary = subprocess.run(
            [
                BLKPILOT, "agent", "canary", device.name, "--mode", "live",
                "--scheduler", "mq-deadline", "--pairs", "6", "--max-pairs", "6",
                "--sli-file", str(tmp_path / "sli.json"), "--no-report",
                "--state-dir", str(tmp_path / "agent"),
            ],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert "tps" in progress.read_text()  # pgbench ran throughout
    assert canary.returncode in (0, 1, 3), canary.stdout + canary.stderr
    lines = [line for line in canary.stdout.splitlines() if line.startswith("{")]
    rows = {r["metric"]: r for r in map(json.loads, lines)}
    # block latency, the SLI, and the data rate (which can only fail a candidate) where the
    # canary judged pgbench's clients to wait on the device (a closed loop) or could not tell
    rate = "data-rate rule applied" in canary.stdout
    expected = {"lat_p50_us", "lat_p99_us", SLI_METRIC} | ({"bytes_per_s"} if rate else set())
    assert set(rows) == expected, canary.stdout
    assert 0 < rows[SLI_METRIC]["baseline"] < 1000  # ms per WAL sync: a disk's, not zero
    Path(f"/sys/block/{device.name}/queue/scheduler").write_text("none")


def test_a_node_names_its_sli_in_agent_toml(tmp_path: Path) -> None:
    """What scheduled (nightly) canaries judge on this node, per device or for every one; the
    agent role writes it per node label."""
    from agent.config import AgentConfig

    config = tmp_path / "agent.toml"
    config.write_text(
        '[sli."*"]\nurl = "http://127.0.0.1:9187/metrics"\nkind = "ratio"\n'
        'metric = "pg_stat_wal_wal_sync_time"\nper = "pg_stat_wal_wal_sync"\n'
        '[sli.nvme1n1]\nurl = "http://127.0.0.1:9000/metrics"\nkind = "histogram"\n'
        'metric = "rocksdb_get_seconds"\nquantile = 0.99\n'
    )
    loaded = AgentConfig.load(config)
    wal, gets = loaded.sli_for("sda"), loaded.sli_for("nvme1n1")
    assert wal is not None
    assert gets is not None
    assert (wal.kind, gets.kind, gets.metric) == ("ratio", "histogram", "rocksdb_get_seconds")
    assert AgentConfig().sli_for("sda") is None
