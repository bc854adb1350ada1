"""Grafana dashboards and Prometheus rules stay honest: every blkpilot metric any query names is
one the exporters really emit — the service's /metrics after real requests, and a real agent's
/metrics after it collected from a loop device and pushed to a real service — and Prometheus'
own promtool accepts the scrape configuration and the rules, and the alerts' unit tests pass."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import AgentConfig, PowerConfig
from agent.exporter import registry_for
from agent.runner import Agent
from service.security import Role
from tests.agent.conftest import enroll_lab_node
from tests.conftest import LoopFactory
from tests.factories import bearer, create_api_token, create_node, telemetry_window
from tests.proc import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"
PROMETHEUS = DASHBOARDS / "prometheus"
NAME = re.compile(r"\bblkpilot_[a-zA-Z0-9_:]*")
SUFFIXES = {
    "counter": ("_total",),
    "info": ("_info",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
    "unknown": ("",),
}


def _queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every Grafana target and variable, and every alerting rule."""
    for path in sorted((DASHBOARDS / "grafana").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name}: {panel['title']}", target["expr"]
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                yield f"{path.name}: ${variable['name']}", variable["definition"]
    for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            yield f"alerts.yml: {rule['alert']}", rule["expr"]


def _emitted(exposition: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


@pytest.fixture
def service_exposition(client: TestClient, session: object) -> str:
    """The service's /metrics after ingest (accepted, duplicate, rejected) and API traffic."""
    from sqlalchemy.orm import Session

    assert isinstance(session, Session)
    operator = create_api_token(session, role=Role.OPERATOR)
    _, node_token = create_node(session, hostname=f"metrics-{uuid.uuid4().hex[:6]}")
    session.commit()
    batch = {"batch_id": str(uuid.uuid4()), "windows": [telemetry_window("loop0")]}
    headers = bearer(node_token)
    assert client.post("/api/v1/telemetry/batches", json=batch, headers=headers).status_code < 500
    client.post("/api/v1/telemetry/batches", json=batch, headers=headers)  # a duplicate
    bad = {"batch_id": str(uuid.uuid4()), "windows": [telemetry_window(iops=-1)]}
    assert client.post("/api/v1/telemetry/batches", json=bad, headers=headers).status_code == 422
    assert client.get("/api/v1/devices", headers=bearer(operator)).status_code == 200
    response = client.get("/metrics")
    assert response.status_code == 200
    return str(response.text)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_metric_in_a_query_is_emitted(
    service_exposition: str, service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device(on="tmpfs")
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    meter = tmp_path / "meter.csv"
    meter.write_text("timestamp,watts\n")
    config = AgentConfig(
        devices=[device],
        interval_s=0.2,
        push_interval_s=0.4,
        metrics_port=0,
        power=PowerConfig(rapl=False, hwmon=False, ipmi=False, meter_csv=meter),
    )
    agent = Agent(config, node, state_dir)
    agent.start()
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        with meter.open("a") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S+00:00', time.gmtime())},120\n")
        subprocess.run(
            ["dd", f"if=/dev/{device}", "of=/dev/null", "bs=4k", "count=500", "iflag=direct"],
            check=True,
            capture_output=True,
        )
        time.sleep(min(agent.step(), 0.05))
    agent.push()
    emitted = _emitted(service_exposition) | _emitted(generate_latest(registry_for(agent)).decode())
    queries = list(_queries())
    assert len(queries) > 25  # the dashboards and rules were found
    missing = {
        f"{where}: {name}"
        for where, expr in queries
        for name in NAME.findall(expr)
        if name not in emitted
    }
    assert not missing, sorted(missing)


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found is not None, "promtool comes with Debian's prometheus package (make test)"
    return found


def test_promtool_accepts_the_scrape_configuration_and_rules() -> None:
    checked = subprocess.run(
        [_promtool(), "check", "config", str(PROMETHEUS / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr


def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    tested = subprocess.run(
        [_promtool(), "test", "rules", str(PROMETHEUS / "alerts_test.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_grafana_dashboards_are_well_formed() -> None:
    for path in sorted((DASHBOARDS / "grafana").glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"], path.name
        assert board["title"].startswith("blkpilot")
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for panel in board["panels"]:
            assert panel["targets"], f"{path.name}: {panel['title']} has no query"
            assert panel["datasource"]["uid"] == "${datasource}"
