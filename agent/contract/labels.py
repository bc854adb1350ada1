"""Node labels (`rack=r12`, `role=db`): validated in the protocol, parsed from the command line."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

LABEL_KEY = re.compile(r"^[a-z][a-z0-9_./-]{0,62}$")
MAX_LABELS = 64


def check_labels(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    for key, label in value.items():
        if not LABEL_KEY.match(key):
            raise ValueError(f"label key {key!r} must match {LABEL_KEY.pattern}")
        if len(label) > 255:
            raise ValueError(f"label {key!r} is longer than 255 characters")
    return value


# the same rules in the schema, so that a client generated from the OpenAPI document agrees
Labels = Annotated[
    dict[str, str],
    AfterValidator(check_labels),
    Field(
        json_schema_extra={
            "propertyNames": {"pattern": LABEL_KEY.pattern},
            "maxProperties": MAX_LABELS,
            "additionalProperties": {"type": "string", "maxLength": 255},
        }
    ),
]


def parse_labels(labels: list[str]) -> dict[str, str]:
    """`["rack=r12", "role=db"]` -> `{"rack": "r12", "role": "db"}`; a ValueError names a bad
    one."""
    parsed: dict[str, str] = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise ValueError(f"{label!r} is not key=value")
        parsed[key] = value
    return parsed
