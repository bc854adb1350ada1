"""The protocol's base: strict input models and the bounds every message shares."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

MAX_WINDOWS_PER_BATCH = 5_000
MAX_WINDOW_SPAN = timedelta(hours=1)
# Telemetry is about now: no window starts before this, and the service refuses windows that
# end further in its future than a clock may be off (a node's NTP failing, a VM's clock).
EARLIEST_WINDOW = datetime(2000, 1, 1, tzinfo=UTC)
MAX_CLOCK_SKEW = timedelta(minutes=5)
# the error name of a telemetry push refused because a window ends past that: the node's clock
# is ahead, and the batch becomes acceptable as real time catches up (the agent holds it)
CLOCK_AHEAD = "clock_ahead"
MAX_DEVICES_PER_NODE = 1_024
INT64_MAX = 2**63 - 1

# A counter: what the kernel counts in 64 bits, and what PostgreSQL's BIGINT holds. Strict:
# "123" and true are not counts (they were stored as 123 and 1).
Counter = Annotated[int, Field(ge=0, le=INT64_MAX, strict=True)]

# What one device can do in one window (at most MAX_WINDOW_SPAN), the bound on a window's
# counters. Not the kernel's 64 bits: a window at INT64_MAX I/Os was stored, and the hourly
# rollup's sums then overflowed BIGINT on every pass, so no later hour was ever rolled up.
# The fastest devices do about 1e7 I/Os and 1.4e10 bytes a second (PCIe 5 NVMe); a node's
# widest stack (md or dm over many of them) stays under ten times that. So a window may count
# at most MAX_IOPS I/Os and MAX_BYTES_PER_S bytes for each second it spans — and, whatever
# its span, no more than an hour of that. A device's windows may not overlap (the service
# refuses one that overlaps another of its device), so an hour of them sums to at most an
# hour at these ceilings, far inside BIGINT (3.6e14 << 9.2e18); the hourly roll-up clamps
# whatever got past that into BIGINT for its own device alone.
MAX_IOPS = 1e8
MAX_BYTES_PER_S = 1e11
MAX_IOS_PER_WINDOW = int(MAX_IOPS * MAX_WINDOW_SPAN.total_seconds())  # 3.6e11
MAX_BYTES_PER_WINDOW = int(MAX_BYTES_PER_S * MAX_WINDOW_SPAN.total_seconds())  # 3.6e14
WindowIos = Annotated[int, Field(ge=0, le=MAX_IOS_PER_WINDOW, strict=True)]
WindowBytes = Annotated[int, Field(ge=0, le=MAX_BYTES_PER_WINDOW, strict=True)]


def measure(high: float) -> Any:
    """A non-negative measurement, a JSON number, no larger than any device or node makes
    (1e308 IOPS was stored, and ranked first on every page)."""
    return Field(ge=0.0, le=high, strict=True)


MAX_MICROS = 3.6e9  # a latency: up to an hour
MAX_DEPTH = 1e6  # requests in flight
MAX_JOULES = 1e12
Iops = Annotated[float, measure(MAX_IOPS)]  # the fastest devices do about 1e7
Micros = Annotated[float, measure(MAX_MICROS)]
Bytes = Annotated[float, measure(float(1 << 32))]  # a mean request size
Depth = Annotated[float, measure(MAX_DEPTH)]
PerSecond = Annotated[float, measure(1e10)]  # events per second on a node
Watts = Annotated[float, measure(1e6)]
Joules = Annotated[float, measure(MAX_JOULES)]


_LEAVES = (int, float, bool, type(None))
# what PostgreSQL cannot store as text: NUL, and a lone UTF-16 surrogate (JSON's "\ud800"
# decodes to one; it is not a character, and UTF-8 has no encoding for it)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_MESSAGE = (
    "text must not contain NUL (\\u0000) or a lone surrogate (\\ud800-\\udfff):"
    " neither can be stored"
)


def reject_nul(value: object) -> None:
    """Text that cannot be stored in PostgreSQL — NUL, lone surrogates — and means nothing in
    a device's world. Walks the whole structure once, without recursion (a telemetry batch
    holds some 10^5 values, most of them histogram pairs)."""
    search = _UNSTORABLE.search
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if search(item):  # type: ignore[call-overload]
                raise ValueError(_UNSTORABLE_MESSAGE)
        elif kind is dict:
            for key, inner in item.items():  # type: ignore[attr-defined]
                if type(key) is str and search(key):
                    raise ValueError(_UNSTORABLE_MESSAGE)
                if type(inner) not in _LEAVES:
                    stack.append(inner)
        elif kind is list or kind is tuple:
            stack.extend(i for i in item if type(i) not in _LEAVES)  # type: ignore[attr-defined]
        elif isinstance(item, str | dict | list | tuple):  # subclasses: the slow way
            if isinstance(item, str):
                stack.append(str(item))
            elif isinstance(item, dict):
                stack.append(dict(item))
            else:
                stack.append(list(item))


# set while a JSON document known to hold no NUL is validated (nul_free_json): its messages
# need not walk it. Otherwise each message walks what it is given, and a message inside
# another walks its part again: a before-validator, cheaper on the hot path than the
# wrap-validator that avoided that (a 500-window batch validates ~10 % faster)
_WALKED: ContextVar[bool] = ContextVar("blkpilot_nul_walked", default=False)


_ESCAPED_UNSTORABLE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def may_hold_unstorable(raw: bytes) -> bool:
    """Whether the JSON document `raw` may hold a string with NUL or a lone surrogate: only
    through an escape (\\u0000, \\ud800-\\udfff), as JSON allows neither raw."""
    return _ESCAPED_UNSTORABLE.search(raw) is not None


@contextmanager
def nul_free_json(raw: bytes) -> Iterator[None]:
    """Around validating the JSON document `raw`: when its bytes hold no \\u0000 and no
    surrogate escape, no string in it can hold NUL or a lone surrogate (JSON allows no raw
    control characters in strings, and UTF-8 bytes cannot encode a surrogate), and the
    messages need not walk it. A false alarm (an escaped backslash before "u0000", a valid
    surrogate pair) only costs the walk."""
    if may_hold_unstorable(raw):
        yield
        return
    token = _WALKED.set(True)
    try:
        yield
    finally:
        _WALKED.reset(token)


def _no_nul(value: str) -> str:
    reject_nul(value)
    return value


# Free text from outside (query strings, names): bounded and storable.
SafeText = Annotated[str, AfterValidator(_no_nul), Field(max_length=255)]


class InputModel(BaseModel):
    """What comes in from the network: unknown fields, NaN, infinities and NUL are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    # fields whose type admits no text at all — strict numbers, and lists and tuples of them,
    # so a string there is refused by validation itself: the NUL walk passes them by. Named
    # by the message that has them (a telemetry window's histograms are most of its values:
    # passing them by took the agent's validation of its own window from 190 to 136 µs)
    _text_free_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _no_nul_anywhere(cls, data: Any) -> Any:
        if not _WALKED.get():
            skip = cls._text_free_fields
            if skip and type(data) is dict:
                reject_nul({k: v for k, v in data.items() if k not in skip})
            else:
                reject_nul(data)
        return data


class WireModel(InputModel):
    """Strict base of the protocol's messages."""
