"""service.telemetry.distributions: a batch's histograms checked and summarised in arrays say
what the contract says of each operation and each window, exactly — the batch the array check
takes, OperationLatency takes; the percentiles stored are window_percentiles_us's floats."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.contract import histograms
from agent.contract.wire import OperationLatency, TelemetryBatch, window_percentiles_us
from bench.ingest import AGENT_JSON, with_distributions
from service.fastwire import FastDecoder
from service.telemetry import distributions
from service.telemetry.service import BATCHES
from tests.factories import ebpf_window, telemetry_window

# the struct alone: msgspec's own checks and the window's validators, not the deferred one
UNCHECKED = BATCHES._decoder
CONTRACT_CHECK = OperationLatency.__pydantic_decorators__.model_validators["_consistent"].func


@st.composite
def operations(draw: st.DrawFn, op: str) -> dict[str, Any]:
    """An operation as an agent sends it, or one changed the way a broken one might be."""
    top = draw(st.sampled_from([histograms.LATENCY_SLOTS, histograms.LATENCY_SLOTS + 4]))
    counts = draw(st.dictionaries(st.integers(0, top - 1), st.integers(1, 10**6), max_size=50))
    device_ns = sorted(counts.items())
    total = sum(counts.values())
    slot = draw(st.integers(9, 20))
    size_bytes = [(slot, total)] if total else []
    sizes: dict[int, int] = draw(st.dictionaries(st.integers(9, 17), st.integers(1, 5), max_size=3))
    wrong_sizes = draw(st.booleans())
    if sizes and wrong_sizes:
        size_bytes = sorted(sizes.items())  # not adding up to the count, mostly
    queue_ns = sorted(
        draw(st.dictionaries(st.integers(0, top - 1), st.integers(1, 9), max_size=8)).items()
    )
    if len(queue_ns) > 1 and draw(st.integers(0, 5)) == 0:
        queue_ns.reverse()
    if len(device_ns) > 1 and draw(st.integers(0, 5)) == 0:
        device_ns[0], device_ns[1] = device_ns[1], device_ns[0]
    found = histograms.percentiles_us(device_ns) or dict.fromkeys(histograms.PERCENTILES, 0.0)
    given_us = [found[name] for name in histograms.PERCENTILES]
    change = draw(st.sampled_from(["none", "none", "none", "near", "off", "swap", "count"]))
    which = draw(st.integers(0, 3))
    if change == "near":  # inside the contract's tolerance
        given_us[which] *= 1 + 5e-7
    elif change == "off":
        given_us[which] = given_us[which] * (1 + 3e-6) + 2e-6
    elif change == "swap" and given_us[0] != given_us[3]:
        given_us[0], given_us[3] = given_us[3], given_us[0]
    count = total + (draw(st.sampled_from([-1, 1])) if change == "count" and total > 1 else 0)
    return {
        "op": op,
        "count": count,
        "device_ns": device_ns,
        "queue_ns": queue_ns,
        "size_bytes": size_bytes,
        **{
            f"{name}_us": value
            for name, value in zip(histograms.PERCENTILES, given_us, strict=True)
        },
    }


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    windows = []
    for index in range(draw(st.integers(1, 4))):
        ops = draw(st.lists(st.sampled_from(["read", "write", "flush"]), unique=True, max_size=3))
        made = [draw(operations(op)) for op in ops]
        counts = {o["op"]: o["count"] for o in made}
        window = ebpf_window(
            f"nvme{index}n1",
            index=index,
            read_ios=counts.get("read", 0),
            write_ios=counts.get("write", 0),
        )
        window["operations"] = made
        windows.append(window)
    # compact, as the agent writes it (spaces leave a batch to the model: tested below)
    return _compact({"batch_id": str(uuid.uuid4()), "windows": windows})


def _compact(document: Any) -> bytes:
    return json.dumps(document, separators=AGENT_JSON).encode()


def _struct(raw: bytes) -> Any:
    """The batch as msgspec takes it (a percentile past the hour its type allows, from a
    slot past the last, is refused there: not this test's case)."""
    try:
        return UNCHECKED.decode(raw)
    except msgspec.ValidationError:
        assume(False)


def _contract(raw: bytes) -> TelemetryBatch | None:
    """The batch as the contract takes it, or None. The struct took it (`_struct`): its own
    checks are the model's, but for the deferred validator and what the histograms' type
    says (the struct keeps them as their JSON)."""
    try:
        return TelemetryBatch.model_validate_json(raw)
    except ValueError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_the_array_check_says_what_the_contract_says(raw: bytes) -> None:
    batch = _struct(raw)
    assert distributions.consistent(batch) == (_contract(raw) is not None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_each_window_is_summarised_as_the_contract_summarises_it(raw: bytes) -> None:
    batch = _struct(raw)
    taken = _contract(raw)
    assume(taken is not None)  # what is stored: what the contract took
    assert taken is not None
    expected = [window_percentiles_us(window) for window in taken.windows]
    # from what the check read (the endpoint's way) and read again (a batch the model took)
    checked = distributions.check(batch)
    assert checked is not None
    assert distributions.window_summaries(batch.windows, checked) == expected
    assert distributions.window_summaries(batch.windows) == expected


@pytest.mark.parametrize(
    ("histogram", "valid"),
    [
        (b"[[12,3],[40,1]]", True),  # as the agent sends it: the fast path's
        (b"[ [12, 3], [40,1] ]", True),  # valid JSON with spaces: the model's to take
        (b"[[12,3,4]]", False),
        (b"[[12]]", False),
        (b"[[[12,3]]]", False),
        (b"[12,3]", False),
        (b"[[12.0,3]]", False),
        (b"[[12,3e0]]", False),
        (b"[[-1,3]]", False),
        (b"[[12,-3]]", False),
        (b"[[12,0]]", False),
        (b'[[12,"3"]]', False),
        (b"[[12,true]]", False),
        (b"[[12,null]]", False),
        (b"{}", False),
        (b'"[[12,3]]"', False),
        (b"[[12,360000000001]]", False),  # past MAX_IOS_PER_WINDOW
        (b"[[12,99999999999999999999]]", False),  # past int64: read as int64's largest
        (b"[[99999999999999999999,3]]", False),
    ],
)
def test_a_histogram_not_written_as_the_agent_writes_it_is_the_models(
    histogram: bytes, valid: bool
) -> None:
    """Histograms stay the JSON they came in until the batch-wide check reads them: that
    takes only pairs of plain integers written compact; the rest goes to the model, which
    takes what the contract takes and says why it refuses the rest."""
    window = ebpf_window("nvme0n1")
    window["operations"][0]["queue_ns"] = ["HISTOGRAM"]
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": [window]})
    raw = raw.replace(b'["HISTOGRAM"]', histogram)
    fast = BATCHES.decode(raw)
    if histogram == b"[[12,3],[40,1]]":
        assert fast is not None
        assert bytes(fast.windows[0].operations[0].queue_ns) == histogram  # stored as sent
    else:
        assert fast is None
    if valid:
        TelemetryBatch.model_validate_json(raw)
    else:
        with pytest.raises(ValidationError):
            TelemetryBatch.model_validate_json(raw)


def test_recorded_histograms_are_taken_and_summarised_exactly() -> None:
    """Our collector's histograms from pgbench and db_bench (24-76 slots): the fast path takes
    the batch, and every stored percentile is the contract's float."""
    windows = [
        with_distributions(ebpf_window(f"nvme{i % 16}n1", index=i), 7 * i) for i in range(48)
    ]
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": windows})
    decoded = BATCHES.decode_checked(raw)
    assert decoded is not None
    batch, checked = decoded
    summaries = distributions.window_summaries(batch.windows, checked)
    taken = TelemetryBatch.model_validate_json(raw)
    assert summaries == [window_percentiles_us(w) for w in taken.windows]
    assert distributions.window_summaries(batch.windows) == summaries
    assert all(s["p99_us"] is not None for s in summaries)
    # what the storing statement reads: the same floats as tuples
    found = distributions.window_percentiles(batch.windows, checked)
    assert found == [(s["p50_us"], s["p99_us"], s["p999_us"]) for s in summaries]


def test_windows_without_distributions_have_no_percentiles() -> None:
    """diskstats windows, and an eBPF window whose only I/O is a flush: nothing to summarise
    (a list of Nones, no dict a window), beside a window with reads that has its own."""
    plain = [telemetry_window(f"sd{c}", index=i) for i, c in enumerate("abc")]
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": plain})
    decoded = BATCHES.decode_checked(raw)
    assert decoded is not None
    assert distributions.window_percentiles(decoded[0].windows, decoded[1]) == [None] * 3
    flush = ebpf_window("nvme0n1", index=1)
    flush["operations"][0]["op"] = "flush"
    flush = {**flush, "operations": flush["operations"][:1], "read_ios": 0, "write_ios": 0}
    traced = ebpf_window("nvme0n1", index=2)
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": [flush, traced]})
    taken = TelemetryBatch.model_validate_json(raw)
    decoded = BATCHES.decode_checked(raw)
    assert decoded is not None
    found = distributions.window_percentiles(decoded[0].windows, decoded[1])
    expected = [window_percentiles_us(w) for w in taken.windows]
    assert found[0] is None  # a flush alone: no reads or writes to merge, as the contract
    assert expected[0]["p99_us"] is None
    assert found[1] == tuple(expected[1].values())


def test_summaries_refuse_histograms_read_of_another_batch() -> None:
    one = _compact({"batch_id": str(uuid.uuid4()), "windows": [ebpf_window("nvme0n1")]})
    two = _compact(
        {
            "batch_id": str(uuid.uuid4()),
            "windows": [ebpf_window("nvme0n1", index=i) for i in (0, 1)],
        }
    )
    first, second = BATCHES.decode_checked(one), BATCHES.decode_checked(two)
    assert first is not None
    assert second is not None
    with pytest.raises(ValueError, match="histograms `check` took"):
        distributions.window_summaries(second[0].windows, first[1])


def test_a_percentile_off_its_histogram_is_left_to_the_model_which_says_why() -> None:
    window = ebpf_window("nvme0n1")
    window["operations"][1]["p99_us"] *= 1.01
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": [window]})
    assert UNCHECKED.decode(raw) is not None  # the struct's own checks take it
    assert BATCHES.decode(raw) is None
    with pytest.raises(ValueError, match=r"p99_us is not the histogram's"):
        TelemetryBatch.model_validate_json(raw)


def test_a_slot_past_int64_is_left_to_the_model() -> None:
    window = ebpf_window("nvme0n1")
    window["operations"][0]["queue_ns"] = [[2**64, 1]]
    raw = _compact({"batch_id": str(uuid.uuid4()), "windows": [window]})
    assert BATCHES.decode(raw) is None
    with pytest.raises(ValueError, match="histogram slots"):
        TelemetryBatch.model_validate_json(raw)


def test_a_deferred_validator_needs_its_whole_check_and_must_exist() -> None:
    with pytest.raises(TypeError, match="need the check"):
        FastDecoder(TelemetryBatch, deferred=[CONTRACT_CHECK])
    with pytest.raises(TypeError, match="no after-validator"):
        FastDecoder(TelemetryBatch, deferred=[len], whole=distributions.consistent)
