"""The nightly job end to end on a local Ray: real fio runs on two real loop devices become
observations; the job trains a model per device class and objective (stored with its data
range and held-out scores), recommends per device under guardrails with predictions per
objective, schedules canaries; an operator accepts one (it becomes the policy) and rejects
another, all audited; a second run supersedes what the first proposed."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.measure import measure
from agent.bench.report import benchmark_observation
from agent.bench.target import device_target
from agent.config import AgentConfig
from agent.contract.tunables import Scheduler
from agent.discovery import KernelFacts, describe
from agent.effects import Effects
from agent.host import HostPaths
from agent.power_sources import power_collectors
from models.priors import Objective
from service.dashboard.views import human
from service.recommendations import nightly
from service.security import Role
from service.tables import AuditEvent, ModelVersion, RecommendationRow, ScheduledCanary
from tests.agent.conftest import LoopFactory
from tests.factories import bearer, create_api_token, create_node, report_inventory
from tests.models.runs import STOCK_DEFAULTS, WORKLOADS

CONFIGS = [STOCK_DEFAULTS[s] for s in (Scheduler.NONE, Scheduler.MQ_DEADLINE, Scheduler.BFQ)]
# no power source measures on this machine: energy is known only as estimated from CPU time,
# and is learned as an objective of its own (never as measured joules)
OBJECTIVES = ("p50_latency", "p99_latency", "iops", "energy_estimated")


@pytest.mark.timeout(600)
def test_nightly_trains_recommends_schedules_and_an_operator_decides(
    client: TestClient, session: Session, loop_device: LoopFactory, tmp_path: Path
) -> None:
    paths = HostPaths()
    kernel = KernelFacts.of(paths)
    names = [loop_device(on="tmpfs", size_mb=64), loop_device(on="disk", size_mb=64)]
    node, node_token = create_node(session)
    devices = report_inventory(
        session, node, *(describe(paths, n, kernel, Effects()).inventory for n in names)
    )
    applier = Applier(paths, tmp_path / "agent")
    meter = EnergyMeter(power_collectors(AgentConfig()))
    for name, device in zip(names, devices, strict=True):
        target = device_target(paths, name)
        for config in CONFIGS:
            changed = config.scheduler is not Scheduler.NONE
            if changed:
                applier.apply(name, config)
            for workload in WORKLOADS:
                measured = measure(workload, target, workdir=tmp_path / "bench", meter=meter)
                body = benchmark_observation(device.id, measured, config).model_dump(mode="json")
                response = client.post(
                    "/api/v1/observations", json=body, headers=bearer(node_token)
                )
                assert response.status_code == 201, response.text
            if changed:
                applier.rollback(name)

    report = nightly.run(session, ray_address=None, max_canaries=1)
    assert "local Ray" in report.where
    assert report.samples == len(names) * len(CONFIGS) * len(WORKLOADS)
    # loop devices are one class (virtual); p50, p99, IOPS and estimated energy have data,
    # fairness and measured energy not
    versions = session.scalars(select(ModelVersion).where(ModelVersion.run_id == report.run_id))
    by_objective = {v.objective: v for v in versions}
    assert set(by_objective) == set(OBJECTIVES)
    p50 = by_objective["p50_latency"]
    assert p50.device_class == devices[0].device_class
    assert p50.rows == report.samples
    assert p50.cells == len(names) * len(WORKLOADS)
    assert p50.data_from is not None
    assert p50.data_until is not None
    assert p50.data_from < p50.data_until
    assert p50.scores["folds"] == 3
    assert 0 <= p50.scores["interval_80_coverage"] <= 1
    assert 0 <= p50.scores["interval_80_coverage_uncalibrated"] <= 1

    recs = session.scalars(
        select(RecommendationRow).where(RecommendationRow.status == "proposed")
    ).all()
    # one recommendation per device and configuration, listing every objective it is best for
    served = [(r.device_id, o) for r in recs for o in r.objectives]
    assert sorted(served) == sorted((d.id, o) for d in devices for o in OBJECTIVES)
    for device in devices:
        mine = [r for r in recs if r.device_id == device.id]
        configs = [json.dumps(r.recommended_config, sort_keys=True) for r in mine]
        assert len(set(configs)) == len(configs)
    for rec in recs:
        assert rec.objective == rec.objectives[0]
        assert set(rec.evidence["agreement"]) == set(rec.objectives)
        assert rec.evidence["intervals"]["claimed"] == 0.8
        assert set(rec.predictions) == set(OBJECTIVES)
        # the share of the ensemble's members ranking the pick first: 0 is a real answer
        # (noisy loop-device data, the pick the current configuration for want of evidence, while
        # each member prefers some other one: a CI run on a busy host had it)
        assert 0 <= rec.confidence <= 1
        assert rec.evidence["agreement"][rec.objective] == round(rec.confidence, 3)
        assert rec.reason
        assert "most observed workload" in rec.workload_basis
        assert rec.current_config == {"scheduler": "none", "scheduler_tunables": {}}
        prediction = rec.predictions[rec.objective]
        assert prediction["change_low"] <= prediction["change_high"]
    canaries = session.scalars(
        select(ScheduledCanary).where(ScheduledCanary.run_id == report.run_id)
    ).all()
    assert len(canaries) <= 1  # max_canaries
    assert all(c.status == "scheduled" and c.expected_gain >= 0.02 for c in canaries)

    # the API: an operator reads and decides
    operator = bearer(create_api_token(session, role=Role.OPERATOR))
    viewer = bearer(create_api_token(session, role=Role.VIEWER))
    listed = client.get(
        "/api/v1/recommendations",
        params={"device_id": str(devices[0].id), "status": "proposed"},
        headers=viewer,
    ).json()
    assert 1 <= len(listed) <= len(OBJECTIVES)
    assert sorted(o for r in listed for o in r["objectives"]) == sorted(OBJECTIVES)
    chosen = next(r for r in listed if "p50_latency" in r["objectives"])
    # the dashboard says what agreement is and what the intervals covered; the number in the
    # text and in the table is the same
    session.commit()
    ui = TestClient(client.app)
    token = viewer["Authorization"].removeprefix("Bearer ")
    signed = ui.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert signed.status_code == 303
    page = ui.get(f"/ui/devices/{devices[0].id}", cookies=dict(signed.cookies)).text
    assert "rank it first" in page
    assert "not the chance that it helps" in page
    assert "Intervals calibrated to hold 80 %" in page or "ensemble&#39;s spread alone" in page
    assert " + ".join(chosen["objectives"]) in page
    shown = chosen["predictions"][chosen["objective"]]["recommended"]
    assert f"({shown:.4g}," in chosen["reason"]
    unit = chosen["predictions"][chosen["objective"]]["unit"]
    assert unit  # µs, I/O per s, J: every figure has its unit
    assert f"predicted {human(shown, unit)}" in page  # in the units people read
    assert chosen["evidence"]["device_facts"]["qd1_read_us"] > 0
    assert (
        client.post(
            f"/api/v1/recommendations/{chosen['id']}/accept", json={"reason": "ok"}, headers=viewer
        ).status_code
        == 403
    )
    assert (
        client.post(
            f"/api/v1/recommendations/{chosen['id']}/accept", json={"reason": ""}, headers=operator
        ).status_code
        == 422
    )
    accepted = client.post(
        f"/api/v1/recommendations/{chosen['id']}/accept",
        # pinned at once, as an explicit choice (a plain accept tries it under a canary first:
        # tests/service/test_rollout_engine.py)
        json={"reason": "night shift agrees", "without_canary": True},
        headers=operator,
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["status"] == "applied"
    policy = client.get(f"/api/v1/devices/{devices[0].id}/policy", headers=viewer).json()
    assert policy["config"]["scheduler"] == chosen["recommended_config"]["scheduler"]
    assert chosen["id"] in policy["reason"]
    # the device's other proposals were made against a configuration it no longer has
    others = client.get(
        "/api/v1/recommendations", params={"device_id": str(devices[0].id)}, headers=viewer
    ).json()
    rest = [r for r in others if r["id"] != chosen["id"]]
    assert len(rest) == len(listed) - 1  # (none, when one change served every objective)
    assert all(r["status"] == "superseded" for r in rest)
    again = client.post(
        f"/api/v1/recommendations/{chosen['id']}/accept", json={"reason": "twice"}, headers=operator
    )
    assert again.status_code == 409

    other = client.get(
        "/api/v1/recommendations",
        params={"device_id": str(devices[1].id), "objective": "iops"},
        headers=viewer,
    ).json()[0]
    rejected = client.post(
        f"/api/v1/recommendations/{other['id']}/reject",
        json={"reason": "not on this box"},
        headers=operator,
    )
    assert rejected.json()["status"] == "rejected"
    actions = session.scalars(select(AuditEvent.action)).all()
    assert {
        "nightly.run",
        "policy.set",
        "recommendation.applied",
        "recommendation.rejected",
    } <= set(actions)
    versions_api = client.get(
        "/api/v1/model-versions", params={"run_id": str(report.run_id)}, headers=viewer
    ).json()
    assert {v["objective"] for v in versions_api} == set(OBJECTIVES)

    # a second run, in this process (`blkpilot nightly --local`: where Ray cannot start): the
    # device with a policy is scored from it; proposals are superseded
    second = nightly.run(
        session,
        objectives=[Objective.P50, Objective.IOPS],
        window=timedelta(hours=1),
        mix={Objective.P50: 3, Objective.IOPS: 1},
        local=True,
    )
    assert "without Ray" in second.where
    mixed = session.scalars(
        select(RecommendationRow).where(
            RecommendationRow.objectives.contains(["mix"]),
            RecommendationRow.status == "proposed",
        )
    ).all()
    assert {r.device_id for r in mixed} == {d.id for d in devices}
    assert all(r.evidence["mix"] == "mix(iops=0.25,p50_latency=0.75)" for r in mixed)
    assert second.run_id != report.run_id
    statuses = sorted(
        r.status
        for r in session.scalars(
            select(RecommendationRow).where(
                RecommendationRow.device_id == devices[1].id,
                RecommendationRow.objectives.contains(["p50_latency"]),
            )
        )
    )
    # the first run's is superseded — or stays rejected, if the iops change rejected above
    # was the same change for p50
    assert statuses in (["proposed", "superseded"], ["proposed", "rejected"])
    fresh = session.scalars(
        select(RecommendationRow).where(
            RecommendationRow.device_id == devices[0].id,
            RecommendationRow.status == "proposed",
            RecommendationRow.objectives.contains(["p50_latency"]),
        )
    ).one()
    assert fresh.current_config is not None
    assert fresh.current_config["scheduler"] == chosen["recommended_config"]["scheduler"]
