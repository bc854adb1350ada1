"""Desired configurations per device, checked against what the device can take, and the
applied state agents report back. Every change is audited in the same transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from agent.contract.tunables import SCHEDULER_TUNABLES, CompletionMode, DeviceConfig
from agent.contract.wire import AppliedStateReport, AppliedStatus, DeviceCapabilities, OwnerPolicy
from service.audit import service as audit
from service.devices import repository as device_repository
from service.devices import service as device_service
from service.errors import Conflict, Forbidden, NotFound, Unprocessable
from service.policies import repository
from service.policies.schemas import AppliedState, PolicyRead
from service.security import Principal, Role
from service.tables import Device, Policy


def _device(session: Session, device_id: uuid.UUID) -> Device:
    device = device_repository.get(session, device_id)
    if device is None:
        raise NotFound(f"no device {device_id}")
    return device


def check_device_can_take(device: Device, config: DeviceConfig) -> None:
    """Refuse a configuration the device cannot take, naming the field."""
    capabilities = DeviceCapabilities.model_validate(device.capabilities)
    problems: list[dict[str, Any]] = []
    if not device.present:
        problems.append({"loc": ["body"], "msg": f"{device.name} is no longer on its node"})
    if config.scheduler is not None and config.scheduler not in capabilities.available_schedulers:
        offered = ", ".join(s.value for s in capabilities.available_schedulers) or "nothing"
        problems.append(
            {
                "loc": ["body", "config", "scheduler"],
                "msg": f"{device.name} does not offer {config.scheduler.value} (offers {offered})",
            }
        )
    poll = capabilities.poll
    if config.completion is CompletionMode.CLASSIC_POLL and not (poll.poll_queues or poll.io_poll):
        problems.append(
            {
                "loc": ["body", "config", "completion"],
                "msg": f"{device.name} has no poll queues, so it cannot complete by polling",
            }
        )
    if config.completion is CompletionMode.HYBRID_POLL and not poll.hybrid_supported:
        problems.append(
            {
                "loc": ["body", "config", "completion"],
                "msg": "hybrid polling needs poll queues and a kernel before 6.4",
            }
        )
    if problems:
        raise Unprocessable(
            "; ".join(problem["msg"] for problem in problems) + "; nothing was changed",
            fields=problems,
        )


def to_read(policy: Policy, device: Device) -> PolicyRead:
    applied = None
    if policy.applied_version is not None and policy.applied_status and policy.applied_at:
        applied = AppliedState(
            version=policy.applied_version,
            status=AppliedStatus(policy.applied_status),
            config=DeviceConfig.model_validate(policy.applied_config)
            if policy.applied_config is not None
            else None,
            detail=policy.applied_detail or "",
            at=policy.applied_at,
        )
    return PolicyRead(
        device_id=device.id,
        device_name=device.name,
        node_id=device.node_id,
        config=DeviceConfig.model_validate(policy.config),
        owners=OwnerPolicy(policy.owners),
        version=policy.version,
        set_by=policy.set_by,
        reason=policy.reason,
        created_at=policy.created_at,
        updated_at=policy.updated_at,
        applied=applied,
        in_sync=policy.applied_version == policy.version
        and policy.applied_status == AppliedStatus.APPLIED.value,
    )


def set_policy(
    session: Session,
    operator: Principal,
    device_id: uuid.UUID,
    config: DeviceConfig,
    reason: str,
    owners: OwnerPolicy = OwnerPolicy.TAKE_OVER,
) -> PolicyRead:
    device = _device(session, device_id)
    check_device_can_take(device, config)
    wanted = config.model_dump(mode="json")
    policy = repository.for_device(session, device_id, lock=True)
    ran = None
    if policy is None:
        before = None
        ran = _device_configuration(device)  # what a revert of this first version goes back to
        policy = repository.add(
            session,
            Policy(
                device_id=device.id,
                config=wanted,
                version=1,
                set_by=operator.name,
                reason=reason,
                owners=owners.value,
            ),
        )
    else:
        before = {"config": policy.config, "version": policy.version, "owners": policy.owners}
        policy.config = wanted
        policy.owners = owners.value
        policy.version += 1
        policy.set_by = operator.name
        policy.reason = reason
        policy = repository.save(session, policy, touched=True)
    audit.record(
        session,
        operator,
        "policy.set",
        target_type="device",
        target_id=device.id,
        before=before,
        after={
            "config": wanted,
            "version": policy.version,
            "owners": owners.value,
            **({"device_config_before": ran} if ran is not None else {}),
        },
        detail=reason,
    )
    return to_read(policy, device)


def _device_configuration(device: Device) -> dict[str, Any] | None:
    """The scheduler and its tunables the device last reported running."""
    capabilities = DeviceCapabilities.model_validate(device.capabilities or {})
    if capabilities.current_scheduler is None:
        return None
    allowed = SCHEDULER_TUNABLES.get(capabilities.current_scheduler, {})
    config = DeviceConfig(
        scheduler=capabilities.current_scheduler,
        scheduler_tunables={
            name: value
            for name, value in capabilities.scheduler_tunables.items()
            if name in allowed and allowed[name][0] <= value <= allowed[name][1]
        },
    )
    return config.model_dump(mode="json", exclude_none=True)


def revert_policy(
    session: Session, operator: Principal, device_id: uuid.UUID, reason: str
) -> PolicyRead:
    """Back to the configuration before the device's current policy version: the previous
    version's, or for a first version what the device ran when it was set. The revert is a
    new version (the agent applies it like any other), audited twice: policy.set and
    policy.reverted."""
    return _revert(session, operator, device_id, reason, release=False)


def undo_policy(
    session: Session,
    operator: Principal,
    device_id: uuid.UUID,
    reason: str,
    *,
    set_for: str | None = None,
) -> PolicyRead:
    """As revert_policy, and where the current version was the device's first, the device is
    released once its agent reports the old configuration applied (the policy is cleared):
    it is then unmanaged, as it was. With set_for, refused (Conflict) unless the current
    version's reason names it — the change to undo must still be the device's policy."""
    if set_for is not None:
        policy = repository.for_device(session, device_id)
        if policy is None or set_for not in policy.reason:
            raise Conflict(
                f"the device's policy is no longer the one {set_for} set"
                + (f" (v{policy.version} by {policy.set_by})" if policy else " (it has none)")
                + "; revert or clear the policy itself, nothing was changed"
            )
    return _revert(session, operator, device_id, reason, release=True)


def _revert(
    session: Session, operator: Principal, device_id: uuid.UUID, reason: str, *, release: bool
) -> PolicyRead:
    device = _device(session, device_id)
    policy = repository.for_device(session, device_id, lock=True)
    if policy is None:
        raise NotFound(f"device {device.name} ({device_id}) has no policy")
    events = audit.list_events(
        session, target_type="device", target_id=str(device.id), action="policy.set", limit=50
    )
    event = next((e for e in events if (e.after or {}).get("version") == policy.version), None)
    target, label, first = None, "", False
    if event is not None and event.before and event.before.get("config"):
        target, label = event.before["config"], f"v{event.before.get('version')}"
    elif event is not None and event.after and event.after.get("device_config_before"):
        target, first = event.after["device_config_before"], True
        label = "what it ran before its first policy"
    if target is None:
        raise Conflict(
            f"no configuration before v{policy.version} of {device.name}'s policy is recorded;"
            " clear the policy instead (the device then keeps what it runs)"
        )
    was = policy.version
    read = set_policy(
        session,
        operator,
        device_id,
        DeviceConfig.model_validate(target),
        f"revert to {label}: {reason}",
    )
    released = release and first
    if released:
        policy = repository.for_device(session, device_id, lock=True)
        assert policy is not None
        policy.release_when_applied = True
        session.flush()
    audit.record(
        session,
        operator,
        "policy.reverted",
        target_type="device",
        target_id=device.id,
        before={"version": was, "config": policy.config},
        after={
            "version": read.version,
            "config": target,
            "to": label,
            **({"then": "released once applied"} if released else {}),
        },
        detail=reason,
    )
    return read


def get_policy(session: Session, principal: Principal, device_id: uuid.UUID) -> PolicyRead:
    device = device_service.get_device(session, principal, device_id)
    policy = repository.for_device(session, device_id)
    if policy is None:
        raise NotFound(f"device {device.name} ({device_id}) has no policy")
    return to_read(policy, device)


def clear_policy(session: Session, operator: Principal, device_id: uuid.UUID, reason: str) -> None:
    device = _device(session, device_id)
    policy = repository.for_device(session, device_id, lock=True)
    if policy is None:
        raise NotFound(f"device {device.name} ({device_id}) has no policy")
    before = {"config": policy.config, "version": policy.version}
    repository.delete(session, policy)
    audit.record(
        session,
        operator,
        "policy.cleared",
        target_type="device",
        target_id=device.id,
        before=before,
        detail=reason,
    )


def policies_for_node(
    session: Session, principal: Principal, node_id: uuid.UUID
) -> Sequence[PolicyRead]:
    if not principal.may_act_for_node(node_id, Role.VIEWER):
        raise Forbidden("a node may read only its own policies")
    return [to_read(policy, device) for policy, device in repository.for_node(session, node_id)]


_AUDIT_ACTION = {
    AppliedStatus.APPLIED: "policy.applied",
    AppliedStatus.FAILED: "policy.apply_failed",
    AppliedStatus.ROLLED_BACK: "policy.rolled_back",
    AppliedStatus.DRIFT: "device.drift",
    AppliedStatus.PAUSED: "policy.paused",
    AppliedStatus.YIELDED: "policy.yielded",
}


def report_applied(
    session: Session, node: Principal, device_id: uuid.UUID, report: AppliedStateReport
) -> PolicyRead:
    device = _device(session, device_id)
    if device.node_id != node.node_id:
        raise Forbidden("a node may report applied state only for its own devices")
    policy = repository.for_device(session, device_id, lock=True)
    if policy is None:
        raise NotFound(f"device {device.name} ({device_id}) has no policy to report on")
    if report.policy_version > policy.version:
        raise Conflict(
            f"policy version {report.policy_version} does not exist yet (current {policy.version})"
        )
    before_config = device_service.configuration_of(device)
    now = datetime.now(UTC)
    policy.applied_version = report.policy_version
    policy.applied_status = report.status.value
    policy.applied_config = report.config.model_dump(mode="json")
    policy.applied_detail = report.detail
    policy.applied_at = now
    _update_device_configuration(device, report.config)
    after_config = device_service.configuration_of(device)
    audit.record(
        session,
        node,
        _AUDIT_ACTION[report.status],
        target_type="device",
        target_id=device.id,
        before=before_config,
        after=after_config,
        detail=f"policy version {report.policy_version}: {report.detail}".rstrip(": "),
    )
    policy = repository.save(session, policy)
    read = to_read(policy, device)
    if (
        policy.release_when_applied
        and report.status is AppliedStatus.APPLIED
        and report.policy_version == policy.version
    ):
        # an undo back to before the device's first policy: the device is as it was, and
        # unmanaged again, as it was
        repository.delete(session, policy)
        audit.record(
            session,
            node,
            "policy.released",
            target_type="device",
            target_id=device.id,
            before={"config": policy.config, "version": policy.version},
            detail="put back as it was before its first policy; no longer managed",
        )
    return read


def _update_device_configuration(device: Device, config: DeviceConfig) -> None:
    """What the agent reports as now in effect becomes the device's known configuration."""
    capabilities = dict(device.capabilities)
    if config.scheduler is not None:
        device.current_scheduler = config.scheduler.value
        capabilities["current_scheduler"] = config.scheduler.value
        capabilities["scheduler_tunables"] = dict(config.scheduler_tunables)
    if config.nr_requests is not None:
        capabilities["nr_requests"] = config.nr_requests
    if config.read_ahead_kb is not None:
        capabilities["read_ahead_kb"] = config.read_ahead_kb
    device.capabilities = capabilities
