"""service.fastwire: the msgspec structs of a telemetry batch and an inventory, derived from the
contract's pydantic models, are never more lenient than the models, and say the same JSON of
what both take (the batch digest a resent batch is compared by; the capabilities a device's
row stores and its audit compares)."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError, field_validator

from agent.contract.base import WireModel, nul_free_json
from agent.contract.wire import InventoryReport, TelemetryBatch
from service.devices.service import INVENTORIES
from service.fastwire import FastDecoder
from service.telemetry.service import BATCHES
from tests.factories import ebpf_window, telemetry_window


def _document() -> dict[str, Any]:
    powered = telemetry_window(
        "nvme0n1",
        index=1,
        power_watts=17.5,
        energy_joules=175.0,
        power_scope="cpu_package",
        power_source="rapl",
        cpu_utilisation=0.25,
        context_switches_per_s=1200.0,
        latency_note="no eBPF: \\ tab\t newline\n",
        power_readings=[
            {
                "source": "rapl",
                "zone": "package-0",
                "scope": "cpu_package",
                "watts": 17.5,
                "energy_joules": 175.0,
            }
        ],
    )
    return {"batch_id": str(uuid.uuid4()), "windows": [ebpf_window("loop0"), powered]}


def _compact(document: Any) -> bytes:
    """JSON as the agent writes it (a histogram written otherwise is left to the model)."""
    return json.dumps(document, separators=(",", ":")).encode()


def _model(raw: bytes) -> TelemetryBatch | None:
    try:
        with nul_free_json(raw):
            return TelemetryBatch.model_validate_json(raw)
    except ValidationError:
        return None


# what a hostile or broken agent puts where a value belongs: each kind the model refuses
# somewhere, and the ones a lax reading would take ("12", true, 1.0 for a count, a naive or
# space-separated time, a unix time, a name with a newline, numbers past every bound)
SPECIAL: st.SearchStrategy[Any] = st.sampled_from(
    [
        "sda\n",
        "loop0",
        "read",
        "write",
        "ebpf",
        "diskstats",
        "cpu_package",
        "rapl",
        "12",
        "0.5",
        "",
        "\u00e9",
        "2026-11-27T04:00:00Z",
        "2026-11-27T04:00:00",
        "2026-11-27 04:00:00+00:00",
        "2026-11-27T04:00:00.123456+02:00",
        "2026-11-27T04:00:00z",
        "2026-13-27T04:00:00Z",
        1_700_000_000,
        1.0,
        0,
        -1,
        2**63,
        2**64,
        10**400,
        1e308,
        1e-7,
        [],
        [[0, 1]],
        [[0, 0]],
        {},
        True,
        None,
    ]
)
# each a copy: `[]`, `[[0, 1]]` and `{}` above are one object each, and a later change inside
# one (a key added to the `{}`, given that same `{}`) changed every example after it — and
# once made it hold itself (RecursionError, and hypothesis' FlakyStrategyDefinition)
VALUES = st.one_of(
    SPECIAL,
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
).map(copy.deepcopy)


def _paths(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every place in the document a value sits, and every object (for a key added)."""
    found: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        found.append(path)
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, (*path, key))
        elif isinstance(value, list | tuple):
            for index, inner in enumerate(value):
                walk(inner, (*path, index))

    walk(document, ())
    return found


def _mutate(draw: st.DrawFn, document: dict[str, Any]) -> bytes:
    """One to three changes to a valid document: a value replaced by one of VALUES, a key
    deleted, an unknown key added."""
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        places = _paths(document)[1:]  # where the last change left it
        if not places:  # every key deleted
            break
        path = draw(st.sampled_from(places))
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(VALUES)
        elif action == "delete" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "Device", "start "]))] = draw(VALUES)
    return _compact(document)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    return _mutate(draw, json.loads(json.dumps(_document())))  # tuples as JSON has them


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_the_struct_takes_nothing_the_model_refuses(raw: bytes) -> None:
    """Mutated batches, held side by side: what msgspec takes, pydantic takes, and the two
    say it as the same JSON (so the same digest)."""
    fast = BATCHES.decode(raw)
    model = _model(raw)
    if fast is not None:
        assert model is not None, f"the struct took what the model refuses: {raw!r}"
        assert BATCHES.encode(fast) == model.model_dump_json().encode()


