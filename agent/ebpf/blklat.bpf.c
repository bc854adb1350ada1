// SPDX-License-Identifier: GPL-2.0
/*
 * blklat: per device, operation and request-size class (log2 bytes), histograms of device
 * time (issue -> completion) and queue time (insert -> issue, where the request passes through
 * a scheduler's insert), from the block layer's BTF tracepoints — in the conventions of bcc's biolatency and
 * libbpf-tools, with finer buckets: a power of two split into 8 linear sub-buckets (at most
 * 12.5 % wide), so that percentiles can be compared between canary intervals.
 *
 * CO-RE without vmlinux.h: the few kernel fields read are declared below with
 * preserve_access_index and relocated by libbpf against the running kernel's BTF. The
 * programs are tp_btf, so those fields are read directly through the typed request pointer,
 * not with bpf_probe_read_kernel (BPF_CORE_READ): that, and timestamps written in place in one
 * entry per request instead of a hash-map update and delete per I/O, took the programs from
 * about 1,100 to about 470 ns per I/O on this machine (bench/agent_footprint.py --load).
 * The bio's submission time in the task's own storage rather than a hash of bios: 780 to
 * 540 ns per I/O with it (bench/results/agent_footprint.md). A direct-mapped table of
 * requests instead of an LRU hash, and one histogram lookup per completion instead of two:
 * 541-554 to 445-449 ns without a scheduler, 743 to 628 with mq-deadline, of which about 65 ns
 * per program run is kernel.bpf_stats' own timing (an empty program measures that much).
 * Histograms are cumulative; the agent takes differences per window.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define MAX_SLOTS 320
#define REQ_OP_MASK 0xff

/* device: issue -> completion; queue: insert -> issue; total: the submission of the request's
 * first bio (block_bio_queue) -> completion — what the application waits, a wait for a tag
 * under a depth limit included, which insert -> completion misses (a depth-limited candidate
 * looked 71 % faster while pgbench saw nothing) — or, for a request no bio of which was seen
 * (passthrough, flushes the block layer makes), insert or issue -> completion */
enum kind { KIND_DEVICE = 0, KIND_QUEUE = 1, KIND_TOTAL = 2 };
enum op { OP_READ = 0, OP_WRITE = 1, OP_FLUSH = 2, OP_DISCARD = 3, OP_OTHER = 4 };

struct gendisk {
	int major;
	int first_minor;
} __attribute__((preserve_access_index));

struct request_queue {
	struct gendisk *disk;
} __attribute__((preserve_access_index));

struct bio;

struct request {
	struct request_queue *q;
	unsigned int cmd_flags;
	unsigned int __data_len;
	struct bio *bio;
} __attribute__((preserve_access_index));

struct hist_key {
	__u32 dev;	/* MKDEV(major, minor): major << 20 | minor */
	__u8 op;
	__u8 size;	/* log2 of the request's bytes */
	__u16 pad;
};

struct hist {
	__u64 slots[MAX_SLOTS];
	__u64 count;
	__u64 sum;	/* ns */
};

/* a (device, operation, size) key's three histograms, one per kind: a completion records
 * device and total time under one lookup */
struct hists {
	struct hist kind[3];
};

/* one entry per request, written in place: requests are recycled from each queue's tag set,
 * so an issue or a completion costs an array lookup the verifier inlines — not a hash-map
 * update and delete (those were two thirds of the programs' time), nor an LRU hash lookup (a
 * third of what was left: 545 ns per I/O with the LRU hash). The entry is the slot of a
 * direct-mapped table chosen by the request's address and names its owner: a request whose
 * slot another in-flight request took (two of the requests in flight at one time hashing
 * alike: about in_flight / REQUEST_SLOTS of them) is not timed, and counted as displaced. */
#define REQUEST_SLOTS_LOG2 17
#define REQUEST_SLOTS (1U << REQUEST_SLOTS_LOG2)

struct started {
	__u64 owner;	/* the request's address */
	__u64 submit;	/* its first bio's submission; 0: not seen */
	__u64 insert;	/* 0: not inserted into a scheduler since it last completed */
	__u64 issue;	/* 0: not issued */
	__u32 bytes;
	__u32 pad;
};

/* the submitting task's last PENDING bios and their submission times, in the task's own
 * storage, until a request made of one is inserted or issued — by that same task, which is
 * where the block layer inserts (and, without a scheduler, issues) what a task submits, its
 * plug's batch included. A task-storage lookup is a pointer away; the hash of bios it replaced
 * (an LRU update per bio, a lookup and a delete per request) was most of the programs' cost.
 * A request inserted or issued elsewhere (kblockd, a requeue), or whose bio was pushed out of
 * the ring, is timed from its insert or issue; a timestamp older than MAX_WAIT_NS is not
 * believed. */
#define PENDING 8
#define MAX_WAIT_NS (60ULL * 1000 * 1000 * 1000)

struct pending {
	__u64 bio[PENDING];
	__u64 at[PENDING];
	__u32 next;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending);
} submitted SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, REQUEST_SLOTS);
	__type(key, __u32);
	__type(value, struct started);
} requests SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} scratch SEC(".maps");

/* [0]: requests not timed because another in-flight request took their slot */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} displaced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);	/* 7.7 KB a key: only the keys seen take memory */
	__type(key, struct hist_key);
	__type(value, struct hists);
} hists SEC(".maps");

