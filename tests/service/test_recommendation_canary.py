"""A canary's verdict binds the recommendation it measured (issue 33 item 2): a failed canary
refutes it — no Accept, in the API or the dashboard — an inconclusive one leaves it unproven,
and either way the card shows the canary's measured gain beside the prediction, with its unit,
in the same sign convention (an improvement is positive)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.verdict import MetricRule, compare
from agent.contract.wire import CanaryVerdict, ObservationCreate, ObservationKind
from agent.contract.workloads import IOPattern
from service.observations import service as observations
from service.security import Principal, Role
from service.tables import Device, Node, RecommendationRow
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    create_recommendation,
    device_inventory,
    report_inventory,
)
from tests.models.runs import STOCK_DEFAULTS as CONFIGS
from tests.models.runs import fio_workload

P50 = MetricRule("lat_p50_us", higher_is_better=False, tolerance=0.05)
WORKLOAD = fio_workload("read-qd1", IOPattern.RANDREAD, 1)


def _recommend(
    session: Session,
    device_id: uuid.UUID,
    config: DeviceConfig,
    evidence: dict[str, object] | None = None,
) -> RecommendationRow:
    return create_recommendation(session, device_id, config, WORKLOAD.name, evidence)


def _canary(
    session: Session, device_id: uuid.UUID, config: DeviceConfig, candidate: list[float]
) -> CanaryVerdict:
    stats = compare([40.0, 41.0, 39.5, 40.5, 40.2, 39.8], candidate, P50, 0.95)
    _observe(
        session,
        device_id,
        config,
        {"lat_p50_us": stats.candidate_median},
        verdict=stats.verdict,
        statistics=stats.as_statistics(),
    )
    return stats.verdict


def _observe(
    session: Session,
    device_id: uuid.UUID,
    config: DeviceConfig,
    metrics: dict[str, float],
    *,
    verdict: CanaryVerdict | None = None,
    statistics: dict[str, float] | None = None,
) -> None:
    """A benchmark (no verdict) or a canary observation, recorded as a node records it."""
    observations.record(
        session,
        Principal(name="node:test", role=Role.OPERATOR),
        ObservationCreate(
            device_id=device_id,
            kind=ObservationKind.CANARY if verdict is not None else ObservationKind.BENCHMARK,
            tool="fio",
            workload=WORKLOAD,
            configuration=config,
            metrics=metrics,
            verdict=verdict,
            statistics=statistics or {},
            started_at=datetime.now(UTC) - timedelta(minutes=2),
            finished_at=datetime.now(UTC) - timedelta(minutes=1),
        ),
    )


def _device(session: Session) -> tuple[Node, Device]:
    node, _ = create_node(session, hostname=f"rc-{uuid.uuid4().hex[:8]}")
    (device,) = report_inventory(session, node, device_inventory("nvme0n1"))
    return node, device


def _sign_in(client: TestClient, token: str) -> None:
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    client.cookies.update(response.cookies)


def test_a_failed_canary_refutes_and_an_inconclusive_one_leaves_unproven(
    client: TestClient, session: Session
) -> None:
    _node, device = _device(session)
    kyber, deadline = CONFIGS[Scheduler.KYBER], CONFIGS[Scheduler.MQ_DEADLINE]
    refuted = _recommend(session, device.id, kyber)
    unproven = _recommend(session, device.id, deadline)
    untouched = _recommend(session, device.id, CONFIGS[Scheduler.BFQ])
    # kyber 30 % slower at the median: failed
    assert _canary(session, device.id, kyber, [52.0, 53.0, 51.5, 52.4, 52.8, 51.9]) is (
        CanaryVerdict.FAIL
    )
    # mq-deadline: as likely 8 % worse as 8 % better — inconclusive
    assert _canary(session, device.id, deadline, [37.0, 43.5, 38.0, 44.0, 36.5, 43.0]) is (
        CanaryVerdict.INCONCLUSIVE
    )
    session.commit()
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()

    def read(row: RecommendationRow) -> dict[str, Any]:
        response = client.get(f"/api/v1/recommendations/{row.id}", headers=bearer(operator))
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    found = read(refuted)
    assert (found["status"], found["standing"]) == ("refuted", "refuted")
    effect = found["canary"]["effects"]["lat_p50_us"]
    assert effect["unit"] == "µs"
    assert effect["gain"] < -0.2  # 30 % slower: a gain of about -30 %, as the prediction's sign
    assert effect["gain_low"] <= effect["gain"] <= effect["gain_high"] < 0
    assert found["predictions"]["p50_latency"]["gain"] == 0.25  # predicted 25 % better
    accepted = client.post(
        f"/api/v1/recommendations/{refuted.id}/accept",
        json={"reason": "try it anyway"},
        headers=bearer(operator),
    )
    assert accepted.status_code == 409, accepted.text

    found = read(unproven)
    assert (found["status"], found["standing"]) == ("proposed", "unproven")
    assert found["canary"]["verdict"] == "inconclusive"
    found = read(untouched)
    assert (found["status"], found["standing"], found["canary"]) == ("proposed", "predicted", None)

    # the dashboard: refuted shown as such and without its Accept form
    _sign_in(client, operator)
    page = client.get(f"/ui/devices/{device.id}").text
    assert f"/ui/recommendations/{refuted.id}/accept" not in page
    assert f"/ui/recommendations/{unproven.id}/accept" in page
    assert "Its canary failed" in page
    assert "refuted and can no longer be accepted" in page
    standings = re.findall(r'data-testid="standing"[^>]*>(\w+)<', page)
    assert sorted(standings) == ["predicted", "refuted", "unproven"]


def test_a_refuted_configuration_is_not_recommended_again_until_a_canary_passes(
    session: Session,
) -> None:
    """The nightly job's targets carry what failed its latest canary on the device, and the
    search leaves it out (models.training.score_task): the next night does not offer again
    what the device's own measurement refuted."""
    from service.recommendations import nightly

    _node, device = _device(session)
    kyber, deadline = CONFIGS[Scheduler.KYBER], CONFIGS[Scheduler.MQ_DEADLINE]
    now = datetime.now(UTC)
    assert nightly.refuted_on(session, device.id, now) == ()
    _canary(session, device.id, kyber, [52.0, 53.0, 51.5, 52.4, 52.8, 51.9])  # fail
    _canary(session, device.id, deadline, [37.0, 43.5, 38.0, 44.0, 36.5, 43.0])  # inconclusive
    assert nightly.refuted_on(session, device.id, now) == (kyber,)
    _canary(session, device.id, kyber, [40.1, 40.0, 39.9, 40.3, 40.2, 39.7])  # passes later
    assert nightly.refuted_on(session, device.id, now) == ()
    later = now + nightly.REFUTATION_MEMORY + timedelta(days=1)
    _canary(session, device.id, kyber, [52.0, 53.0, 51.5, 52.4, 52.8, 51.9])
    assert nightly.refuted_on(session, device.id, later) == ()  # forgotten after 30 days