def test_a_valid_batch_is_decoded_fast_and_means_what_the_model_means() -> None:
    document = _document()
    raw = _compact(document)
    fast = BATCHES.decode(raw)
    model = _model(raw)
    assert fast is not None
    assert model is not None
    assert BATCHES.encode(fast) == model.model_dump_json().encode()
    window = fast.windows[0]
    # a histogram is kept as it came, for the batch-wide check and the stored row
    sent = document["windows"][0]["operations"][0]["device_ns"]
    assert msgspec.json.decode(window.operations[0].device_ns) == [list(p) for p in sent]
    assert fast.windows[1].latency_note == document["windows"][1]["latency_note"]


@pytest.mark.parametrize(
    "change",
    [
        {"device": "loop0\n"},  # msgspec's pattern is re.search: `$` took a final newline
        {"read_ios": 1.0},
        {"read_ios": "12"},
        {"iops": True},
        {"start": "2026-11-27T04:00:00"},  # naive
        {"end": "2026-11-20T04:00:00+00:00"},  # before start: the model's own validator
        {"power_scope": "dram"},  # a scope without a reading
        {"latency_source": "diskstats"},  # distributions on a diskstats window
        {"latency_note": "x" * 501},
        {"unknown": 1},
    ],
)
def test_refusals_the_struct_shares_with_the_model(change: dict[str, Any]) -> None:
    document = _document()
    document["windows"][0].update(change)
    raw = _compact(document)
    assert _model(raw) is None
    assert BATCHES.decode(raw) is None


def test_what_only_the_model_takes_is_left_to_it_and_converted() -> None:
    """A unix time is a datetime to pydantic's lax JSON mode, not to msgspec: the fast path
    leaves it to the model, and what the model took becomes the struct."""
    document = _document()
    start = document["windows"][0]["start"]
    seconds = int(__import__("datetime").datetime.fromisoformat(start).timestamp())
    document["windows"][0]["start"] = seconds
    raw = _compact(document)
    assert BATCHES.decode(raw) is None
    model = _model(raw)
    assert model is not None
    converted = BATCHES.from_model(model)
    assert converted.windows[0].start == model.windows[0].start


def test_escapes_only_the_model_checks_go_to_the_model() -> None:
    document = _document()
    document["windows"][1]["latency_note"] = "a\u0000b"
    raw = _compact(document)
    assert BATCHES.decode(raw) is None  # the model's NUL walk judges it
    assert _model(raw) is None


def test_a_contract_the_translation_cannot_mirror_fails_when_built() -> None:
    class Checked(WireModel):
        name: str

        @field_validator("name")
        @classmethod
        def _lower(cls, value: str) -> str:
            return value.lower()

    with pytest.raises(TypeError, match="field validators"):
        FastDecoder(Checked)


def test_defaults_are_the_models() -> None:
    raw = json.dumps({"batch_id": str(uuid.uuid4()), "windows": [telemetry_window()]}).encode()
    fast = BATCHES.decode(raw)
    model = _model(raw)
    assert fast is not None
    assert model is not None
    assert msgspec.to_builtins(fast) == model.model_dump(mode="json")
    assert copy.copy(fast.windows[0].power_readings) == []


def _inventory() -> dict[str, Any]:
    from tests.factories import device_inventory

    devices = [device_inventory(f"loop{i}").model_dump(mode="json") for i in range(3)]
    devices[0]["capabilities"]["scheduler_tunables"] = {"read_expire": 500, "fifo_batch": 16}
    return {"kernel_version": "6.1.0-18-amd64", "devices": devices}


@st.composite
def mutated_inventory(draw: st.DrawFn) -> bytes:
    return _mutate(draw, _inventory())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_inventory())
def test_an_inventory_struct_takes_nothing_the_model_refuses(raw: bytes) -> None:
    fast = INVENTORIES.decode(raw)
    try:
        with nul_free_json(raw):
            model: InventoryReport | None = InventoryReport.model_validate_json(raw)
    except ValidationError:
        model = None
    if fast is not None:
        assert model is not None, f"the struct took what the model refuses: {raw!r}"
        assert INVENTORIES.encode(fast) == model.model_dump_json().encode()
        for struct, device in zip(fast.devices, model.devices, strict=True):
            # what the devices table stores of a device's capabilities, either way
            assert msgspec.to_builtins(struct.capabilities) == device.capabilities.model_dump(
                mode="json"
            )


def test_an_inventory_reporting_a_name_twice_is_refused_by_both() -> None:
    document = _inventory()
    document["devices"][1]["name"] = document["devices"][0]["name"]
    raw = _compact(document)
    assert INVENTORIES.decode(raw) is None
    with pytest.raises(ValidationError, match="reported twice"):
        InventoryReport.model_validate_json(raw)