static struct hists zero;

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
	struct gendisk *disk = rq->q->disk;

	if (!disk)
		return 0;
	return ((__u32)disk->major << 20) | (__u32)disk->first_minor;
}

static __always_inline __u8 op_of(struct request *rq)
{
	__u32 op = rq->cmd_flags & REQ_OP_MASK;

	return op <= OP_DISCARD ? op : OP_OTHER;
}

static __always_inline struct hists *hists_of(__u32 dev, __u8 op, __u32 bytes)
{
	struct hist_key key = { .dev = dev, .op = op, .size = size_slot(bytes) };
	struct hists *h;

	h = bpf_map_lookup_elem(&hists, &key);
	if (h)
		return h;
	bpf_map_update_elem(&hists, &key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&hists, &key);
}

static __always_inline void add(struct hist *h, __u64 value)
{
	__u32 slot = latency_slot(value);

	if (slot >= MAX_SLOTS)
		slot = MAX_SLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum, value);
}

/* a pointer's value as a number: the verifier allows no arithmetic but adding to a pointer, and
 * a value read back from a map is a number (storing a kernel address in a map needs what the
 * agent has anyway: CAP_PERFMON) */
static __always_inline __u64 address_of(void *pointer)
{
	__u32 zero_key = 0;
	__u64 *cell = bpf_map_lookup_elem(&scratch, &zero_key);

	if (!cell)
		return 0;
	*(volatile __u64 *)cell = (__u64)pointer;
	return *(volatile __u64 *)cell;
}

static __always_inline struct started *slot_of(struct request *rq, __u64 *owner)
{
	/* Fibonacci hashing of the address: requests sit a few hundred bytes apart in their tag
	 * set's pages, and the multiply spreads them over the whole table */
	__u32 index;

	*owner = address_of(rq);
	index = (*owner * 0x9E3779B97F4A7C15ULL) >> (64 - REQUEST_SLOTS_LOG2);
	return bpf_map_lookup_elem(&requests, &index);
}

static __always_inline void count_displaced(void)
{
	__u32 zero_key = 0;
	__u64 *n = bpf_map_lookup_elem(&displaced, &zero_key);

	if (n)
		__sync_fetch_and_add(n, 1);
}

/* the request's entry, taken for it if another request held the slot (whose own timing is
 * lost then, and counted, if it was still in flight) */
static __always_inline struct started *entry(struct request *rq)
{
	__u64 owner;
	struct started *s = slot_of(rq, &owner);

	if (!s || !owner)
		return 0;
	if (s->owner != owner) {
		if (s->issue || s->insert)
			count_displaced();
		s->owner = owner;
		s->submit = 0;
		s->insert = 0;
		s->issue = 0;
	}
	return s;
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(blklat_bio_queue, struct bio *bio)
{
	struct pending *p;
	__u32 i;

	p = bpf_task_storage_get(&submitted, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
		return 0;
	i = p->next++ % PENDING;
	p->bio[i] = (__u64)bio;
	p->at[i] = bpf_ktime_get_ns();
	return 0;
}

/* the request's first bio's submission time, once: taken from the submitting task's ring at
 * insert or issue */
static __always_inline void take_submit(struct started *s, struct request *rq, __u64 now)
{
	__u64 key;
	struct pending *p;
	__u32 i;

	if (s->submit)
		return;
	key = (__u64)rq->bio;
	if (!key)
		return;
	p = bpf_task_storage_get(&submitted, bpf_get_current_task_btf(), 0, 0);
	if (!p)
		return;
	for (i = 0; i < PENDING; i++) {
		if (p->bio[i] != key)
			continue;
		if (p->at[i] <= now && now - p->at[i] < MAX_WAIT_NS)
			s->submit = p->at[i];
		p->bio[i] = 0;
		return;
	}
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(blklat_insert, struct request *rq)
{
	__u64 now = bpf_ktime_get_ns();
	struct started *s = entry(rq);

	if (!s)
		return 0;
	s->insert = now;
	take_submit(s, rq, now);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(blklat_issue, struct request *rq)
{
	__u64 now = bpf_ktime_get_ns();
	struct started *s = entry(rq);
	__u32 bytes = rq->__data_len;

	if (!s)
		return 0;
	take_submit(s, rq, now);
	if (s->insert && now > s->insert) {
		struct hists *h = hists_of(dev_of(rq), op_of(rq), bytes);

		if (h)
			add(&h->kind[KIND_QUEUE], now - s->insert);
	}
	s->issue = now;
	s->bytes = bytes;
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(blklat_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	__u64 now = bpf_ktime_get_ns(), delta, total, begin;
	__u64 owner;
	struct started *s = slot_of(rq, &owner);
	struct hists *h;

	if (!s || !owner || s->owner != owner)
		return 0;	/* not seen, or displaced (counted when it was) */
	if (!s->issue) {	/* ended before it was issued: nothing to time, nothing left behind */
		s->insert = 0;
		s->submit = 0;
		return 0;
	}
	begin = s->insert && s->insert < s->issue ? s->insert : s->issue;
	if (s->submit && s->submit < begin)
		begin = s->submit;
	delta = now > s->issue ? now - s->issue : 0;
	total = now > begin ? now - begin : 0;
	s->submit = 0;
	s->insert = 0;
	s->issue = 0;
	h = hists_of(dev_of(rq), op_of(rq), s->bytes);
	if (!h)
		return 0;
	add(&h->kind[KIND_DEVICE], delta);
	add(&h->kind[KIND_TOTAL], total);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
