from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.security import Role
from service.tables import AuditEvent, Device, Node, Policy
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    device_inventory,
    report_inventory,
)


def _url(device: Device) -> str:
    return f"/api/v1/devices/{device.id}/policy"


def _set(config: dict[str, Any], reason: str = "bfq for the interactive tier") -> dict[str, Any]:
    return {"config": config, "reason": reason}


def _setup(session: Session, **device: Any) -> tuple[Node, str, Device, str]:
    node, node_token = create_node(session)
    (dev,) = report_inventory(session, node, device_inventory("loop0", **device))
    operator = create_api_token(session, role=Role.OPERATOR)
    return node, node_token, dev, operator


def _count(session: Session, table: Any) -> int:
    return session.scalar(select(func.count()).select_from(table)) or 0


class TestSetPolicy:
    def test_operator_sets_and_updates_with_audit(
        self, client: TestClient, session: Session
    ) -> None:
        _, _, device, operator = _setup(session)
        first = client.put(
            _url(device),
            json=_set(
                {"scheduler": "bfq", "scheduler_tunables": {"slice_idle_us": 0, "low_latency": 1}}
            ),
            headers=bearer(operator),
        )
        assert first.status_code == 200, first.text
        assert first.json()["version"] == 1
        assert first.json()["in_sync"] is False
        second = client.put(
            _url(device), json=_set({"scheduler": "none"}, "back to none"), headers=bearer(operator)
        )
        assert second.json()["version"] == 2
        assert second.json()["set_by"].startswith("token:")
        events = client.get(
            "/api/v1/audit",
            params={"target_id": str(device.id), "action": "policy.set"},
            headers=bearer(operator),
        ).json()
        assert [e["after"]["version"] for e in events] == [2, 1]
        assert events[0]["before"]["config"]["scheduler"] == "bfq"
        assert events[0]["detail"] == "back to none"

    def test_viewer_and_node_are_403(self, client: TestClient, session: Session) -> None:
        _, node_token, device, _ = _setup(session)
        viewer = create_api_token(session, role=Role.VIEWER)
        for token in (viewer, node_token):
            response = client.put(
                _url(device), json=_set({"scheduler": "none"}), headers=bearer(token)
            )
            assert response.status_code == 403
        assert _count(session, Policy) == 0

    def test_scheduler_the_device_lacks_is_refused_and_nothing_changes(
        self, client: TestClient, session: Session
    ) -> None:
        _, _, device, operator = _setup(session)
        audit_before = _count(session, AuditEvent)
        response = client.put(
            _url(device), json=_set({"scheduler": "fios"}), headers=bearer(operator)
        )
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["body", "config", "scheduler"]
        assert "does not offer fios" in response.json()["detail"]
        assert _count(session, Policy) == 0
        assert _count(session, AuditEvent) == audit_before

    @pytest.mark.parametrize(
        "config",
        [
            {},  # a version that asks for nothing
            {"nr_requests": "64"},  # a string where a number belongs
            {"nr_requests": True},
            {"scheduler": "bfq", "scheduler_tunables": {"low_latency": "0"}},
            {"read_ahead_kb": 128.0},
        ],
    )
    def test_lax_or_empty_configurations_are_422(
        self, client: TestClient, session: Session, config: dict[str, Any]
    ) -> None:
        """These were stored (and an empty one created a version an agent refuses)."""
        _, _, device, operator = _setup(session)
        response = client.put(_url(device), json=_set(config), headers=bearer(operator))
        assert response.status_code == 422, response.text
        assert response.json()["fields"][0]["loc"][:2] == ["body", "config"]
        assert _count(session, Policy) == 0

    def test_tunable_off_the_allow_list_is_422(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session)
        response = client.put(
            _url(device),
            json=_set({"scheduler": "mq-deadline", "scheduler_tunables": {"slice_idle_us": 0}}),
            headers=bearer(operator),
        )
        assert response.status_code == 422
        assert "slice_idle_us" in response.json()["detail"]

    def test_out_of_range_values_are_422(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session)
        for config in (
            {"scheduler": "bfq", "scheduler_tunables": {"low_latency": 2}},
            {"scheduler": "kyber", "scheduler_tunables": {"read_lat_nsec": -5}},
            {"nr_requests": 1},
            {"read_ahead_kb": 10_000_000},
            {"scheduler_tunables": {"fifo_batch": 16}},
        ):
            response = client.put(_url(device), json=_set(config), headers=bearer(operator))
            assert response.status_code == 422, config

    def test_polling_needs_poll_queues(self, client: TestClient, session: Session) -> None:
        node, _, device, operator = _setup(session)
        refused = client.put(
            _url(device), json=_set({"completion": "classic_poll"}), headers=bearer(operator)
        )
        assert refused.status_code == 422
        assert "poll queues" in refused.json()["detail"]
        devices = report_inventory(
            session,
            node,
            device_inventory("loop0"),
            device_inventory("nvme0n1", poll_queues=4, hybrid=False),
        )
        nvme = next(d for d in devices if d.name == "nvme0n1")
        assert (
            client.put(
                _url(nvme), json=_set({"completion": "classic_poll"}), headers=bearer(operator)
            ).status_code
            == 200
        )
        hybrid = client.put(
            _url(nvme), json=_set({"completion": "hybrid_poll"}), headers=bearer(operator)
        )
        assert hybrid.status_code == 422
        assert "6.4" in hybrid.json()["detail"]

    def test_unknown_device_is_404(self, client: TestClient, session: Session) -> None:
        operator = create_api_token(session, role=Role.OPERATOR)
        response = client.put(
            "/api/v1/devices/00000000-0000-0000-0000-000000000000/policy",
            json=_set({"scheduler": "none"}),
            headers=bearer(operator),
        )
        assert response.status_code == 404

    def test_reason_is_required(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session)
        response = client.put(
            _url(device), json={"config": {"scheduler": "none"}}, headers=bearer(operator)
        )
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["body", "reason"]


