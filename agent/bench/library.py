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
    Arrival,
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


def fios() -> list[WorkloadSpec]:
    reader = JobSpec(name="reader")
    writer = JobSpec(name="writer", pattern=IOPattern.RANDWRITE, read_share=0.0)

    # thinktime about equal to the I/O's own service time, as in the paper's Figure 3 setup
    def thinking(job: JobSpec) -> JobSpec:
        return job.model_copy(update={"tasks": 4, "thinktime_us": 100, "arrival": Arrival.POISSON})

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
    ]


def rocksdb() -> list[WorkloadSpec]:
    return [WorkloadSpec(name="rocksdb-readrandom", tool="db_bench", db_bench=DbBenchSpec())]


def library() -> dict[str, WorkloadSpec]:
    everything = [*hotstorage23(), *hotstorage22(), *fios(), *rocksdb()]
    return {workload.name: workload for workload in everything}
