// SPDX-License-Identifier: GPL-2.0
/*
 * blklat: per device, operation and request-size class (log2 bytes), histograms of device
 * time (issue -> completion) and queue time (insert -> issue, where the request passes through
 * a scheduler's insert), from the block layer's BTF tracepoints — in the conventions of bcc's biolatency and
 * libbpf-tools, with finer buckets: a power of two split into 8 linear sub-buckets (at most
 * 12.5 % wide), so that percentiles can be compared between canary intervals.
 *
 * CO-RE without vmlinux.h: the few kernel fields read are declared below with
 * preserve_access_index and relocated by libbpf against the running kernel's BTF.
 * Histograms are cumulative; the agent takes differences per window.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define MAX_SLOTS 320
#define REQ_OP_MASK 0xff

/* device: issue -> completion; queue: insert -> issue; total: insert (or issue, for a request
 * that never waited in a scheduler) -> completion, what the block layer costs the caller */
enum kind { KIND_DEVICE = 0, KIND_QUEUE = 1, KIND_TOTAL = 2 };
enum op { OP_READ = 0, OP_WRITE = 1, OP_FLUSH = 2, OP_DISCARD = 3, OP_OTHER = 4 };

struct gendisk {
	int major;
	int first_minor;
} __attribute__((preserve_access_index));

struct request_queue {
	struct gendisk *disk;
} __attribute__((preserve_access_index));

struct request {
	struct request_queue *q;
	unsigned int cmd_flags;
	unsigned int __data_len;
} __attribute__((preserve_access_index));

struct hist_key {
	__u32 dev;	/* MKDEV(major, minor): major << 20 | minor */
	__u8 op;
	__u8 kind;
	__u8 size;	/* log2 of the request's bytes */
	__u8 pad;
};

struct hist {
	__u64 slots[MAX_SLOTS];
	__u64 count;
	__u64 sum;	/* ns for latencies, bytes for sizes */
};

struct issue {
	__u64 ts;
	__u64 start;	/* insert, or issue */
	__u32 bytes;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} inserted SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct issue);
} issued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct hist_key);
	__type(value, struct hist);
} hists SEC(".maps");

static struct hist zero;

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r, shift;

	r = (v > 0xFFFFFFFF) << 5;
	v >>= r;
	shift = (v > 0xFFFF) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

/* 0..7 exactly; above, 8 linear sub-buckets per power of two */
static __always_inline __u32 latency_slot(__u64 v)
{
	__u32 l, s;

	if (v < 8)
		return v;
	l = log2_u64(v);
	s = (l - 2) * 8 + ((v >> (l - 3)) & 7);
	return s < MAX_SLOTS ? s : MAX_SLOTS - 1;
}

static __always_inline __u32 size_slot(__u64 bytes)
{
	return bytes ? log2_u64(bytes) : 0;
}

static __always_inline __u32 dev_of(struct request *rq)
{
	struct gendisk *disk = BPF_CORE_READ(rq, q, disk);

	if (!disk)
		return 0;
	return ((__u32)BPF_CORE_READ(disk, major) << 20) | (__u32)BPF_CORE_READ(disk, first_minor);
}

static __always_inline __u8 op_of(struct request *rq)
{
	__u32 op = BPF_CORE_READ(rq, cmd_flags) & REQ_OP_MASK;

	return op <= OP_DISCARD ? op : OP_OTHER;
}

static __always_inline void record(__u32 dev, __u8 op, __u8 kind, __u32 bytes, __u32 slot,
				   __u64 value)
{
	struct hist_key key = { .dev = dev, .op = op, .kind = kind, .size = size_slot(bytes) };
	struct hist *h;

	h = bpf_map_lookup_elem(&hists, &key);
	if (!h) {
		bpf_map_update_elem(&hists, &key, &zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, &key);
		if (!h)
			return;
	}
	if (slot >= MAX_SLOTS)
		slot = MAX_SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum, value);
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(blklat_insert, struct request *rq)
{
	__u64 key = (__u64)rq, ts = bpf_ktime_get_ns();

	bpf_map_update_elem(&inserted, &key, &ts, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(blklat_issue, struct request *rq)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();
	struct issue value = { .ts = now, .start = now, .bytes = BPF_CORE_READ(rq, __data_len) };
	__u64 *queued = bpf_map_lookup_elem(&inserted, &key);

	if (queued) {
		if (now > *queued)
			value.start = *queued;
		if (now > *queued)
			record(dev_of(rq), op_of(rq), KIND_QUEUE, value.bytes,
			       latency_slot(now - *queued), now - *queued);
		bpf_map_delete_elem(&inserted, &key);
	}
	bpf_map_update_elem(&issued, &key, &value, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(blklat_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns(), delta, total;
	struct issue *started = bpf_map_lookup_elem(&issued, &key);
	__u32 dev;
	__u8 op;

	if (!started)
		return 0;
	delta = now > started->ts ? now - started->ts : 0;
	total = now > started->start ? now - started->start : 0;
	dev = dev_of(rq);
	op = op_of(rq);
	record(dev, op, KIND_DEVICE, started->bytes, latency_slot(delta), delta);
	record(dev, op, KIND_TOTAL, started->bytes, latency_slot(total), total);
	bpf_map_delete_elem(&issued, &key);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