class TestNodePolicies:
    def test_node_fetches_its_own_not_others(self, client: TestClient, session: Session) -> None:
        node, node_token, device, operator = _setup(session)
        other, _ = create_node(session, hostname="other")
        client.put(_url(device), json=_set({"scheduler": "kyber"}), headers=bearer(operator))
        mine = client.get(f"/api/v1/nodes/{node.id}/policies", headers=bearer(node_token))
        assert [(p["device_name"], p["config"]["scheduler"]) for p in mine.json()] == [
            ("loop0", "kyber")
        ]
        theirs = client.get(f"/api/v1/nodes/{other.id}/policies", headers=bearer(node_token))
        assert theirs.status_code == 403


class TestAppliedState:
    def test_applied_report_syncs_policy_device_and_audit(
        self, client: TestClient, session: Session
    ) -> None:
        _, node_token, device, operator = _setup(session)
        config = {"scheduler": "bfq", "scheduler_tunables": {"slice_idle_us": 0}}
        client.put(_url(device), json=_set(config), headers=bearer(operator))
        response = client.post(
            f"/api/v1/devices/{device.id}/applied-state",
            json={
                "policy_version": 1,
                "status": "applied",
                "config": config,
                "detail": "read back ok",
            },
            headers=bearer(node_token),
        )
        assert response.status_code == 200, response.text
        assert response.json()["in_sync"] is True
        shown = client.get(f"/api/v1/devices/{device.id}", headers=bearer(operator)).json()
        assert shown["capabilities"]["current_scheduler"] == "bfq"
        assert shown["capabilities"]["scheduler_tunables"] == {"slice_idle_us": 0}
        (event,) = client.get(
            "/api/v1/audit", params={"action": "policy.applied"}, headers=bearer(operator)
        ).json()
        assert (event["before"]["scheduler"], event["after"]["scheduler"]) == ("none", "bfq")
        assert event["actor"].startswith("node:")

    def test_failed_apply_is_not_in_sync(self, client: TestClient, session: Session) -> None:
        _, node_token, device, operator = _setup(session)
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        response = client.post(
            f"/api/v1/devices/{device.id}/applied-state",
            json={"policy_version": 1, "status": "rolled_back", "config": {"scheduler": "none"}},
            headers=bearer(node_token),
        )
        assert response.json()["in_sync"] is False
        assert response.json()["applied"]["status"] == "rolled_back"

    def test_future_version_is_409(self, client: TestClient, session: Session) -> None:
        _, node_token, device, operator = _setup(session)
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        response = client.post(
            f"/api/v1/devices/{device.id}/applied-state",
            json={"policy_version": 7, "status": "applied", "config": {"scheduler": "bfq"}},
            headers=bearer(node_token),
        )
        assert response.status_code == 409

    def test_other_node_is_403(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session)
        _, stranger = create_node(session, hostname="stranger")
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        response = client.post(
            f"/api/v1/devices/{device.id}/applied-state",
            json={"policy_version": 1, "status": "applied", "config": {"scheduler": "bfq"}},
            headers=bearer(stranger),
        )
        assert response.status_code == 403