def test_one_recommendation_reads_the_same_in_the_api_the_dashboard_the_cli_and_the_canary(
    client: TestClient, session: Session
) -> None:
    """Predicted 25 % lower p50 latency: a gain of +25.0 % (80 % interval +10 … +40) in all
    four, never -25 % in one and +25 % in another, and never the search's optimistic bound in
    place of the prediction."""
    from agent.canary_runs import ScheduledCanaryRun
    from service.cli.recommendations import gain_text
    from service.tables import ScheduledCanary

    node, device = _device(session)
    kyber = CONFIGS[Scheduler.KYBER]
    recommended = _recommend(session, device.id, kyber)
    session.add(
        ScheduledCanary(
            run_id=uuid.uuid4(), device_id=device.id, objective="p50_latency",
            workload_name=WORKLOAD.name, workload=WORKLOAD.model_dump(mode="json"),
            config=kyber.model_dump(mode="json", exclude_none=True), expected_gain=1.499,
            uncertainty=0.3, rank=1,
        )
    )  # fmt: skip
    session.commit()
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()

    api = client.get(f"/api/v1/recommendations/{recommended.id}", headers=bearer(operator))
    prediction = api.json()["predictions"]["p50_latency"]
    assert (prediction["gain"], prediction["gain_low"], prediction["gain_high"]) == (
        0.25,
        0.1,
        0.4,
    )
    assert prediction["unit"] == "µs"

    _sign_in(client, operator)
    page = client.get(f"/ui/devices/{device.id}").text
    shown = re.findall(r'data-testid="predicted-gain">([^<]+)<', page)
    assert shown == ["+25.0 %"], shown
    assert "(+10 … +40 %)" in page  # the interval labelled, as people write it

    assert gain_text(prediction) == "+25.0% (+10.0% … +40.0%)"

    (item,) = client.get(f"/api/v1/nodes/{node.id}/canaries", headers=bearer(operator)).json()
    assert item["recommendation_id"] == str(recommended.id)
    run = ScheduledCanaryRun(
        uuid.UUID(item["id"]), item["rank"], device.id, "nvme0n1", WORKLOAD, kyber,
        item["expected_gain"], {**item["prediction"], "objective": item["objective"]},
    )  # fmt: skip
    described = run.describe()
    assert "predicted gain +25.0% (+10.0% … +40.0%)" in described, described
    assert "149.9" not in described
    run = ScheduledCanaryRun(uuid.uuid4(), 2, device.id, "nvme0n1", WORKLOAD, kyber, 1.499)
    assert "optimistic bound on its gain +149.9% (UCB)" in run.describe()


