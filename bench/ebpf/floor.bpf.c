// SPDX-License-Identifier: GPL-2.0
/*
 * Empty programs on the tracepoints blklat.bpf.c uses: what kernel.bpf_stats_enabled counts
 * for a program that does nothing (the trampoline and the statistics' own clock reads), so
 * that bench/agent_footprint.py can say how much of blklat's measured time per I/O is the
 * measurement's.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct bio;
struct request;

SEC("tp_btf/block_bio_queue")
int BPF_PROG(floor_bio_queue, struct bio *bio)
{
	return 0;
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(floor_insert, struct request *rq)
{
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(floor_issue, struct request *rq)
{
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(floor_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
