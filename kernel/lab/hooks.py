"""The scheduler's own cost per request, measured in the guest so that host load does not decide
it: the function-graph tracer times each hook of mq-deadline and fios (the duration from entry
to return, children included) in the same boot, on null_blk, where the device adds little.

A TCG guest's clock is the host's, so a hook running while the host takes the vCPU's thread
away is timed long; the median of each hook over every call (hundreds of thousands in the
bench's runs) is not moved by that, where a mean or a whole-run latency is. Tracing adds the
same entry/return cost to both schedulers' hooks.

The guest reduces the trace to a histogram per hook (10 ns buckets below 10 µs, 1 µs above),
which the host turns into medians; a request's cost is the sum over hooks of calls per request
times the hook's median."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agent.bench import fio as fio_jobs

TRACING = "/sys/kernel/tracing"
# every hook each scheduler registers that a request passes through (has_work runs on every
# queue run, bio_merge on every bio); neither has a completed_request (fios takes completions
# in finish_request)
HOOKS = {
    "mq-deadline": (
        "dd_limit_depth",
        "dd_bio_merge",
        "dd_prepare_request",
        "dd_insert_requests",
        "dd_has_work",
        "dd_dispatch_request",
        "dd_finish_request",
    ),
    "fios": (
        "fios_limit_depth",
        "fios_bio_merge",
        "fios_prepare_request",
        "fios_insert_requests",
        "fios_has_work",
        "fios_dispatch_request",
        "fios_finish_request",
    ),
}
WORKLOADS = {
    # the fast path: one synchronous reader at QD1
    "qd1-read": "--name=read --rw=randread --bs=4k --ioengine=psync",
    # reads and queued writes: depth limits, write blocking, anticipation
    "read-write": (
        "--name=read --rw=randread --bs=4k --ioengine=psync"
        " --name=write --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8"
    ),
}
NULL_BLK = (
    "insmod /lib/modules/null_blk.ko queue_mode=2 irqmode=2 completion_nsec=10000"
    " memory_backed=1 gb=1 submit_queues=1 hw_queue_depth=64"
)
# fios merges a task's sequential bios into its queued requests (fios_bio_merge skips the
# lock when the submitter has nothing of the bio's direction queued). On a second null_blk
# (configfs, nullb_slow) whose requests take 1 ms and fios keeping one on the device at a time
# (max_depth 1), a sequential reader and then writer at QD16 always have requests queued when
# their next bio comes (on nullb0, 10 us, they mostly do not under TCG: a bio's submission
# takes longer), and each bio should join the request before it. Untraced;
# /sys/block/*/stat fields 2 and 6 are read and write merges.
SLOW_DEV = "nullb_slow"  # a configfs null_blk is named by its directory
SLOW = f"/sys/kernel/config/nullb/{SLOW_DEV}"
MERGES = (
    "mount -t configfs none /sys/kernel/config 2>/dev/null\n"
    f"mkdir {SLOW}\necho 1000000 > {SLOW}/completion_nsec\necho 2 > {SLOW}/irqmode\n"
    f"echo 64 > {SLOW}/size\necho 1 > {SLOW}/power\n"
    f"echo fios > /sys/block/{SLOW_DEV}/queue/scheduler\n"
    f"echo 1 > /sys/block/{SLOW_DEV}/queue/iosched/max_depth\n"
    + "".join(
        "fio --eta=never --output=/dev/null --direct=1 --time_based --runtime=300ms"
        f" --size=64m --filename=/dev/{SLOW_DEV} --name=seq --rw={rw} --bs=4k --ioengine=libaio"
        " --iodepth=16\n"
        for rw in ("read", "write")
    )
    + f"set -- $(cat /sys/block/{SLOW_DEV}/stat)\n"
    "echo BLKPILOT-STATS-BEGIN merges/fios\n"
    'echo "read_merges $2"\necho "write_merges $6"\necho "reads $1"\necho "writes $5"\n'
    "echo BLKPILOT-STATS-END\n"
    f"echo none > /sys/block/{SLOW_DEV}/queue/scheduler\necho 0 > {SLOW}/power\nrmdir {SLOW}\n"
)
# the trace's text, reduced in the guest: "h.<hook>.<bucket> <calls>"
REDUCE = (
    # a call is one line: "fn();" with its duration, or, when an interrupt's traced call
    # nested in it, "fn() {" ... "} /* fn */" with the duration on the closing line
    'awk \'/(\\(\\);|\\*\\/)$/ { n = split($0, part, "|"); fn = part[n];'
    ' gsub(/[ ();{}]|\\/\\*|\\*\\//, "", fn); sub(/\\[.*\\]/, "", fn);'
    ' d = -1; for (i = 1; i <= NF; i++) if ($i == "us") d = $(i - 1); if (d < 0) next;'
    ' b = d < 10 ? int(d * 100) : 1000 + int(d); h[fn "." b]++ }'
    ' END { for (k in h) print "h." k, h[k] }\''
)


def script(rounds: int, seconds: float, buffer_mb: int = 96) -> str:
    """mq-deadline and fios in turns (the order rotated each round), each run traced alone; the
    trace buffer is sized to hold a run (its overruns are reported, and a run that lost
    events is not counted)."""
    ms = round(seconds * 1000)
    out = (
        f"mount -t tracefs none {TRACING} 2>/dev/null\n"
        "insmod /lib/modules/configfs.ko\n"
        f"{NULL_BLK}\ninsmod /lib/modules/fios.ko\n"
        f"echo 0 > {TRACING}/tracing_on\n"
        f"echo {buffer_mb * 1024} > {TRACING}/buffer_size_kb\n"
        # only the hooks are patched (set_graph_function with a depth limit also times
        # unrelated functions and misses calls); one by one: a name the kernel cannot trace
        # is reported, not the whole list refused
        "echo BLKPILOT-STATS-BEGIN hooks-setup\n"
        + "".join(
            f"echo {h} >> {TRACING}/set_ftrace_filter 2>/dev/null || echo missing_{h} 1\n"
            for names in HOOKS.values()
            for h in names
        )
        + f'echo "traced_functions $(grep -c . {TRACING}/set_ftrace_filter)"\n'
        f"grep -E '^(dd_|fios_)' {TRACING}/available_filter_functions"
        " | awk '{print \"a\" NR, $0}'\n"
        "echo BLKPILOT-STATS-END\n"
        f"echo function_graph > {TRACING}/current_tracer\n"
        # a tracer's own options exist only while it is the current tracer: set after it, or
        # a call with a traced call nested in it closes with a bare "}" the reduction skips
        f"echo funcgraph-tail > {TRACING}/trace_options\n"
        # warm-up: TCG translates fio's and the hooks' code on first use
        "echo fios > /sys/block/nullb0/queue/scheduler\n"
        "fio --eta=never --output=/dev/null --direct=1 --time_based --runtime=500ms"
        f" --size=512m --filename=/dev/nullb0 {WORKLOADS['read-write']}\n" + MERGES
    )
    schedulers = tuple(HOOKS)
    # fios' own count of the queue re-runs its completions asked for, and of its requests
    own_counts = {
        "fios": "grep -E '^(kicks|reads|writes) ' /sys/block/nullb0/queue/iosched/stats\n"
    }
    for workload, jobs in WORKLOADS.items():
        for r in range(rounds):
            for scheduler in schedulers[r % 2 :] + schedulers[: r % 2]:
                label = f"hooks/{workload}/{scheduler}/{r}"
                out += (
                    f"echo {scheduler} > /sys/block/nullb0/queue/scheduler\n"
                    f"echo > {TRACING}/trace\necho 1 > {TRACING}/tracing_on\n"
                    "fio --eta=never --output-format=json+ --output=/tmp/out.json"
                    " --lat_percentiles=1 --clat_percentiles=0"
                    f" --randrepeat=0 --norandommap --direct=1 --time_based --runtime={ms}ms"
                    f" --size=512m --filename=/dev/nullb0 {jobs}\n"
                    f"echo 0 > {TRACING}/tracing_on\n"
                    f"echo BLKPILOT-RESULT-BEGIN {label}\ncat /tmp/out.json\n"
                    "echo BLKPILOT-RESULT-END\n"
                    f"echo BLKPILOT-STATS-BEGIN {label}\n"
                    f"grep overrun {TRACING}/per_cpu/cpu0/stats | tr -d :\n"
                    + own_counts.get(scheduler, "")
                    + f"{REDUCE} {TRACING}/trace\n"
                    "echo BLKPILOT-STATS-END\n"
                )
    out += f"echo nop > {TRACING}/current_tracer\n"
    out += "echo none > /sys/block/nullb0/queue/scheduler\nrmmod fios\n"
    out += "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
    return out


def _quantile(histogram: dict[int, int], q: float) -> float:
    """The q-quantile in ns of a bucket histogram (bucket b < 1000: b*10 ns wide 10 ns;
    else (b - 1000) µs wide 1 µs), at the bucket's middle."""
    total = sum(histogram.values())
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= q * total:
            return bucket * 10 + 5.0 if bucket < 1000 else (bucket - 1000) * 1000 + 500.0
    return 0.0