def test_accepting_one_says_what_became_of_the_others(client: TestClient, session: Session) -> None:
    """Accepting one of a device's two recommendations supersedes the other, and says so: in
    the API's answer, the audit, the dashboard's message and the fleet page's counts."""
    _node, device = _device(session)
    chosen = _recommend(session, device.id, CONFIGS[Scheduler.KYBER])
    other = _recommend(session, device.id, CONFIGS[Scheduler.MQ_DEADLINE])
    session.commit()
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()
    _sign_in(client, operator)
    before = client.get("/ui/").text

    def superseded(page: str) -> int:
        counts = re.search(r'data-testid="recommendation-counts">(.*?)</p>', page, re.S)
        number = re.search(r"(\d+) superseded", counts.group(1)) if counts else None
        return int(number.group(1)) if number else 0

    superseded_before = superseded(before)
    accepted = client.post(
        f"/api/v1/recommendations/{chosen.id}/accept",
        json={"reason": "kyber for this one"},
        headers=bearer(operator),
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["superseded"] == [str(other.id)]
    found = client.get(f"/api/v1/recommendations/{other.id}", headers=bearer(operator)).json()
    assert found["status"] == "superseded"
    page = client.get("/ui/").text
    assert 'data-testid="recommendation-counts"' in page, page
    assert superseded(page) == superseded_before + 1
    assert "every device already runs" not in page


def test_a_prediction_from_a_model_without_skill_says_so(
    client: TestClient, session: Session
) -> None:
    _node, device = _device(session)
    doubt = "cross-validated R² -0.50: no skill on devices (or cells) it had not seen"
    no_skill: dict[str, object] = {
        "skill": {"r2_log": -0.5},
        "basis": "class rule",
        "doubts": [doubt],
    }
    _recommend(session, device.id, CONFIGS[Scheduler.KYBER], no_skill)
    _recommend(session, device.id, CONFIGS[Scheduler.BFQ], {"skill": {"r2_log": 0.4}})
    session.commit()
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device.id}").text
    warnings = re.findall(r'data-testid="no-skill">(.*?)</p>', page, re.S)
    assert len(warnings) == 1, warnings
    assert "R² -0.50" in warnings[0]
    # and what was recommended instead of its pick, said where the prediction is
    (basis,) = re.findall(r'data-testid="basis">(.*?)</p>', page, re.S)
    assert "best measured fixed configuration" in basis
    assert doubt in basis


