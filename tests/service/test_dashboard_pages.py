"""The dashboard's pages and actions through the app (the browser test covers the
recommendation flow on a demo run): sign-in, rollouts with abort, models, CSRF and roles."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.contract.tunables import Scheduler
from agent.contract.wire import CanaryVerdict, ObservationCreate, ObservationKind
from agent.contract.workloads import IOPattern
from service.dashboard import service as dashboard_service
from service.observations import service as observations
from service.rollouts import service as rollouts
from service.rollouts.schemas import RolloutCreate
from service.security import Principal, Role
from service.tables import ModelVersion, Policy, Rollout
from tests.factories import create_api_token, create_node, device_inventory, report_inventory
from tests.models.runs import STOCK_DEFAULTS as CONFIGS
from tests.models.runs import fio_workload


def _sign_in(client: TestClient, token: str) -> None:
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    client.cookies.update(response.cookies)


def _rollout(session: Session) -> uuid.UUID:
    label = uuid.uuid4().hex[:8]
    node, _ = create_node(session, hostname=f"ui-{label}", labels={"fleet": label})
    report_inventory(session, node, device_inventory("loop0"))
    body = RolloutCreate.model_validate(
        {
            "name": f"ui-{label}",
            "reason": "dashboard test",
            "config": {"scheduler": "none"},
            "target": {"node_labels": {"fleet": label}},
        }
    )
    return rollouts.create(session, Principal(name="op", role=Role.OPERATOR), body).id


def test_signed_out_pages_send_to_sign_in_and_bad_tokens_are_refused(client: TestClient) -> None:
    for path in ("/ui/", "/ui/rollouts", "/ui/models", f"/ui/devices/{uuid.uuid4()}"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"] == f"/ui/login?next={path}"
    refused = client.post("/ui/login", data={"token": "bpo_not-a-token"})
    assert refused.status_code == 401
    assert "not an operator or viewer token" in refused.text


def test_operator_aborts_a_rollout_with_the_form(client: TestClient, session: Session) -> None:
    rollout_id = _rollout(session)
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()
    _sign_in(client, operator)
    listed = client.get("/ui/rollouts")
    assert listed.status_code == 200
    assert str(rollout_id) in listed.text
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert "Abort and put every device back" in page.text
    assert "disabled" not in page.text.split("Abort and put every device back")[0][-200:]
    stale = client.post(f"/ui/rollouts/{rollout_id}/abort", data={"csrf": "forged"})
    assert stale.status_code == 403
    assert "stale" in stale.text
    csrf = client.cookies.get("blkpilot_csrf")
    assert csrf
    form = {"csrf": csrf, "reason": "not today"}
    done = client.post(f"/ui/rollouts/{rollout_id}/abort", data=form, follow_redirects=False)
    assert done.status_code == 303
    session.expire_all()
    rollout = session.get(Rollout, rollout_id)
    assert rollout is not None
    assert rollout.status == "rolling_back"
    assert "not today" in rollout.status_detail


def test_a_viewer_cannot_abort(client: TestClient, session: Session) -> None:
    rollout_id = _rollout(session)
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert 'title="needs the operator role"' in page.text
    refused = client.post(
        f"/ui/rollouts/{rollout_id}/abort", data={"csrf": client.cookies.get("blkpilot_csrf") or ""}
    )
    assert refused.status_code == 403
    assert "needs the operator role" in refused.text
    session.expire_all()
    rollout = session.get(Rollout, rollout_id)
    assert rollout is not None
    assert rollout.status == "running"


def test_models_page_shows_versions_and_scores(client: TestClient, session: Session) -> None:
    session.add(
        ModelVersion(
            run_id=uuid.uuid4(),
            device_class="nvme",
            objective="p99_latency",
            rows=120,
            cells=24,
            scores={"typical_error": 0.0731, "r2_log": 0.912, "interval_80_coverage": 0.79},
            parameters={},
        )
    )
    session.add(
        ModelVersion(
            run_id=uuid.uuid4(),
            device_class="nvme",
            objective="p50_latency",
            rows=120,
            cells=24,
            scores={"typical_error": 0.41, "r2_log": -0.5, "interval_80_coverage": 0.6},
            parameters={},
        )
    )
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get("/ui/models")
    assert page.status_code == 200
    assert "p99_latency" in page.text
    assert "0.0731" in page.text
    assert "0.912" in page.text
    # a model with no skill on held-out cells says so; one with skill does not
    rows = re.findall(r"<tr>(.*?)</tr>", page.text, re.S)
    (bad,) = [r for r in rows if "-0.5" in r]
    assert 'data-testid="no-skill"' in bad
    assert "p50_latency" in bad
    assert all('data-testid="no-skill"' not in r for r in rows if "0.912" in r)


def test_device_page_plots_every_measured_metric_and_the_canary_history(
    client: TestClient, session: Session
) -> None:
    """Benchmarks per configuration as plots for each metric measured (latency percentiles,
    IOPS, bytes per joule, fairness), and the canary with its statistics. Power needs RAPL or
    IPMI, which this machine lacks: the figures here stand in for a node that has them."""
    node, _ = create_node(session, hostname=f"ui-{uuid.uuid4().hex[:8]}")
    (device,) = report_inventory(session, node, device_inventory("nvme0n1"))
    operator = Principal(name="op", role=Role.OPERATOR)
    workload = fio_workload("mixed", IOPattern.RANDRW, 4)
    started = datetime.now(UTC) - timedelta(minutes=5)
    measured = {
        Scheduler.NONE: {
            "lat_p50_us": 80.0,
            "lat_p99_us": 900.0,
            "iops": 41_000.0,
            "bytes_per_joule": 2.1e7,
            "worst_slowdown_over_proportional": 4.2,
        },
        Scheduler.BFQ: {
            "lat_p50_us": 95.0,
            "lat_p99_us": 400.0,
            "iops": 30_000.0,
            "bytes_per_joule": 1.6e7,
            "worst_slowdown_over_proportional": 1.3,
        },
    }
    for scheduler, metrics in measured.items():
        observations.record(
            session,
            operator,
            ObservationCreate(
                device_id=device.id,
                kind=ObservationKind.BENCHMARK,
                tool="fio",
                workload=workload,
                configuration=CONFIGS[scheduler],
                metrics=metrics,
                started_at=started,
                finished_at=started + timedelta(seconds=30),
            ),
        )
    observations.record(
        session,
        operator,
        ObservationCreate(
            device_id=device.id,
            kind=ObservationKind.CANARY,
            tool="fio",
            workload=workload,
            configuration=CONFIGS[Scheduler.BFQ],
            metrics=measured[Scheduler.BFQ],
            started_at=started,
            finished_at=started + timedelta(minutes=2),
            verdict=CanaryVerdict.PASS,
            statistics={
                "rounds": 8,
                "lat_p99_us.relative_shift": -0.55,
                "lat_p99_us.p_value": 0.004,
            },
        ),
    )
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device.id}")
    assert page.status_code == 200
    charts = page.text.split('data-testid="benchmark-charts"')[1].split("</div>\n<table>")[0]
    titles = re.findall(r'<figure class="chart" role="img" aria-label="([^"]+)"', charts)
    assert [t.split(" — ")[0] for t in titles] == [
        "p50 latency",
        "p99 latency",
        "IOPS",
        "bytes per joule",
        "fairness: worst slowdown over proportional",
    ]
    assert "2.1e+07" in page.text  # bytes per joule in the table, per configuration
    assert "bfq (low_latency=1, slice_idle_us=8000)" in page.text
    history = page.text.split('data-testid="canaries"')[1].split("</table>")[0]
    assert '<span class="pill pass">pass</span>' in history
    # one sign convention on the page (issue 66): a p99 55 % lower is a gain of +55 %
    assert '<span class="better">+55.0 %</span>' in history
    assert "p=0.004" in history


def test_device_page_plots_the_ebpf_distribution(client: TestClient, session: Session) -> None:
    """Windows with eBPF distributions: percentiles over time and the merged distribution;
    a device whose windows carry diskstats means only gets neither."""
    from agent.contract.wire import TelemetryBatch
    from service.telemetry import service as telemetry
    from tests.factories import ebpf_window, telemetry_window

    node, _ = create_node(session, hostname=f"ui-{uuid.uuid4().hex[:8]}")
    traced, plain = report_inventory(
        session, node, device_inventory("nvme0n1"), device_inventory("sda")
    )
    windows = [ebpf_window("nvme0n1", index=i) for i in range(3)]
    windows += [telemetry_window("sda", index=i) for i in range(3)]
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "windows": windows})
    telemetry.ingest(session, Principal(name=node.hostname, node_id=node.id), batch)
    session.flush()
    _sign_in(client, create_api_token(session, role=Role.VIEWER))
    page = client.get(f"/ui/devices/{traced.id}").text
    assert "Latency percentiles (eBPF, device time)" in page
    assert "Latency distribution (eBPF, device time)" in page
    assert "reads (3000 I/Os)" in page
    assert "writes (750 I/Os)" in page
    page = client.get(f"/ui/devices/{plain.id}").text
    assert "Mean latency" in page
    assert "eBPF" not in page


def test_a_window_stored_with_an_impossible_date_breaks_no_page(
    client: TestClient, session: Session
) -> None:
    """Windows dated 9999 or 0001 were stored before the service refused them (the API now
    answers 422: tests/service/test_telemetry.py). The page plotted the newest windows, so
    matplotlib failed on the date and the page stayed at 500; such rows are now left out."""
    from agent.contract.wire import TelemetryBatch
    from service.tables import TelemetryWindowRow
    from service.telemetry import service as telemetry
    from tests.factories import telemetry_window

    node, _ = create_node(session, hostname=f"ui-{uuid.uuid4().hex[:8]}")
    (device,) = report_inventory(session, node, device_inventory("sda"))
    windows = [telemetry_window("sda", index=i, mean_latency_us=77.5) for i in range(3)]
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "windows": windows})
    telemetry.ingest(session, Principal(name=node.hostname, node_id=node.id), batch)
    for start in (datetime(9999, 12, 31, 12, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC)):
        session.add(  # as an older service stored them
            TelemetryWindowRow(
                device_id=device.id,
                batch_id=batch.batch_id,
                window_start=start,
                window_end=start + timedelta(seconds=10),
                read_ios=1,
                write_ios=0,
                read_bytes=4096,
                write_bytes=0,
                iops=1e6,
                read_share=1.0,
                mean_request_bytes=4096.0,
                mean_latency_us=1e9,
                queue_depth=1.0,
                utilisation=1.0,
                latency_source="diskstats",
                latency_note="",
            )
        )
    session.flush()
    _sign_in(client, create_api_token(session, role=Role.VIEWER))
    response = client.get(f"/ui/devices/{device.id}")
    assert response.status_code == 200, response.text[-500:]
    assert "Mean latency" in response.text  # the real windows are plotted


def test_the_fleet_page_counts_everything_and_lists_a_page_at_a_time(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_service, "FLEET_PAGE", 4)
    label = uuid.uuid4().hex[:6]
    for host in ("a", "b", "c"):
        node, _ = create_node(session, hostname=f"{host}-{label}")
        report_inventory(session, node, device_inventory("loop0"), device_inventory("loop1"))
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)

    def listed(page: str) -> list[str]:
        table = page.split('data-testid="devices"')[1].split("</table>")[0]
        return re.findall(r">([a-c]-\w+/loop\d)</a>", table)

    first = client.get("/ui/")
    assert first.status_code == 200
    assert "(6 present" in first.text  # the counts are the fleet's, not the page's
    assert listed(first.text) == [f"{h}-{label}/loop{i}" for h in "ab" for i in (0, 1)]
    after = re.search(r'href="/ui/\?after=([^"]+)" data-testid="next-page"', first.text)
    assert after is not None
    second = client.get(f"/ui/?after={after[1]}")
    assert listed(second.text) == [f"c-{label}/loop0", f"c-{label}/loop1"]
    assert 'data-testid="next-page"' not in second.text
    assert client.get("/ui/?after=bm90LWpzb24").status_code == 422


def test_a_change_that_rounds_to_nothing_has_no_sign() -> None:
    from service.dashboard.views import _signed_pct

    assert [_signed_pct(v) for v in (0.123, -0.0004, 0.0004, -0.02)] == [
        "+12.3",
        "±0.0",
        "±0.0",
        "-2.0",
    ]


def test_the_audit_page_lists_filters_and_pages_with_time_zones(
    client: TestClient, session: Session
) -> None:
    """A fleet-wide audit page (it was 404): newest first, filtered by action, actor or
    target, a page at a time; every timestamp says its zone."""
    from service.audit import service as audit

    operator = Principal(name=f"op-{uuid.uuid4().hex[:6]}", role=Role.OPERATOR)
    target = str(uuid.uuid4())
    for i in range(105):
        audit.record(
            session, operator, "test.event", target_type="device", target_id=target, detail=f"n{i}"
        )
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get("/ui/audit", params={"actor": operator.name}).text
    rows = re.findall(r'<tr><td class="nowrap">([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td>', page)
    assert len(rows) == 100
    assert all(at.endswith(" UTC") for at, _, _ in rows)
    assert {actor for _, actor, _ in rows} == {operator.name}
    assert ">n104<" in page  # newest first
    older = re.search(r'data-testid="older" href="([^"]+)"', page)
    assert older, page
    rest = client.get(older.group(1).replace("&amp;", "&")).text
    assert len(re.findall(r'<tr><td class="nowrap">[^<]+ UTC</td>', rest)) == 5
    assert ">n0<" in rest
    none = client.get("/ui/audit", params={"action": "no.such.action"}).text
    assert "Nothing matches" in none
    # an event without a detail says what it changed, not a Python dict; a recommendation's
    # links to its device
    device = str(uuid.uuid4())
    audit.record(
        session, operator, "api_token.created", target_type="api_token", target_id=uuid.uuid4(),
        after={"name": "night-shift", "role": "operator", "expires_at": None},
    )  # fmt: skip
    audit.record(
        session, operator, "recommendation.kept", target_type="recommendation",
        target_id=uuid.uuid4(), after={"status": "kept", "device_id": device}, detail="held",
    )  # fmt: skip
    session.commit()
    page = client.get("/ui/audit", params={"actor": operator.name}).text
    assert "name: night-shift; role: operator; expires at: None" in page
    assert "{&#39;name&#39;" not in page
    assert f'<a href="/ui/devices/{device}" title="on its device\'s page">recommendation' in page


def test_the_api_docs_use_the_services_own_assets(client: TestClient) -> None:
    """/docs and /redoc load Swagger UI and ReDoc from the service, not a CDN (blank without
    internet); the browser test renders them with every other host blocked."""
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200
        assert "cdn.jsdelivr" not in page.text
        assets = re.findall(r'(?:src|href)="(/static-offline-docs/[^"]+)"', page.text)
        assert assets, page.text
        for asset in assets:
            assert client.get(asset).status_code == 200, asset


def test_a_policy_version_the_agent_has_not_applied_is_not_shown_applied(
    client: TestClient, session: Session
) -> None:
    """After a revert (a new version), the last version the agent applied is not this one: the
    device page and the fleet page say the current version is not yet applied, and which one
    was — the browser test waited on a stale "applied" once and read the audit too early."""
    node, _ = create_node(session, hostname=f"ui-{uuid.uuid4().hex[:8]}")
    (device,) = report_inventory(session, node, device_inventory("nvme0n1"))
    policy = Policy(
        device_id=device.id, config={"scheduler": "bfq"}, version=2, set_by="op",
        reason="revert", applied_version=1, applied_status="applied",
        applied_config={"scheduler": "kyber"}, applied_at=datetime.now(UTC),
    )  # fmt: skip
    session.add(policy)
    session.flush()
    _sign_in(client, create_api_token(session, role=Role.VIEWER))
    page = client.get(f"/ui/devices/{device.id}").text
    shown = re.search(r'data-testid="policy">(.*?)</dd>', page, re.S)
    assert shown is not None
    assert '<span class="pill">not yet applied</span>' in shown.group(1)
    assert "(v1 applied)" in shown.group(1)
    policy.applied_version = 2
    session.flush()
    page = client.get(f"/ui/devices/{device.id}").text
    shown = re.search(r'data-testid="policy">(.*?)</dd>', page, re.S)
    assert shown is not None
    assert '<span class="pill applied">applied</span>' in shown.group(1)
    assert "not yet applied" not in shown.group(1)


def test_a_live_canarys_evidence_reads_a_line_each(client: TestClient, session: Session) -> None:
    """Issue 65: the dashboard shows a live canary's per-class effects, the loop and the
    data-rate rule, and what was set aside or left out and why — a line each, from the
    statistics the agent sends (agent.live_canary.live_statistics) — and counts pairs."""
    from agent.live_canary import LiveReport, live_statistics

    node, _ = create_node(session, hostname=f"ui-{uuid.uuid4().hex[:8]}")
    (device,) = report_inventory(session, node, device_inventory("nvme0n1"))
    report = LiveReport(
        pairs_used=81,
        pairs_set_aside=15,
        reasons=["too little traffic (120 I/Os in an interval)"] * 15,
        classes={
            "read 16 KiB": {"weight": 0.52, "pairs": 81, "p50_shift": -0.001, "p99_shift": 0.58},
            "write 16 KiB": {"weight": 0.44, "pairs": 58, "p50_shift": 0.022, "p99_shift": -0.026},
        },
        left_out={"write 16 KiB": 23},
        loop="open",
        fail_only=[],
    )
    started = datetime.now(UTC) - timedelta(minutes=5)
    observations.record(
        session,
        Principal(name="op", role=Role.OPERATOR),
        ObservationCreate(
            device_id=device.id,
            kind=ObservationKind.CANARY,
            tool="live",
            workload=fio_workload("live", IOPattern.RANDRW, 16),
            configuration=CONFIGS[Scheduler.BFQ],
            metrics={"lat_p50_us": 100.0},
            started_at=started,
            finished_at=started + timedelta(minutes=4),
            verdict=CanaryVerdict.FAIL,
            statistics=live_statistics(report),
        ),
    )
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device.id}").text
    history = page.split('data-testid="canaries"')[1].split("</table>")[0]
    assert "81 pairs" in history
    evidence = history.split('data-testid="live-evidence"')[1].split("</tr>")[0]
    lines = evidence.split("<br>")
    assert "open-loop application: the data-rate rule not applied" in lines[0]
    # as gains, the one sign shown everywhere: p99 58 % slower is a gain of -58 %
    assert "gain (p50 / p99; higher is better)" in lines[1]
    assert "read 16KiB (52 % of the mix): +0.1 % / -58.0 %" in lines[1]
    assert lines[1].index("read 16KiB") < lines[1].index("write 16KiB")  # by weight
    assert "pairs set aside: too little traffic 15" in lines[2]
    assert "write 16KiB in 23" in lines[3]


def test_the_overview_says_where_the_demos_tuning_is(client: TestClient, session: Session) -> None:
    """Issue 67: during the demo's first tuning the page said only "None open: the nightly job
    proposes them" for 9-14 minutes on a busy host; it now says which step and about how long
    is left (the steps left at the mean pace of those done)."""
    import time

    from service.demo import Tuning

    tuning = Tuning(steps=5, step=3, what="the nightly job: training and recommending")
    tuning.started = time.monotonic() - 120  # two steps done in two minutes
    assert tuning.said() == (
        "tuning: step 3 of 5 (the nightly job: training and recommending), about 3 minutes left"
    )
    assert Tuning(steps=5, step=1, what="benchmarking loop0").said() == (
        "tuning: step 1 of 5 (benchmarking loop0)"
    )  # no estimate before a step is done
    app = client.app
    assert isinstance(app, FastAPI)
    app.state.tuning = tuning
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get("/ui/")
    assert page.status_code == 200
    if 'data-testid="gain"' not in page.text:  # while none is open: the tuning is said
        said = page.text.split('data-testid="tuning">')[1].split("</p>")[0]
        assert "step 3 of 5" in said
        assert "about 3 minutes left" in said
    tuning.done = True
    assert 'data-testid="tuning"' not in client.get("/ui/").text
