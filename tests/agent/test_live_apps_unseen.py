"""The live canary on two applications it was not tuned on (issue 65): MariaDB's InnoDB
under sysbench's paced read-write load (16 KiB pages, a redo log, a doublewrite buffer; its
own mix moves between intervals by a total variation of ~0.5, and the canary used to set
most pairs aside and decide nothing) and Redis appending every SET to its append-only file
with an fsync while a backup reads the volume. An unchanged configuration is not failed; a
regression each application feels (bfq idling 100 ms on each queue, strictly: MariaDB's p99
+58 %, Redis's 30x) is not passed. The rates — A/A passes, detections, time to a verdict —
are bench.live_apps'; here, the direction."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from kernel.lab.devices import DataDevice, data_device
from tests.apps import mariadb_on, mariadb_sli, mysqld_exporter, redis_on
from tests.proc import BLKPILOT

pytestmark = pytest.mark.timeout(900)

VERDICTS = {0: "pass", 1: "fail", 3: "inconclusive", 4: "could not run"}
BFQ_IDLE = ["--scheduler", "bfq", "--tunable", "slice_idle_us=100000", "--tunable",
            "strict_guarantees=1"]  # fmt: skip


# a device, the application on it, and what the canary is told of it (its SLI)
Served = tuple[DataDevice, Any, tuple[str, ...]]


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("maria")
    with (
        data_device(base / "maria.img", 1 << 30, base / "mnt", data_bytes=16 << 20) as device,
        mariadb_on(base / "mnt", warm_s=5) as database,
        mysqld_exporter(database, base) as url,
    ):
        sli = base / "sli.json"
        sli.write_text(mariadb_sli(url).model_dump_json())
        yield device, database, ("--sli-file", str(sli))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("redis")
    with (
        data_device(base / "redis.img", 512 << 20, base / "mnt", data_bytes=128 << 20) as device,
        redis_on(base / "mnt", backup=device.data_file) as server,
    ):
        yield device, server, ()


def _canary(
    device: DataDevice,
    traffic: AbstractContextManager[Any],
    candidate: list[str],
    tmp_path: Path,
    extra: tuple[str, ...] = (),
) -> tuple[str, str, dict[str, Any]]:
    evidence = tmp_path / "evidence.json"
    with traffic:
        done = subprocess.run(
            [BLKPILOT, "agent", "canary", device.name, "--mode", "live", *candidate, *extra,
             "--max-seconds", "120", "--no-report", "--state-dir", str(tmp_path / "agent"),
             "--evidence", str(evidence)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    queue = Path(f"/sys/block/{device.name}/queue/scheduler")
    queue.write_text("none")  # a pass keeps the candidate
    verdict = VERDICTS.get(done.returncode, f"exit {done.returncode}")
    return verdict, done.stdout + done.stderr, json.loads(evidence.read_text())


@pytest.mark.parametrize(
    ("app", "candidate", "allowed"),
    [
        ("mariadb", ["--scheduler", "none"], {"pass", "inconclusive"}),
        ("mariadb", BFQ_IDLE, {"fail", "inconclusive"}),
        ("redis", ["--scheduler", "none"], {"pass", "inconclusive"}),
        ("redis", BFQ_IDLE, {"fail", "inconclusive"}),
    ],
    ids=["mariadb-a-a", "mariadb-bfq-idle", "redis-a-a", "redis-bfq-idle"],
)
def test_an_unseen_application_is_judged_in_the_right_direction(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    app: str,
    candidate: list[str],
    allowed: set[str],
) -> None:
    device, server, extra = request.getfixturevalue(app)
    verdict, output, evidence = _canary(device, server.traffic(), candidate, tmp_path, extra)
    assert verdict in allowed, output
    if extra and not evidence["guard_tripped"]:  # MariaDB: every query's time decides
        assert evidence["samples"]["A"].get("app_sli"), evidence["samples"]["A"].keys()
        assert {"lat_p50_us", "lat_p99_us"} <= set(evidence["fail_only"]), evidence["fail_only"]
    notes = evidence["notes"]
    # the verdict names its rule first, and says which data-rate rule held and why
    assert notes[0].startswith(("decided by", "undecided")), notes
    if not evidence["guard_tripped"]:
        assert any(n.startswith("data-rate rule") for n in notes), notes
        # compared under the baseline's mix, class by class: most pairs are judged, not
        # set aside as "traffic mix shifted" (77-91 % of them were on MariaDB)
        assert evidence["reference_mix"], evidence
        assert evidence["pairs_set_aside"] <= len(evidence["rates"]["A"]), output
        assert not any("mix shifted" in why for why in evidence["set_aside_because"])
        assert "verdict:" in output
        assert " pairs (" in output