def test_now_is_measured_where_the_device_was_measured(
    client: TestClient, session: Session
) -> None:
    """The card's "now" is the device's own median where it has runs of that workload under
    its current configuration, beside the model's prediction (it showed a predicted 82.8
    against 40.7 µs measured in the table below it, without saying which was which)."""
    _node, device = _device(session)
    _recommend(session, device.id, CONFIGS[Scheduler.KYBER])
    for p50 in (40.7, 39.0, 44.0):
        _observe(session, device.id, DeviceConfig(scheduler=Scheduler.NONE), {"lat_p50_us": p50})
    session.commit()
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device.id}").text
    (now,) = re.findall(r'data-testid="now">(.*?)</td>', page, re.S)
    assert "measured 40.7 µs" in now  # the median of the three runs
    assert "median of 3 runs" in now
    assert "predicted 40 µs" in now


def test_the_cli_takes_the_short_ids_it_lists_and_shows_what_the_dashboard_does(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recommendations list` shows 8 characters of each id; `show`, `accept` and `reject`
    take them (they answered 422), and `show` reads like the card, not raw JSON. The CLI's
    requests go to the real app and database in this process (TestClient's transport)."""
    import httpx
    from typer.testing import CliRunner

    from service.cli import app

    node, device = _device(session)
    recommended = _recommend(session, device.id, CONFIGS[Scheduler.KYBER])
    session.commit()
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()
    monkeypatch.setattr(httpx, "request", client.request)
    common = ["--url", "http://testserver", "--token", operator]
    runner = CliRunner()
    short = str(recommended.id)[:8]
    # piped (not a terminal), every column whole: cut to 80 columns they read "devi…"
    listed = runner.invoke(app, ["recommendations", "list", *common])
    assert listed.exit_code == 0, listed.output
    assert "predicted gain (80 % interval), + is better" in listed.output
    assert "kyber (read_lat_nsec=2000000, write_lat_nsec=10000000)" in listed.output
    assert f"{node.hostname}/nvme0n1" in listed.output  # the device by name, not an id
    # --output as kubectl has it: json (the API's, what --json gives), wide (ids whole)
    as_json = runner.invoke(app, ["recommendations", "list", "-o", "json", *common])
    assert [r["id"] for r in json.loads(as_json.output)] == [str(recommended.id)]
    assert (
        str(recommended.id)
        in runner.invoke(app, ["recommendations", "list", "--output", "wide", *common]).output
    )
    assert str(recommended.id) not in listed.output  # the table: 8 characters
    assert runner.invoke(app, ["recommendations", "list", "-o", "yaml", *common]).exit_code == 2
    shown = runner.invoke(app, ["recommendations", "show", short, *common])
    assert shown.exit_code == 0, shown.output
    assert f"recommendation {recommended.id}" in shown.output
    assert "device      nvme0n1" in shown.output
    assert "gain +25.0% (+10.0% … +40.0%)" in shown.output
    assert "40 µs -> 30 µs" in shown.output
    nothing = runner.invoke(app, ["recommendations", "show", "ffffffff", *common])
    assert nothing.exit_code == 1
    accepted = runner.invoke(
        app, ["recommendations", "accept", short, "--reason", "short id", *common]
    )
    assert accepted.exit_code == 0, accepted.output
    # accepting tries it under a canary: a one-device rollout, not a policy set at once
    assert "verifying: kyber" in accepted.output, accepted.output
    found = client.get(f"/api/v1/recommendations/{recommended.id}", headers=bearer(operator))
    assert found.json()["status"] == "verifying"
    rollout_id = found.json()["rollout_id"]
    assert f"rollout {rollout_id}" in accepted.output
    rollout = client.get(f"/api/v1/rollouts/{rollout_id}", headers=bearer(operator)).json()
    assert [t["device_id"] for t in rollout["targets"]] == [str(device.id)]
    assert rollout["canary"]["on_inconclusive"] == "roll_back"
    assert (
        client.get(f"/api/v1/devices/{device.id}/policy", headers=bearer(operator)).status_code
        == 404
    )
    # one step back: the rollout puts the device back as it found it
    reverted = runner.invoke(
        app, ["recommendations", "revert", short, "--reason", "changed my mind", *common]
    )
    assert reverted.exit_code == 0, reverted.output
    rollout = client.get(f"/api/v1/rollouts/{rollout_id}", headers=bearer(operator)).json()
    assert rollout["status"] == "rolling_back"
    found = client.get(f"/api/v1/recommendations/{recommended.id}", headers=bearer(operator))
    assert found.json()["status"] == "reverted"
    again = runner.invoke(app, ["recommendations", "revert", short, "--reason", "twice", *common])
    assert again.exit_code == 1


def test_a_canary_with_extreme_statistics_is_recorded_and_binds_without_them(
    session: Session,
) -> None:
    """Finite statistics whose ratio is not (a baseline of 1e-300): the observation is
    stored, the recommendation still refuted, and the metric left out of its effects —
    one bad row stops nothing."""
    _node, device = _device(session)
    kyber = CONFIGS[Scheduler.KYBER]
    row = _recommend(session, device.id, kyber)
    _observe(
        session,
        device.id,
        kyber,
        {"lat_p50_us": 1.0},
        verdict=CanaryVerdict.FAIL,
        statistics={
            "lat_p50_us.baseline_median": 1e-300,
            "lat_p50_us.ci_low": 1e300,
            "lat_p50_us.ci_high": 1e300,
            "lat_p50_us.relative_shift": 1.0,
        },
    )
    session.flush()
    session.refresh(row)
    assert row.status == "refuted"
    assert row.canary is not None
    assert row.canary["effects"] == {}


def test_a_canarys_gain_has_one_sign_in_the_api_the_dashboard_the_cli_and_the_evidence(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate whose p50 latency is about 30 % higher is a gain of about -30 %: the API's
    effect, the card's canary table, the page's canary history, `recommendations show` and
    the agent's printed evidence all say so, with the same sign (the page once showed +14.1 %
    in one table and -14.1 % in the other). The evidence keeps the raw shift beside it,
    labelled as such."""
    import httpx
    from typer.testing import CliRunner

    from agent.canary import CanaryResult, describe
    from service.cli import app

    _node, device = _device(session)
    kyber = CONFIGS[Scheduler.KYBER]
    row = _recommend(session, device.id, kyber)
    baseline = [40.0, 41.0, 39.5, 40.5, 40.2, 39.8]
    stats = compare(baseline, [52.0, 53.0, 51.5, 52.4, 52.8, 51.9], P50, 0.95)
    _observe(
        session,
        device.id,
        kyber,
        {"lat_p50_us": stats.candidate_median},
        verdict=stats.verdict,
        statistics=stats.as_statistics(),
    )
    session.commit()
    operator = create_api_token(session, role=Role.OPERATOR)
    session.commit()
    expected = f"{-100 * stats.relative_shift:+.1f}"
    assert expected.startswith("-")

    api = client.get(f"/api/v1/recommendations/{row.id}", headers=bearer(operator)).json()
    assert f"{100 * api['canary']['effects']['lat_p50_us']['gain']:+.1f}" == expected

    _sign_in(client, operator)
    page = client.get(f"/ui/devices/{device.id}").text
    (card,) = re.findall(r'data-testid="canary-gain">([^<]+)<', page)
    assert card == f"{expected} %"
    history = page[page.index('data-testid="canaries"') :]
    first_row = history[history.index("<td>") : history.index("</tr>", history.index("<td>"))]
    assert f">{expected} %<" in first_row, first_row

    monkeypatch.setattr(httpx, "request", client.request)
    common = ["--url", "http://testserver", "--token", operator]
    shown = CliRunner().invoke(app, ["recommendations", "show", str(row.id)[:8], *common])
    assert shown.exit_code == 0, shown.output
    assert f"measured gain {expected}%" in shown.output

    result = CanaryResult(stats.verdict, [stats], {}, rounds=6, alpha=0.05)
    (evidence,) = describe(result)
    assert evidence["gain_%"] == pytest.approx(-100 * stats.relative_shift, abs=0.01)
    assert evidence["shift_%"] == -evidence["gain_%"]  # the raw change, labelled as such


def test_the_card_leads_with_what_was_measured_and_greens_only_a_gain_it_can_claim(
    client: TestClient, session: Session
) -> None:
    """Issue 66 item 3: what was measured on the device first (benchmark medians with run
    counts), the prediction after it; a +21.9 % predicted gain whose interval is -49 … +59 %
    is not shown green; values in the units people read; workloads in words, the code name
    beside."""
    _node, device = _device(session)
    row = _recommend(session, device.id, CONFIGS[Scheduler.KYBER])
    row.predictions = {
        "iops": {
            "metric": "iops", "current": 15_110.0, "recommended": 18_420.0, "change": 0.219,
            "change_low": -0.49, "change_high": 0.59, "higher_is_better": True,
        },
        "p50_latency": {
            "metric": "lat_p50_us", "current": 1_200.0, "recommended": 1_000.0, "change": -0.2,
            "change_low": -0.3, "change_high": -0.1, "higher_is_better": False,
        },
    }  # fmt: skip
    for iops in (27_900.0, 28_100.0, 27_500.0):
        _observe(session, device.id, DeviceConfig(scheduler=Scheduler.NONE), {"iops": iops})
    _other, elsewhere = _device(session)
    create_recommendation(
        session, elsewhere.id, CONFIGS[Scheduler.KYBER], "hs23-single-randread-4k-qd1"
    )
    session.commit()
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device.id}").text
    assert page.index("Measured on this device") < page.index("Predicted by the model")
    measured = page[page.index('data-testid="measured"') : page.index("Predicted by the model")]
    assert "27.9k I/O per s" in measured
    assert "median of 3 runs" in measured
    gains = re.findall(r'<span class="(\w+)" data-testid="predicted-gain">([^<]+)<', page)
    assert gains == [("same", "+21.9 %"), ("better", "+20.0 %")]  # green only clearing zero
    assert "(\u221249 … +59 %)" in page  # true minus signs, the unit on the interval
    assert "predicted 1.2 ms" in page  # 1,200 µs
    assert "predicted 15.1k I/O per s" in page
    overview = client.get("/ui/").text
    assert "4 KiB random reads, one at a time" in overview
    other = client.get(f"/ui/devices/{elsewhere.id}").text
    assert "4 KiB random reads, one at a time" in other
    assert '<code class="muted">hs23-single-randread-4k-qd1</code>' in other


def test_the_device_page_updates_itself_while_it_waits_on_the_node(
    client: TestClient, session: Session
) -> None:
    """After an accept or a revert the page said "not yet applied" until reloaded: while a
    policy version is not applied yet, or a recommendation is under its canary, it reloads by
    itself; once the agent has reported, it stays still."""
    from agent.contract.wire import AppliedStateReport, AppliedStatus
    from service.policies import service as policies

    node, device = _device(session)
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    assert 'data-testid="auto-update"' not in client.get(f"/ui/devices/{device.id}").text
    operator = Principal(name="op", role=Role.OPERATOR)
    kyber = CONFIGS[Scheduler.KYBER]
    policies.set_policy(session, operator, device.id, kyber, "try kyber")
    session.commit()
    assert 'data-testid="auto-update"' in client.get(f"/ui/devices/{device.id}").text
    report = AppliedStateReport(policy_version=1, status=AppliedStatus.APPLIED, config=kyber)
    policies.report_applied(session, Principal(name="node", node_id=node.id), device.id, report)
    session.commit()
    assert 'data-testid="auto-update"' not in client.get(f"/ui/devices/{device.id}").text
