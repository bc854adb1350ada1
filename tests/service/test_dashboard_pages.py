"""The dashboard's pages and actions through the app (the browser test covers the
recommendation flow on a demo run): sign-in, rollouts with abort, models, CSRF and roles."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.rollouts import service as rollouts
from service.rollouts.schemas import RolloutCreate
from service.security import Principal, Role
from service.tables import ModelVersion, Rollout
from tests.factories import create_api_token, create_node, device_inventory, report_inventory


def _sign_in(client: TestClient, token: str) -> None:
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    client.cookies.update(response.cookies)


def _rollout(session: Session) -> uuid.UUID:
    label = uuid.uuid4().hex[:8]
    node, _ = create_node(session, hostname=f"ui-{label}", labels={"fleet": label})
    report_inventory(session, node, device_inventory("loop0"))
    body = RolloutCreate.model_validate({
        "name": f"ui-{label}", "reason": "dashboard test", "config": {"scheduler": "none"},
        "target": {"node_labels": {"fleet": label}},
    })  # fmt: skip
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
    refused = client.post(f"/ui/rollouts/{rollout_id}/abort",
                          data={"csrf": client.cookies.get("blkpilot_csrf") or ""})  # fmt: skip
    assert refused.status_code == 403
    assert "needs the operator role" in refused.text
    session.expire_all()
    rollout = session.get(Rollout, rollout_id)
    assert rollout is not None
    assert rollout.status == "running"


def test_models_page_shows_versions_and_scores(client: TestClient, session: Session) -> None:
    session.add(ModelVersion(
        run_id=uuid.uuid4(), device_class="nvme", objective="p99_latency", rows=120, cells=24,
        scores={"typical_error": 0.0731, "r2_log": 0.912, "interval_80_coverage": 0.79},
        parameters={},
    ))  # fmt: skip
    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    _sign_in(client, viewer)
    page = client.get("/ui/models")
    assert page.status_code == 200
    assert "p99_latency" in page.text
    assert "0.0731" in page.text
    assert "0.912" in page.text