class TestClearPolicy:
    def test_clears_with_reason_and_audit(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session)
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        response = client.delete(
            _url(device), params={"reason": "experiment over"}, headers=bearer(operator)
        )
        assert response.status_code == 204
        assert client.get(_url(device), headers=bearer(operator)).status_code == 404
        (event,) = client.get(
            "/api/v1/audit", params={"action": "policy.cleared"}, headers=bearer(operator)
        ).json()
        assert event["before"]["config"]["scheduler"] == "bfq"
        assert event["detail"] == "experiment over"


class TestUndo:
    """Revert goes back to the configuration before the policy's current version — the
    previous version's, or what the device ran before its first — as a new version the agent
    applies like any other; clear leaves the device on what it runs. Both audited, from the
    API and the device page."""

    def test_revert_walks_back_and_is_audited(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(
            session,
            scheduler="mq-deadline",
            scheduler_tunables={"read_expire": 500, "fifo_batch": 16, "not_allowed_here": 3},
        )
        session.commit()
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        client.put(_url(device), json=_set({"scheduler": "kyber"}), headers=bearer(operator))

        def revert() -> Any:
            return client.post(
                f"{_url(device)}/revert", json={"reason": "it got worse"}, headers=bearer(operator)
            )

        first = revert()
        assert first.status_code == 200, first.text
        assert (first.json()["version"], first.json()["config"]["scheduler"]) == (3, "bfq")
        assert first.json()["reason"] == "revert to v1: it got worse"
        events = client.get(
            "/api/v1/audit",
            params={"target_id": str(device.id), "action": "policy.reverted"},
            headers=bearer(operator),
        ).json()
        assert [(e["before"]["version"], e["after"]["version"]) for e in events] == [(2, 3)]
        # v3 replaced v2: reverting it goes back to kyber
        assert revert().json()["config"]["scheduler"] == "kyber"

    def test_reverting_a_first_version_goes_back_to_what_the_device_ran(
        self, client: TestClient, session: Session
    ) -> None:
        _, _, device, operator = _setup(
            session, scheduler="mq-deadline", scheduler_tunables={"read_expire": 250}
        )
        session.commit()
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        back = client.post(
            f"{_url(device)}/revert", json={"reason": "undo"}, headers=bearer(operator)
        )
        assert back.status_code == 200, back.text
        config = back.json()["config"]
        assert config["scheduler"] == "mq-deadline"
        assert config["scheduler_tunables"] == {"read_expire": 250}
        assert "before its first policy" in back.json()["reason"]

    def test_a_viewer_cannot_and_nothing_changes(
        self, client: TestClient, session: Session
    ) -> None:
        _, _, device, operator = _setup(session)
        viewer = create_api_token(session, role=Role.VIEWER)
        session.commit()
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        refused = client.post(
            f"{_url(device)}/revert", json={"reason": "undo"}, headers=bearer(viewer)
        )
        assert refused.status_code == 403
        assert client.get(_url(device), headers=bearer(viewer)).json()["version"] == 1

    def test_the_device_page_reverts_and_clears(self, client: TestClient, session: Session) -> None:
        _, _, device, operator = _setup(session, scheduler="mq-deadline")
        session.commit()
        client.put(_url(device), json=_set({"scheduler": "bfq"}), headers=bearer(operator))
        signed = client.post("/ui/login", data={"token": operator}, follow_redirects=False)
        client.cookies.update(signed.cookies)
        page = client.get(f"/ui/devices/{device.id}").text
        assert f"/ui/devices/{device.id}/policy/revert" in page
        csrf = client.cookies.get("blkpilot_csrf") or ""
        done = client.post(
            f"/ui/devices/{device.id}/policy/revert",
            data={"csrf": csrf, "reason": "from the page"},
            follow_redirects=False,
        )
        assert done.status_code == 303, done.text
        policy = client.get(_url(device), headers=bearer(operator)).json()
        assert (policy["version"], policy["config"]["scheduler"]) == (2, "mq-deadline")
        cleared = client.post(
            f"/ui/devices/{device.id}/policy/clear",
            data={"csrf": csrf, "reason": "hands off"},
            follow_redirects=False,
        )
        assert cleared.status_code == 303
        assert client.get(_url(device), headers=bearer(operator)).status_code == 404
        actions = {
            e["action"]
            for e in client.get(
                "/api/v1/audit", params={"target_id": str(device.id)}, headers=bearer(operator)
            ).json()
        }
        assert {"policy.set", "policy.reverted", "policy.cleared"} <= actions


def test_the_cli_shows_sets_reverts_and_clears_by_device_name(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`blkpilot policy` against the real app and database in this process (TestClient's
    transport): the device named by HOST/NAME, by name, or by the start of its id."""
    import httpx
    from typer.testing import CliRunner

    from service.cli import app

    node, _, device, operator = _setup(session, scheduler="mq-deadline")
    session.commit()
    monkeypatch.setattr(httpx, "request", client.request)
    common = ["--url", "http://testserver", "--token", operator]
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, ["policy", *args, *common])

    named = f"{node.hostname}/{device.name}"
    done = cli(
        "set", named, "--scheduler", "bfq", "--tunable", "slice_idle_us=0", "--reason", "x1x"
    )
    assert done.exit_code == 0, done.output
    assert "bfq[slice_idle_us=0]/interrupt  v1" in done.output
    shown = cli("show", str(device.id)[:8])
    assert shown.exit_code == 0, shown.output
    assert "not yet applied" in shown.output
    reverted = cli("revert", named, "--reason", "undo it")
    assert reverted.exit_code == 0, reverted.output
    assert "mq-deadline" in reverted.output
    assert "v2" in reverted.output
    cleared = cli("clear", named, "--reason", "hands off")
    assert cleared.exit_code == 0, cleared.output
    assert cli("show", named).exit_code == 1  # 404: no policy
    assert cli("show", "no-such-device").exit_code == 1


def test_the_cli_lists_devices_nodes_and_the_audit(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`blkpilot devices list/show`, `nodes list`, `audit list`: tables by default, the API's
    JSON with --json, against the real app and database (TestClient's transport)."""
    import json

    import httpx
    from typer.testing import CliRunner

    from service.cli import app

    node, _, device, operator = _setup(session, scheduler="mq-deadline")
    session.commit()
    client.put(
        _url(device), json=_set({"scheduler": "bfq"}, "for the audit"), headers=bearer(operator)
    )
    monkeypatch.setattr(httpx, "request", client.request)
    common = ["--url", "http://testserver", "--token", operator]
    runner = CliRunner()
    listed = runner.invoke(app, ["devices", "list", "--node", node.hostname, *common])
    assert listed.exit_code == 0, listed.output
    assert f"{node.hostname}/{device.name}" in listed.output
    assert "mq-deadline" in listed.output
    as_json = runner.invoke(app, ["devices", "list", "--node", node.hostname, "--json", *common])
    assert [d["id"] for d in json.loads(as_json.output)] == [str(device.id)]
    shown = runner.invoke(app, ["devices", "show", str(device.id)[:8], *common])
    assert shown.exit_code == 0, shown.output
    assert "scheduler   mq-deadline" in shown.output
    nodes = runner.invoke(app, ["nodes", "list", "--json", *common])
    assert str(node.id) in {n["id"] for n in json.loads(nodes.output)}
    audit = runner.invoke(
        app, ["audit", "list", "--device", f"{node.hostname}/{device.name}", "--json", *common]
    )
    assert audit.exit_code == 0, audit.output
    assert [e["action"] for e in json.loads(audit.output)] == ["policy.set", "device.discovered"]


def test_the_cli_reads_its_token_from_a_file(
    client: TestClient,
    session: Session,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """No token on the command line (where `ps` shows it): BLKPILOT_TOKEN_FILE, or
    ~/.config/blkpilot/token; a file named but missing is exit status 2, not a 401."""
    import httpx
    from typer.testing import CliRunner

    from service.cli import app

    node, _, device, operator = _setup(session, scheduler="mq-deadline")
    session.commit()
    monkeypatch.setattr(httpx, "request", client.request)
    monkeypatch.delenv("BLKPILOT_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    runner = CliRunner()
    named = f"{node.hostname}/{device.name}"

    def show(**env: str) -> Any:
        return runner.invoke(app, ["devices", "show", named, "--url", "http://testserver"], env=env)

    nothing = show()  # no token anywhere: said before anything is sent
    assert nothing.exit_code == 2
    assert "no API token" in nothing.output
    secret = tmp_path / "operator.token"
    secret.write_text(operator + "\n")
    secret.chmod(0o600)
    done = show(BLKPILOT_TOKEN_FILE=str(secret))
    assert done.exit_code == 0, done.output
    assert "mq-deadline" in done.output
    assert "warning" not in done.output
    missing = show(BLKPILOT_TOKEN_FILE=str(tmp_path / "nowhere"))
    assert missing.exit_code == 2
    assert "does not exist" in missing.output
    default = tmp_path / ".config" / "blkpilot" / "token"
    default.parent.mkdir(parents=True)
    default.write_text(operator)
    default.chmod(0o644)
    done = show()
    assert done.exit_code == 0, done.output
    assert "readable by others" in done.output


def test_a_hostname_enrolled_twice_is_two_nodes_the_cli_tells_apart_and_can_revoke(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 64: `devices show node-b/sda` answered "node-b/sda, node-b/sda; say which". The
    CLI now lists each with its device id, node and enrolment; `nodes revoke` ends the old
    node's token, and its device is still named by id."""
    import httpx
    from typer.testing import CliRunner

    from service.cli import app

    old, _ = create_node(session, hostname="node-b")
    (old_device,) = report_inventory(session, old, device_inventory("sda"))
    new, _ = create_node(session, hostname="node-b")
    (new_device,) = report_inventory(session, new, device_inventory("sda"))
    admin = create_api_token(session, role=Role.ADMIN)
    session.commit()
    monkeypatch.setattr(httpx, "request", client.request)
    common = ["--url", "http://testserver", "--token", admin]
    runner = CliRunner()
    both = runner.invoke(app, ["devices", "show", "node-b/sda", *common])
    assert both.exit_code == 1
    for node, device in ((old, old_device), (new, new_device)):
        assert str(device.id)[:8] in both.output
        assert f"node {str(node.id)[:8]}" in both.output
    one = runner.invoke(app, ["devices", "show", str(old_device.id)[:8], *common])
    assert one.exit_code == 0, one.output
    revoked = runner.invoke(
        app, ["nodes", "revoke", str(old.id)[:8], "--reason", "re-enrolled", *common]
    )
    assert revoked.exit_code == 0, revoked.output
    assert "revoked" in revoked.output
    listed = client.get("/api/v1/nodes", headers=bearer(admin)).json()
    assert {n["id"]: bool(n["revoked_at"]) for n in listed} == {
        str(old.id): True,
        str(new.id): False,
    }
