from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.tables import Observation


def add(session: Session, observation: Observation) -> Observation:
    session.add(observation)
    session.flush()
    session.refresh(observation)
    return observation


def get(session: Session, observation_id: uuid.UUID) -> Observation | None:
    return session.get(Observation, observation_id)


def list_observations(
    session: Session,
    *,
    device_id: uuid.UUID | None,
    kind: str | None,
    workload_name: str | None,
    limit: int,
    offset: int,
) -> Sequence[Observation]:
    query = (
        select(Observation)
        .order_by(Observation.finished_at.desc(), Observation.id)
        .limit(limit)
        .offset(offset)
    )
    if device_id is not None:
        query = query.where(Observation.device_id == device_id)
    if kind is not None:
        query = query.where(Observation.kind == kind)
    if workload_name is not None:
        query = query.where(Observation.workload_name == workload_name)
    return session.scalars(query).all()