def summarize(
    parsed: dict[str, fio_jobs.FioResult], stats: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Per workload and scheduler: requests, and per hook its calls per request and median
    (and p90) duration over every run's calls; a request's cost (the sum of calls per request
    times median) and fios' cost as a ratio of mq-deadline's."""
    histograms: dict[tuple[str, str], dict[str, dict[int, int]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(int))
    )
    requests: dict[tuple[str, str], int] = defaultdict(int)
    lost: dict[tuple[str, str], int] = defaultdict(int)
    own: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for label, counters in stats.items():
        if not label.startswith("hooks/"):
            continue
        _, workload, scheduler, _round = label.split("/")
        key = (workload, scheduler)
        if int(counters.get("overrun", "0")):
            lost[key] += 1  # the buffer was too small for this run: its counts are partial
            continue
        requests[key] += sum(t.ios for t in parsed[label].tasks)
        for name, count in counters.items():
            if name.startswith("h."):
                hook, bucket = name[len("h.") :].rsplit(".", 1)
                if hook in HOOKS[scheduler]:  # else tracing was not limited to the hooks
                    histograms[key][hook][int(bucket)] += int(count)
            elif name in ("kicks", "reads", "writes"):
                own[key][name] += int(count)
    setup = stats.get("hooks-setup", {})
    summary: dict[str, Any] = {
        # hooks the kernel could not trace (inlined or renamed): their cost is not counted
        "untraceable": sorted(k[len("missing_") :] for k in setup if k.startswith("missing_")),
    }
    for (workload, scheduler), hooks in sorted(histograms.items()):
        n = requests[(workload, scheduler)]
        summary.setdefault(workload, {})[scheduler] = {
            "requests": n,
            "runs_lost": lost[(workload, scheduler)],
            "hooks": {
                hook: {
                    "calls": sum(h.values()),
                    "per_request": round(sum(h.values()) / n, 3) if n else 0.0,
                    "median_ns": _quantile(h, 0.5),
                    "p90_ns": _quantile(h, 0.9),
                }
                for hook, h in sorted(hooks.items())
            },
        }
        counts = own.get((workload, scheduler))
        if counts and counts["reads"] + counts["writes"]:
            # the scheduler's own count: queue re-runs per request it dispatched
            summary[workload][scheduler]["kicks_per_request"] = round(
                counts["kicks"] / (counts["reads"] + counts["writes"]), 3
            )
    for workload, cases in summary.items():
        if workload != "untraceable":
            _costs(cases)
    # merges of a sequential reader's and writer's bios under fios (MERGES)
    summary["merges"] = {k: int(v) for k, v in stats.get("merges/fios", {}).items()}
    return summary


def _costs(cases: dict[str, Any]) -> None:
    """A request's cost per scheduler: the sum over hooks of calls per request times median,
    as timed, and above the tracer's own cost per call (the floor: the cheapest hook's median
    in this workload, a hook that returns at once), which every call pays and which would
    otherwise count a scheduler's number of hooks as its cost."""
    floor = min(hook["median_ns"] for case in cases.values() for hook in case["hooks"].values())
    for case in cases.values():
        hooks = case["hooks"].values()
        case["per_request_ns"] = round(sum(h["per_request"] * h["median_ns"] for h in hooks), 1)
        case["above_floor_ns"] = round(
            sum(h["per_request"] * max(h["median_ns"] - floor, 0.0) for h in hooks), 1
        )
    cases["floor_ns"] = floor
    if "fios" in cases and "mq-deadline" in cases:
        for key in ("per_request_ns", "above_floor_ns"):
            if cases["mq-deadline"][key]:
                cases[f"fios_over_mq_deadline_{key[: -len('_ns')]}"] = round(
                    cases["fios"][key] / cases["mq-deadline"][key], 2
                )
