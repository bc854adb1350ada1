"""Named workloads that reproduce the papers' matrices.

- HotStorage '23 ("Do we still need I/O schedulers?"): single-tenant, one process at QD 1-128,
  and multi-tenant, 1-128 processes at QD 1, each for random read, random write and a 50/50
  mix at 4 KB; plus half the processes reading 4 KB and half reading 8 KB.
- HotStorage '22 (polling vs interrupts, energy): synchronous reads of 1-128 KB with 1-64
  threads, with interrupts (psync) and with classic polling (io_uring IOPOLL).
- FAST '12 (FIOS): 1 reader + 1 writer, 4 + 4, 4 + 4 with exponential thinktime, and a 4 KB
  reader against a 128 KB reader.
- RocksDB db_bench readrandom: 16-byte keys, 4 KB values, no compression.
"""

from __future__ import annotations

from agent.contract.workloads import (
    DbBenchSpec,
    IOEngine,
    IOPattern,
    JobSpec,
    WorkloadSpec,
)

DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)
SYNC_SIZES_KB = (1, 2, 4, 8, 16, 32, 64, 128)
THREADS = (1, 2, 4, 8, 16, 32, 64)
MIXES = {
    "randread": (IOPattern.RANDREAD, 1.0),
    "randwrite": (IOPattern.RANDWRITE, 0.0),
    "randrw50": (IOPattern.RANDRW, 0.5),
}


def _job(name: str, mix: str, *, qd: int = 1, tasks: int = 1, size: int = 4096) -> JobSpec:
    pattern, read_share = MIXES[mix]
    return JobSpec(
        name=name,
        pattern=pattern,
        read_share=read_share,
        block_sizes={size: 100},
        queue_depth=qd,
        tasks=tasks,
    )


def hotstorage23() -> list[WorkloadSpec]:
    found = []
    for mix in MIXES:
        for qd in DEPTHS:
            found.append(
                WorkloadSpec(name=f"hs23-single-{mix}-4k-qd{qd}", jobs=[_job("app", mix, qd=qd)])
            )
        for tasks in DEPTHS:
            found.append(
                WorkloadSpec(
                    name=f"hs23-multi-{mix}-4k-p{tasks}", jobs=[_job("app", mix, tasks=tasks)]
                )
            )
    for tasks in DEPTHS[1:]:
        half = tasks // 2
        found.append(
            WorkloadSpec(
                name=f"hs23-multi-read-4k8k-p{tasks}",
                jobs=[
                    _job("read4k", "randread", tasks=half),
                    _job("read8k", "randread", tasks=half, size=8192),
                ],
            )
        )
    return found


def hotstorage22() -> list[WorkloadSpec]:
    found = []
    for engine, label in ((IOEngine.PSYNC, "irq"), (IOEngine.IO_URING_POLL, "poll")):
        for size_kb in SYNC_SIZES_KB:
            for threads in THREADS:
                found.append(
                    WorkloadSpec(
                        name=f"hs22-syncread-{size_kb}k-t{threads}-{label}",
                        engine=engine,
                        jobs=[_job("reader", "randread", tasks=threads, size=size_kb * 1024)],
                    )
                )
    return found


# flashsim's read service time in the lab (250 µs + 4 KiB at 2 µs/KiB): the think time of the
# "think" case is near it, so that a reader's next request comes about when FIOS's
# anticipation window (T_service * alpha / (1 - alpha), alpha 0.5) closes
READ_SERVICE_US = 258


def fios() -> list[WorkloadSpec]:
    """FAST '12's cases, then harder ones beyond the paper."""
    reader = JobSpec(name="reader")
    writer = JobSpec(name="writer", pattern=IOPattern.RANDWRITE, read_share=0.0)

    # a closed loop that thinks about a read's service time after each I/O (the paper's
    # Figure 3 setup). Not a Poisson rate: fio's rate_iops caps the rate, and a cap above what
    # the task reaches (10,000/s against ~3,000) left no think time at all
    def thinking(job: JobSpec) -> JobSpec:
        return job.model_copy(update={"tasks": 4, "thinktime_us": READ_SERVICE_US})

    return [
        WorkloadSpec(name="fios-1r1w", engine=IOEngine.PSYNC, jobs=[reader, writer]),
        WorkloadSpec(
            name="fios-4r4w",
            engine=IOEngine.PSYNC,
            jobs=[reader.model_copy(update={"tasks": 4}), writer.model_copy(update={"tasks": 4})],
        ),
        WorkloadSpec(
            name="fios-4r4w-think", engine=IOEngine.PSYNC, jobs=[thinking(reader), thinking(writer)]
        ),
        WorkloadSpec(
            name="fios-4k-vs-128k",
            engine=IOEngine.PSYNC,
            jobs=[JobSpec(name="small"), JobSpec(name="large", block_sizes={131072: 100})],
        ),
        # beyond the paper: writers with deep queues against QD1 readers
        WorkloadSpec(
            name="fios-deep-writers",
            engine=IOEngine.LIBAIO,
            jobs=[
                reader.model_copy(update={"tasks": 2}),
                writer.model_copy(update={"tasks": 2, "queue_depth": 16}),
            ],
        ),
        # a reader that thinks 1 ms between reads (longer than any anticipation window)
        # against four writers
        WorkloadSpec(
            name="fios-1r-think1ms-4w",
            engine=IOEngine.PSYNC,
            jobs=[
                reader.model_copy(update={"thinktime_us": 1000}),
                writer.model_copy(update={"tasks": 4}),
            ],
        ),
        # deceptive idleness' hard case: a reader that stops for 50 ms after every 200 ms of
        # I/O (fio's thinktime_iotime) against four writers — its pauses are not think time
        WorkloadSpec(
            name="fios-1r-pause50ms-4w",
            engine=IOEngine.PSYNC,
            jobs=[
                reader.model_copy(update={"thinktime_us": 50_000, "thinktime_every_us": 200_000}),
                writer.model_copy(update={"tasks": 4}),
            ],
        ),
        # one reader against seven writers: its p99 and maximum latency
        WorkloadSpec(
            name="fios-1r7w",
            engine=IOEngine.PSYNC,
            jobs=[reader, writer.model_copy(update={"tasks": 7})],
        ),
    ]


def rocksdb() -> list[WorkloadSpec]:
    return [WorkloadSpec(name="rocksdb-readrandom", tool="db_bench", db_bench=DbBenchSpec())]


def library() -> dict[str, WorkloadSpec]:
    everything = [*hotstorage23(), *hotstorage22(), *fios(), *rocksdb()]
    return {workload.name: workload for workload in everything}
