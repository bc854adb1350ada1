// SPDX-License-Identifier: GPL-2.0
/*
 * FIOS: a fair, efficient flash I/O scheduler for blk-mq
 * (Park and Shen, "FIOS: A Fair, Efficient Flash I/O Scheduler", FAST '12).
 *
 * Tasks are io_contexts (processes). The four techniques of the paper:
 *
 * 1. Epoch-based equal timeslices. Every task gets `timeslice_us` of device time per epoch,
 *    which it may use in fragments and concurrently with other tasks. A task whose slice is
 *    used up waits for the next epoch. An epoch ends when no task with slice left has queued
 *    requests, and none of them has a request on the device or is being anticipated.
 * 2. Read preference with write blocking (`read_preference`): queued reads of eligible tasks
 *    go first, and no write is issued while reads are outstanding on the device — on a device
 *    whose writes cost at least twice its reads (fios_reads_first).
 * 3. Parallel issue: requests of every eligible task are issued while the device holds fewer
 *    than `max_depth` of them.
 * 4. Fairness-oriented anticipation: when idling is needed for fairness — a write would be
 *    issued although a task with slice left has just completed a read, or the epoch would
 *    end although a task with slice left has just completed a request — the device idles
 *    until that task's next request, for at most T_service * alpha / (1 - alpha) after its
 *    completion (T_service: the task's moving average issue-to-completion time). The idle
 *    time is charged to that task. The decision is taken when the write or the epoch switch is
 *    about to happen, not at the completion: on a fast device the task is usually still
 *    between two requests then, and that gap is the deceptive idleness to bridge. Like read
 *    preference, only on a device whose writes cost at least twice its reads (fios_keep_epoch).
 *
 * Cost of a request: with all four calibrated costs set (read and write, 4 KiB and 128 KiB,
 * in ns) and rising with size, a linear model in the request size, charged at issue; otherwise
 * (fios_cost_problem says why in the stats) the elapsed time
 * from issue to completion divided by the number of requests on the device at issue
 * (the paper's equation 1), charged at completion.
 *
 * Weighing the idle time (beyond the paper, `weigh_idle`, on by default): a read behind a
 * 4 ms write makes a ~4 ms window, and a reader thinking 1 ms is waited for on every read,
 * each idle millisecond charged to it: its slice goes in a burst, and the read that finds it
 * spent waits out everyone else's. So a read is anticipated only while idling costs its task
 * less than waiting behind a write would (fios_idle_pays).
 *
 * Write depth (beyond the paper): a task that is not waited for finds on the device every
 * write issued meanwhile; on flash whose
 * writes hold every unit that is one write's full time per write in flight. So while the
 * task that last completed a read is due back (less than twice its mean think time since),
 * at most `write_depth` writes (default 1, 0: no limit) are on the device.
 *
 * Lending (beyond the paper, `lend_permille`, calibrated costs only): an epoch kept open for a
 * task with slice left that cannot fill the device (one reader at queue depth 1, say) idles
 * what it does not use, and tasks whose slice is spent wait for it. While every such task is
 * served within its share — its requests' mean latency over their calibrated cost, its
 * slowdown, at most lend_permille / 1000 of the epoch's slices over its own (the paper's
 * proportional slowdown) — a spent task's request goes on lent time, charged to no one; and
 * while the reader due back is within its share, writes are not held at write_depth. A task
 * that falls behind its share closes both at once. 0: never lend (the paper's).
 *
 * Every task is charged, requests without an io_context too (to one shared account, which
 * gets a slice like any task); a charge is never more than one timeslice (a large discard
 * would otherwise shut its task out for epochs), and a requeued request's charge is refunded
 * (it is charged again when it is issued again).
 *
 * Weights: a task's slice is scaled by its I/O priority (weight / 4: best effort level L
 * weighs 8 - L) and by its cgroup's io.fios.weight / 100 (cgroup v2; fios' own blkcg policy,
 * per-cgroup data only: io.weight belongs to blk-iocost). Both are read at each request.
 *
 * Depth: asynchronous requests and writes may take at most `async_depth` of the scheduler's
 * tags (default 3/4 of nr_requests, as mq-deadline), so that synchronous reads always find a
 * tag and reach FIOS instead of blocking in tag allocation behind writers.
 *
 * Per-request state, only in requests whose elv fields prepare_request made ours
 * (RQF_ELVPRIV; a flush sequence reuses those fields): priv[0] the issue time in units of
 * 1,024 ns as an unsigned long (compared modulo its width: on 32-bit it wraps after 73 minutes,
 * far beyond any request's life), priv[1] flags and the parallelism at issue.
 *
 * Locking: fd->lock, taken with interrupts disabled (completions and the anticipation timer
 * run in hard interrupt context). Per-task state lives in the io_cq, which the block layer
 * keeps alive while a request of the task holds its io_context; exit_icq drops every other
 * reference (the anticipation target) under fd->lock.
 */

#include <linux/blkdev.h>
#include <linux/blk-mq.h>
#include <linux/blktrace_api.h>
#include <linux/hrtimer.h>
#include <linux/iocontext.h>
#include <linux/ioprio.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/math64.h>
#include <linux/module.h>
#include <linux/rbtree.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>

#include "elevator.h"
#include "blk.h"
#include "blk-mq.h"
#include "blk-mq-sched.h"
#include "blk-mq-debugfs.h"
#include "blk-cgroup.h"

#define FIOS_DEFAULT_TIMESLICE_US 100000 /* the paper's (and CFQ's) 100 ms */
#define FIOS_DEFAULT_ALPHA_PERMILLE 500	 /* the paper's alpha = 0.5 */
#define FIOS_DEFAULT_MAX_DEPTH 32	 /* the paper's SFQ(D) depth */
#define FIOS_DEFAULT_WRITE_DEPTH 1
#define FIOS_DEFAULT_LEND_PERMILLE 1500 /* while each holder is within FAST '12's bound */
#define FIOS_MAX_LEND_PERMILLE 10000
#define FIOS_SLOWDOWN_SHIFT 8		/* task->slowdown: fixed point, 256 = as fast as alone */
#define FIOS_MAX_SLOWDOWN BIT(24)
#define FIOS_MAX_ALPHA_PERMILLE 990
#define FIOS_MIN_TIMESLICE_US 100
#define FIOS_MAX_TIMESLICE_US 1000000
#define FIOS_MAX_DEPTH 256
#define FIOS_MAX_COST_NS 100000000ULL
#define FIOS_TIME_SHIFT 10 /* priv[0] time unit: 1,024 ns */
#define FIOS_DEFAULT_WEIGHT 4 /* best effort, level 4: what nice 0 maps to */
#define FIOS_CG_DEFAULT_WEIGHT 100 /* io.fios.weight: cgroup v2's weight range and default */
#define FIOS_CG_MIN_WEIGHT 1
#define FIOS_CG_MAX_WEIGHT 10000

/* rq->elv.priv[1] flags; priv[0] holds the issue time in ns */
#define FIOS_RQ_INFLIGHT 0x2UL /* issued, completion not seen yet */
#define FIOS_RQ_CHARGED 0x4UL  /* cost charged at issue (calibrated model) */
#define FIOS_RQ_LENT 0x8UL     /* issued on lent time: charged to no one (lending) */
#define FIOS_RQ_PAR_SHIFT 8    /* parallelism at issue */

/*
 * Calibrated costs that no longer hold: a request alone on the device that took more than
 * FIOS_DRIFT times its calibrated cost, or less than 1/FIOS_DRIFT of it, is counted
 * (stats: cost_drift), and debugfs state shows the moving ratio per direction. A starved
 * guest's reads took 8-19 times the costs calibrated on a quiet one.
 */
#define FIOS_DRIFT 4
#define FIOS_MAX_DRIFT_X256 (1000U << 8)

enum { FIOS_READ = 0, FIOS_WRITE = 1 };

/* read_preference */
enum { FIOS_READS_FIRST_NEVER, FIOS_READS_FIRST_COSTLIER, FIOS_READS_FIRST_ALWAYS };

/* why queued work waits (fd->wait_why), so that a completion re-runs the queue only if it
 * can let something go
 */
#define FIOS_WAIT_ANY 0x1    /* any completion (the device was full, or a task with slice
			      * left has requests on it and keeps the epoch)
			      */
#define FIOS_WAIT_READS 0x2  /* writes held while reads are on the device: the last read's */
#define FIOS_WAIT_WRITES 0x4 /* writes held at write_depth: a write's */
#define FIOS_WAIT_ANTIC 0x8  /* an anticipation: its end runs the queue, not a completion */

/* A task's place among those with requests of one direction queued, by slice left */
struct fios_place {
	struct rb_node node;		/* in fd->by_left[dir] while the task has such requests */
	s64 left;			/* its slice left when placed (fios_head checks it) */
	struct fios_task *task;
};

struct fios_task {
	struct list_head fifo[2];	/* queued requests, reads and writes */
	struct fios_place place[2];	/* by slice left, while it has reads / writes queued */
	struct list_head active_node;	/* on fd->active while it has queued requests */
	struct list_head busy_node;	/* on fd->busy from its first request on the device until
					 * fios_slice_holder_busy finds it with none (or it exits):
					 * not taken off and put back on at every request
					 */
	unsigned int queued[2];
	unsigned int inflight;
	u64 epoch;			/* the epoch `remaining_ns` belongs to */
	s64 remaining_ns;
	u64 service_ns;			/* the anticipation's T_service: EWMA of issue-to-completion
					 * time
					 */
	unsigned int weight;		/* from the I/O priority (default 4) */
	unsigned int cg_weight;		/* its cgroup's io.fios.weight (default 100): its slice
					 * is timeslice * weight/4 * cg_weight/100
					 */
	u64 last_done_ns;		/* when its last request on the device completed */
	u64 think_ns;			/* EWMA of the gap from there to its next request,
					 * pauses left out (fios_think)
					 */
	unsigned int long_gaps;		/* pauses in a row, for fios_think */
	u32 slowdown;			/* EWMA of its requests' latency (insert to completion)
					 * over their calibrated cost, << FIOS_SLOWDOWN_SHIFT
					 */
	pid_t pid;			/* its process id (debugfs, traces) */
	bool exited;			/* io_cq exited: never anticipate for it again */
	atomic_t refs;			/* its requests from prepare to finish, and one for the
					 * reference on its io_context it holds from its first
					 * request until its io_cq exits (see fios_prepare_request)
					 */
};

struct fios_icq {
	struct io_cq icq; /* must be first */
	struct fios_task task;
};

struct fios_stats {
	u64 epochs;
	u64 dispatched[2];
	u64 anticipations;
	u64 anticipation_hits;
	u64 anticipation_idle_ns;
	u64 writes_held;
	u64 refunds;
	u64 kicks;		/* queue re-runs by a completion or a requeue (kblockd work) */
	u64 timer_early;	/* the anticipation timer ran before the deadline it was set for */
	u64 debt_epochs;	/* second epochs started at once: every queued task owed more than
				 * a slice
				 */
	u64 rescues;		/* waits nothing could have ended (a bug): the oldest went */
	u64 lent;		/* requests issued on lent time (lending) */
	u64 cost_drift;		/* requests alone on the device that took over FIOS_DRIFT times,
				 * or under 1/FIOS_DRIFT of, their calibrated cost
				 */
};

struct fios_data {
	spinlock_t lock;		/* everything below but the tunables; irqs off */
	struct request_queue *q;
	struct list_head dispatch;	/* requeued / at-head requests: issued first */
	struct list_head active;	/* tasks with queued requests */
	struct rb_root_cached by_left[2]; /* the same, per direction, most slice left first */
	struct list_head busy;		/* tasks with requests on the device (and some without:
					 * see fios_task.busy_node)
					 */
	struct fios_task unowned;	/* requests without an io_context */
	unsigned int queued[2];
	unsigned int inflight[2];
	u64 epoch;
	u64 epoch_start_ns;
	u64 epoch_ns;			/* EWMA of an epoch's length (weigh_idle) */
	u64 write_cost_ns;		/* EWMA of a write's cost (weigh_idle) */
	u32 drift_x256[2];		/* per direction, EWMA of measured over calibrated cost of
					 * requests alone on the device, x256 (0: none yet)
					 */
	u64 epoch_floor_ns;		/* least slice left (>= 0) of a task charged this epoch,
					 * in a default-weight task's ns: what a newcomer gets,
					 * scaled by its weight
					 */
	u64 epoch_slices;		/* the slices of the tasks charged this epoch, and ... */
	u64 last_epoch_slices;		/* ... last epoch: the share a slice is of (fios_served) */
	bool waiting;			/* queued work may not go yet: has_work says no until an
					 * insert, a completion or the anticipation's end
					 */
	unsigned int wait_why;		/* FIOS_WAIT_*: which completions can end the wait */

	/* anticipation */
	struct {
		struct fios_task *task;
		u64 done_ns;
	} recent[2];			/* last completion: [FIOS_READ] of a read, [1] of any */
	struct {
		struct fios_task *task;
		u64 done_ns;
	} reader;			/* last read completed, slice left or not (write_depth) */
	struct hrtimer timer;
	struct fios_task *antic_task;
	bool antic_read;		/* waiting for a read (else: any request, epoch case) */
	u64 antic_start_ns;
	u64 antic_deadline_ns;

	/* tunables */
	u64 timeslice_ns;
	unsigned int alpha_permille;
	unsigned int read_preference;	/* 0 off, 1 where writes cost more (fios_reads_first),
					 * 2 always
					 */
	unsigned int max_depth;
	unsigned int write_depth;	/* writes on the device while a reader is due back
					 * (0: off)
					 */
	unsigned int lend_permille;	/* lend while holders are within this share (0: off) */
	bool weigh_idle;		/* anticipate a read only when idling costs its task less
					 * than waiting behind a write would (see fios_idle_pays)
					 */
	unsigned int async_depth;	/* tags async requests and writes may take */
	bool async_depth_set;		/* written by hand: kept when nr_requests changes */
	unsigned int word_shift;	/* the sched tags' bitmap word: 1 << word_shift tags */
	unsigned int shallow_depth;	/* async_depth as tags per word (how sbitmap limits) */
	u64 cost_ns[2][2];		/* [dir][0: 4 KiB, 1: 128 KiB]; all set = calibrated */

	struct fios_stats stats;
};

static inline struct fios_task *icq_to_task(struct io_cq *icq)
{
	return icq ? &container_of(icq, struct fios_icq, icq)->task : NULL;
}

static inline int rq_dir(struct request *rq)
{
	return rq_data_dir(rq) == READ ? FIOS_READ : FIOS_WRITE;
}

static struct fios_task *rq_task(struct fios_data *fd, struct request *rq)
{
	struct fios_task *task = icq_to_task(rq->elv.icq);

	return task ? task : &fd->unowned;
}

static void fios_task_init(struct fios_task *task)
{
	int dir;

	for (dir = 0; dir < 2; dir++) {
		INIT_LIST_HEAD(&task->fifo[dir]);
		RB_CLEAR_NODE(&task->place[dir].node);
		task->place[dir].task = task;
	}
	INIT_LIST_HEAD(&task->active_node);
	INIT_LIST_HEAD(&task->busy_node);
}

/*
 * The calibrated model is used only when its points make one: all four set, and each
 * direction's 128 KiB cost at least its 4 KiB cost (a line falling with size charged a 1 MiB
 * write 1 us). The agent checks its calibration before writing it (agent/calibrate.py); the
 * module checks again, since the tunables are written one at a time, by anyone. NULL: usable.
 */
static const char fios_costs_not_set[] = "not set";

static const char *fios_cost_problem(struct fios_data *fd)
{
	int dir;

	for (dir = 0; dir < 2; dir++)
		if (!fd->cost_ns[dir][0] || !fd->cost_ns[dir][1])
			return fios_costs_not_set;
	for (dir = 0; dir < 2; dir++)
		if (fd->cost_ns[dir][1] < fd->cost_ns[dir][0])
			return dir == FIOS_READ ? "read costs fall with size" :
						  "write costs fall with size";
	return NULL;
}

static bool fios_calibrated(struct fios_data *fd)
{
	return !fios_cost_problem(fd);
}

/* Linear in size through the 4 KiB and 128 KiB calibration points; never below 1 us. */
static u64 fios_model_cost(struct fios_data *fd, int dir, unsigned int bytes)
{
	s64 c4 = fd->cost_ns[dir][0], c128 = fd->cost_ns[dir][1];
	s64 cost = c4 + div_s64((c128 - c4) * ((s64)bytes - 4096), 131072 - 4096);

	return clamp_t(s64, cost, 1000, fd->timeslice_ns);
}

/*
 * The I/O priority as a weight: best effort level L weighs 8 - L (the default, level 4, 4;
 * level 0 twice that), real time twice its best-effort level, idle 1. A task's slice is
 * timeslice * weight / 4.
 */
static unsigned int fios_weight(int ioprio)
{
	unsigned int level = min_t(unsigned int, IOPRIO_PRIO_LEVEL(ioprio), 7);

	switch (IOPRIO_PRIO_CLASS(ioprio)) {
	case IOPRIO_CLASS_RT:
		return 2 * (8 - level);
	case IOPRIO_CLASS_BE:
		return 8 - level;
	case IOPRIO_CLASS_IDLE:
		return 1;
	default:
		return FIOS_DEFAULT_WEIGHT;
	}
}

static s64 fios_slice(struct fios_data *fd, struct fios_task *task)
{
	unsigned int weight = READ_ONCE(task->weight), cg_weight = READ_ONCE(task->cg_weight);

	/* most tasks weigh the default: their slice is the timeslice, with no division */
	if (likely(weight == FIOS_DEFAULT_WEIGHT && cg_weight == FIOS_CG_DEFAULT_WEIGHT))
		return fd->timeslice_ns;
	/* at most 1 s * 16 * 10000: far below 2^63 */
	return div_u64(fd->timeslice_ns * weight * cg_weight,
		       FIOS_DEFAULT_WEIGHT * FIOS_CG_DEFAULT_WEIGHT);
}

/* --- cgroup v2: io.fios.weight (a blkcg policy with per-cgroup data only) ----------------- */

#ifdef CONFIG_BLK_CGROUP
struct fios_cgd {
	struct blkcg_policy_data pd; /* must be first */
	unsigned int weight;
};

static struct blkcg_policy fios_blkcg_policy;

/* cgroups whose io.fios.weight is not the default: while there are none, a request does not
 * look its cgroup up (every weight is the default) — the fast path pays nothing for cgroups
 * nobody weighed
 */
static atomic_t fios_cg_weighted = ATOMIC_INIT(0);

static struct fios_cgd *cpd_to_fios(struct blkcg_policy_data *cpd)
{
	return cpd ? container_of(cpd, struct fios_cgd, pd) : NULL;
}

static struct fios_cgd *blkcg_to_fios(struct blkcg *blkcg)
{
	return blkcg ? cpd_to_fios(blkcg_to_cpd(blkcg, &fios_blkcg_policy)) : NULL;
}

/* The submitter's cgroup weight: a task's share follows the cgroup it submits from now. */
static unsigned int fios_cgroup_weight(void)
{
	unsigned int weight = FIOS_CG_DEFAULT_WEIGHT;
	struct fios_cgd *cgd;

	if (likely(!atomic_read(&fios_cg_weighted)))
		return weight;
	rcu_read_lock();
	cgd = blkcg_to_fios(css_to_blkcg(task_css(current, io_cgrp_id)));
	if (cgd)
		weight = READ_ONCE(cgd->weight);
	rcu_read_unlock();
	return weight;
}

static struct blkcg_policy_data *fios_cpd_alloc(gfp_t gfp)
{
	struct fios_cgd *cgd = kzalloc(sizeof(*cgd), gfp);

	if (!cgd)
		return NULL;
	cgd->weight = FIOS_CG_DEFAULT_WEIGHT;
	return &cgd->pd;
}

static void fios_cpd_free(struct blkcg_policy_data *cpd)
{
	struct fios_cgd *cgd = cpd_to_fios(cpd);

	if (cgd->weight != FIOS_CG_DEFAULT_WEIGHT)
		atomic_dec(&fios_cg_weighted);
	kfree(cgd);
}

static int fios_cg_weight_show(struct seq_file *sf, void *v)
{
	struct fios_cgd *cgd = blkcg_to_fios(css_to_blkcg(seq_css(sf)));

	seq_printf(sf, "default %u\n", cgd ? READ_ONCE(cgd->weight) : FIOS_CG_DEFAULT_WEIGHT);
	return 0;
}

/* "N" or "default N", as io.weight takes them; per-device weights are not kept: -EINVAL */
static ssize_t fios_cg_weight_write(struct kernfs_open_file *of, char *buf, size_t nbytes,
				    loff_t off)
{
	struct fios_cgd *cgd = blkcg_to_fios(css_to_blkcg(of_css(of)));
	char *body = strim(buf);
	unsigned int weight, old;

	if (!strncmp(body, "default", 7) && (body[7] == ' ' || body[7] == '\t'))
		body = skip_spaces(body + 7);
	if (kstrtouint(body, 10, &weight))
		return -EINVAL;
	if (weight < FIOS_CG_MIN_WEIGHT || weight > FIOS_CG_MAX_WEIGHT)
		return -ERANGE;
	if (!cgd)
		return -ENODEV;
	old = xchg(&cgd->weight, weight);
	if (old == FIOS_CG_DEFAULT_WEIGHT && weight != FIOS_CG_DEFAULT_WEIGHT)
		atomic_inc(&fios_cg_weighted);
	else if (old != FIOS_CG_DEFAULT_WEIGHT && weight == FIOS_CG_DEFAULT_WEIGHT)
		atomic_dec(&fios_cg_weighted);
	return nbytes;
}

static struct cftype fios_blkcg_files[] = {
	{
		.name = "fios.weight",
		.flags = CFTYPE_NOT_ON_ROOT,
		.seq_show = fios_cg_weight_show,
		.write = fios_cg_weight_write,
	},
	{} /* terminate */
};

static struct blkcg_policy fios_blkcg_policy = {
	.dfl_cftypes = fios_blkcg_files,
	.cpd_alloc_fn = fios_cpd_alloc,
	.cpd_free_fn = fios_cpd_free,
};

static int fios_blkcg_register(void)
{
	return blkcg_policy_register(&fios_blkcg_policy);
}

static void fios_blkcg_unregister(void)
{
	blkcg_policy_unregister(&fios_blkcg_policy);
}
#else
static unsigned int fios_cgroup_weight(void)
{
	return FIOS_CG_DEFAULT_WEIGHT;
}

static int fios_blkcg_register(void)
{
	return 0;
}

static void fios_blkcg_unregister(void)
{
}
#endif

/*
 * The task's slice left in the current epoch; a refreshed slice carries last epoch's debt.
 * A task never charged before (a new process) that arrives mid-epoch gets the least share of
 * a slice that any task charged in this epoch still has, not a full slice: otherwise readers
 * started one after another would each bring a fresh slice, keep the epoch open and starve
 * the tasks that used theirs up. It gets a full slice from the next epoch on.
 */
static s64 fios_remaining(struct fios_data *fd, struct fios_task *task)
{
	s64 slice;

	if (task->epoch == fd->epoch)
		return task->remaining_ns;
	slice = fios_slice(fd, task);
	if (!task->epoch) {
		u64 share = slice == fd->timeslice_ns ? fd->epoch_floor_ns :
			mul_u64_u64_div_u64(fd->epoch_floor_ns, slice, fd->timeslice_ns);

		return min_t(s64, share, slice);
	}
	if (task->epoch + 1 == fd->epoch && task->remaining_ns < 0)
		return slice + task->remaining_ns;
	return slice;
}

/*
 * The tasks with requests queued are kept per direction in a tree by slice left, so that the
 * one to serve is found without a walk over every task (a reviewer's concern: fios_pick_task
 * walked them all, up to four times per dispatch). A task's place is set when it queues its
 * first request of a direction and again whenever its slice left changes — a charge, a refund
 * (fios_replace), and for every queued task when an epoch starts (fios_new_epoch: per epoch,
 * not per dispatch). Two things change a task's slice left without either: its weight (read at
 * each request) and a newcomer's share (the epoch's floor only falls). fios_head checks the
 * task at the head against its slice left now, and places a stale one again.
 */
static bool fios_place_less(struct rb_node *a, const struct rb_node *b)
{
	return rb_entry(a, struct fios_place, node)->left >
	       rb_entry(b, struct fios_place, node)->left;
}

/*
 * Placed by its slice left now. Where it stands already — after every task with at least as
 * much left, before every task with less: where rb_add_cached would put it again — only the
 * key changes. Every charge places its task again, and a task alone in its direction (a
 * reader at queue depth 1, one writer) never moves: no erase and insert, each rebalancing
 * the tree and its cached leftmost, at those charges.
 */
static void fios_place(struct fios_data *fd, struct fios_task *task, int dir)
{
	struct fios_place *place = &task->place[dir];
	s64 left = fios_remaining(fd, task);

	if (!RB_EMPTY_NODE(&place->node)) {
		struct rb_node *prev = rb_prev(&place->node);
		struct rb_node *next = rb_next(&place->node);

		if ((!prev || rb_entry(prev, struct fios_place, node)->left >= left) &&
		    (!next || rb_entry(next, struct fios_place, node)->left < left)) {
			place->left = left;
			return;
		}
		rb_erase_cached(&place->node, &fd->by_left[dir]);
	}
	place->left = left;
	rb_add_cached(&place->node, &fd->by_left[dir], fios_place_less);
}

static void fios_unplace(struct fios_data *fd, struct fios_task *task, int dir)
{
	rb_erase_cached(&task->place[dir].node, &fd->by_left[dir]);
	RB_CLEAR_NODE(&task->place[dir].node);
}

/* The task's slice left changed: placed again where it has requests queued. */
static void fios_replace(struct fios_data *fd, struct fios_task *task)
{
	int dir;

	for (dir = 0; dir < 2; dir++)
		if (task->queued[dir])
			fios_place(fd, task, dir);
}

/* The task with requests of `dir` queued that has the most slice left, or NULL. */
static struct fios_task *fios_head(struct fios_data *fd, int dir)
{
	struct rb_node *node;

	while ((node = rb_first_cached(&fd->by_left[dir]))) {
		struct fios_place *place = rb_entry(node, struct fios_place, node);

		if (fios_remaining(fd, place->task) == place->left)
			return place->task;
		fios_place(fd, place->task, dir); /* stale: placed by what it has left now */
	}
	return NULL;
}

static void fios_new_epoch(struct fios_data *fd, u64 now)
{
	struct fios_task *task;

	/* an epoch's length, for weigh_idle; the second of two started at once is not one */
	if (fd->epoch_start_ns && now > fd->epoch_start_ns) {
		u64 len = now - fd->epoch_start_ns;

		fd->epoch_ns = fd->epoch_ns ? fd->epoch_ns - (fd->epoch_ns >> 3) + (len >> 3) : len;
	}
	fd->epoch_start_ns = now;
	fd->epoch++;
	fd->epoch_floor_ns = fd->timeslice_ns;
	fd->last_epoch_slices = fd->epoch_slices;
	fd->epoch_slices = 0;
	fd->stats.epochs++;
	list_for_each_entry(task, &fd->active, active_node)
		fios_replace(fd, task); /* every slice is new */
	blk_add_trace_msg(fd->q, "fios epoch %llu", fd->epoch);
}

/* The task's slice left belongs to this epoch from now on: its slice counts among the
 * epoch's (fios_served). Under fd->lock, before task->epoch is set.
 */
static void fios_join_epoch(struct fios_data *fd, struct fios_task *task, s64 slice)
{
	if (task->epoch != fd->epoch && task != &fd->unowned && slice > 0)
		fd->epoch_slices += slice;
}

/* No charge is more than a timeslice: one huge request (a discard) costs its task one epoch.
 * Returns the slice the task has left.
 */
static s64 fios_charge(struct fios_data *fd, struct fios_task *task, u64 cost)
{
	s64 slice = fios_slice(fd, task);
	s64 before = fios_remaining(fd, task);

	task->remaining_ns = before - (s64)min(cost, fd->timeslice_ns);
	fios_join_epoch(fd, task, slice);
	task->epoch = fd->epoch;
	if (before > 0 && task->remaining_ns <= 0)
		blk_add_trace_msg(fd->q, "fios spent pid %d epoch %llu", task->pid, fd->epoch);
	/* the floor in a default-weight task's ns: no division for a default-weight task */
	if (task->remaining_ns <= 0)
		fd->epoch_floor_ns = 0;
	else if (slice == fd->timeslice_ns)
		fd->epoch_floor_ns = min_t(u64, fd->epoch_floor_ns, task->remaining_ns);
	else if (slice > 0)
		fd->epoch_floor_ns = min(fd->epoch_floor_ns,
					 mul_u64_u64_div_u64(task->remaining_ns, fd->timeslice_ns,
							     slice));
	fios_replace(fd, task);
	return task->remaining_ns;
}

/* A charge given back (a requeued request): the slice left grows, up to a full slice. */
static void fios_refund(struct fios_data *fd, struct fios_task *task, u64 cost)
{
	s64 slice = fios_slice(fd, task);

	task->remaining_ns = min_t(s64, fios_remaining(fd, task) + (s64)min(cost, fd->timeslice_ns),
				   slice);
	fios_join_epoch(fd, task, slice);
	task->epoch = fd->epoch;
	fios_replace(fd, task);
}

/*
 * Is the task served within its share (lending, above)? Its slowdown against the epoch's
 * slices over its own slice, lend_permille / 1000 of it: with n tasks of one weight, n times
 * as slow as alone. A task not yet measured, or lending off or uncalibrated: no.
 */
static bool fios_served(struct fios_data *fd, struct fios_task *task)
{
	u64 slices = max(fd->epoch_slices, fd->last_epoch_slices);
	s64 slice = fios_slice(fd, task);
	u64 share;

	if (!fd->lend_permille || !task->slowdown || slice <= 0 || !slices ||
	    !fios_calibrated(fd))
		return false;
	/* slices * 2^8 * lend / (slice * 1000): 128-bit product, no overflow */
	share = mul_u64_u64_div_u64(slices, (u64)fd->lend_permille << FIOS_SLOWDOWN_SHIFT,
				    (u64)slice * 1000);
	return task->slowdown <= share;
}

/* Are the request's elv fields ours? Only if prepare_request ran for it. */
static inline bool fios_owns_fields(struct request *rq)
{
	return rq->rq_flags & RQF_ELVPRIV;
}

/* The eligible task with the most slice left that has a queued request of `dir`
 * (-1: either); with `spent`, the task that owes least whether eligible or not (lending).
 */
static struct fios_task *fios_pick_task(struct fios_data *fd, int dir, bool spent)
{
	struct fios_task *task;
	s64 left;

	if (dir < 0) {
		struct fios_task *r = fios_head(fd, FIOS_READ), *w = fios_head(fd, FIOS_WRITE);

		if (r && w)
			task = r->place[FIOS_READ].left >= w->place[FIOS_WRITE].left ? r : w;
		else
			task = r ? r : w;
	} else {
		task = fios_head(fd, dir);
	}
	if (!task || spent)
		return task;
	left = fios_remaining(fd, task);
	if (left <= 0)
		return NULL; /* not eligible: nor is any other */
	return task;
}

static void fios_end_anticipation(struct fios_data *fd, u64 now, bool hit)
{
	struct fios_task *task = fd->antic_task;
	u64 idle;

	if (!task)
		return;
	idle = now > fd->antic_start_ns ? now - fd->antic_start_ns : 0;
	blk_add_trace_msg(fd->q, "fios antic end pid %d %s idle %lluus", task->pid,
			  hit ? "hit" : "expired", div_u64(idle, NSEC_PER_USEC));
	fios_charge(fd, task, idle);
	fd->stats.anticipation_idle_ns += idle;
	if (hit)
		fd->stats.anticipation_hits++;
	fd->antic_task = NULL;
	/* the timer stays armed: it finds nothing to end, and re-arming costs less than that */
}

static void fios_remove_request(struct fios_data *fd, struct request *rq)
{
	struct request_queue *q = fd->q;
	struct fios_task *task = rq_task(fd, rq);
	int dir = rq_dir(rq);

	list_del_init(&rq->queuelist);
	if (!--task->queued[dir])
		fios_unplace(fd, task, dir);
	fd->queued[dir]--;
	if (!task->queued[FIOS_READ] && !task->queued[FIOS_WRITE])
		list_del_init(&task->active_node);
	elv_rqhash_del(q, rq);
	if (q->last_merge == rq)
		q->last_merge = NULL;
}

/* The request goes to the device: charged now with a calibration, unless `lent`. */
static void fios_issue(struct fios_data *fd, struct request *rq, u64 now, bool lent)
{
	struct fios_task *task = rq_task(fd, rq);
	int dir = rq_dir(rq);
	unsigned long flags;
	unsigned int parallelism;

	if (!fios_owns_fields(rq))
		return; /* not tracked: its elv fields may be another layer's */
	flags = (unsigned long)rq->elv.priv[1] | FIOS_RQ_INFLIGHT;
	fd->inflight[dir]++;
	parallelism = fd->inflight[FIOS_READ] + fd->inflight[FIOS_WRITE];
	if (!task->inflight++ && list_empty(&task->busy_node))
		list_add_tail(&task->busy_node, &fd->busy);
	fd->stats.dispatched[dir]++;
	if (lent) {
		flags |= FIOS_RQ_LENT;
		fd->stats.lent++;
	} else if (fios_calibrated(fd)) {
		fios_charge(fd, task, fios_model_cost(fd, dir, blk_rq_bytes(rq)));
		flags |= FIOS_RQ_CHARGED;
	}
	flags = (flags & ((1UL << FIOS_RQ_PAR_SHIFT) - 1)) |
		((unsigned long)parallelism << FIOS_RQ_PAR_SHIFT);
	rq->elv.priv[0] = (void *)(uintptr_t)(unsigned long)(now >> FIOS_TIME_SHIFT);
	rq->elv.priv[1] = (void *)flags;
}

/* pauses in a row that make a task a slow thinker rather than a reader that stops now and then */
#define FIOS_LONG_GAPS 4

/*
 * A task's think time: the mean gap from its last completion to its next request. A pause is
 * not think time: a gap longer than idling could ever pay for — a write's cost, beyond which
 * fios_idle_pays says no whatever the epoch (the slice before a write is measured) — is left
 * out of the mean. A reader that stops for 50 ms now and then is still a reader that comes
 * back within microseconds between its reads; averaged in (clamped at the slice, as this
 * was), each pause lifts its mean past what idling pays for until, by the average's 1/8
 * weight, about ten reads bring it back (issue 36 saw a boot where such a reader was hardly
 * waited for: 62 anticipations against 1,326 in another; not reproduced in five boots under
 * either rule, lab_fios_pause.md). A
 * task whose gaps are that long FIOS_LONG_GAPS times running thinks too long to be waited
 * for: its mean is set to the bound. Under fd->lock.
 */
static void fios_think(struct fios_data *fd, struct fios_task *task, u64 gap)
{
	u64 bound = fd->write_cost_ns ? min(fd->write_cost_ns, fd->timeslice_ns) :
					fd->timeslice_ns;

	if (gap > bound) {
		if (++task->long_gaps >= FIOS_LONG_GAPS)
			task->think_ns = bound;
		return;
	}
	task->long_gaps = 0;
	task->think_ns = task->think_ns ? task->think_ns - (task->think_ns >> 3) + (gap >> 3) : gap;
}

/*
 * weigh_idle (beyond the paper): is idling for the task's next read worth what it costs the
 * task? FIOS' fairness is the paper's: a task's mean I/O latency against alone. An
 * anticipation charges the task its think time t, so its slice ends sooner, and the read that
 * finds it ended waits out the epoch: about epoch/timeslice * t more per read. Not waiting
 * lets a write go, and the task's next read waits for what is left of it: its cost minus t
 * (write_depth keeps it to one). So idle only while t * epoch / timeslice < write cost - t.
 * A reader whose process comes back quickly (t well under a write) is still waited for; one
 * thinking 1 ms against four 4 ms writers is not.
 */
static bool fios_idle_pays(struct fios_data *fd, struct fios_task *task)
{
	if (!fd->write_cost_ns || !task->think_ns)
		return true; /* nothing measured yet: the paper's */
	/* t * (epoch + slice) / slice < write cost; 128-bit product: epochs may last seconds */
	return mul_u64_u64_div_u64(task->think_ns, fd->epoch_ns + fd->timeslice_ns,
				   fd->timeslice_ns) < fd->write_cost_ns;
}

/*
 * Idle for the task that last completed a request (a read, for which = FIOS_READ), if it has
 * slice left, nothing queued or in flight, and its window T_service * alpha / (1 - alpha)
 * after that completion is still open. Returns whether the device is held for it.
 */
static bool fios_anticipate(struct fios_data *fd, int which, u64 now)
{
	struct fios_task *task = fd->recent[which].task;
	u64 window, deadline;

	if (fd->antic_task)
		return now < fd->antic_deadline_ns;
	if (!task || !fd->alpha_permille || task->exited || task->inflight ||
	    task->queued[FIOS_READ] || task->queued[FIOS_WRITE] || fios_remaining(fd, task) <= 0)
		return false;
	if (which == FIOS_READ && fd->weigh_idle && !fios_idle_pays(fd, task))
		return false;
	window = div_u64(task->service_ns * fd->alpha_permille, 1000 - fd->alpha_permille);
	deadline = fd->recent[which].done_ns + min_t(u64, window, fd->timeslice_ns);
	if (now >= deadline)
		return false;
	fd->antic_task = task;
	fd->antic_read = which == FIOS_READ;
	fd->antic_start_ns = now;
	fd->antic_deadline_ns = deadline;
	fd->stats.anticipations++;
	blk_add_trace_msg(fd->q, "fios antic pid %d %s window %lluus", task->pid,
			  fd->antic_read ? "read" : "any", div_u64(deadline - now, NSEC_PER_USEC));
	/* a little slack (1/8 of the window) lets the timer share an expiry with others */
	hrtimer_start_range_ns(&fd->timer, ns_to_ktime(deadline), window >> 3, HRTIMER_MODE_ABS);
	return true;
}

/* Does a task with slice left have a request on the device? It will likely issue again
 * (and be anticipated at its completion if the epoch would otherwise end).
 */
static bool fios_slice_holder_busy(struct fios_data *fd)
{
	struct fios_task *task, *next;

	list_for_each_entry_safe(task, next, &fd->busy, busy_node) {
		if (!task->inflight) {
			list_del_init(&task->busy_node); /* left the device since: pruned here */
			continue;
		}
		if (task != &fd->unowned && !task->exited && fios_remaining(fd, task) > 0)
			return true;
	}
	return false;
}

/*
 * Is the task that last completed a read due back — between two requests, and less than
 * twice its mean think time since that read? Its next read will find on the device the writes
 * issued meanwhile and wait for them: while it is due, writes go at most write_depth at a time.
 * Its slice does not matter: a reader whose slice is spent is served in the next epoch, behind
 * whatever was issued now.
 */
static bool fios_reader_due(struct fios_data *fd, u64 now)
{
	struct fios_task *task = fd->reader.task;

	if (!task || task->exited || task->inflight || task->queued[FIOS_READ] ||
	    task->queued[FIOS_WRITE] || !task->think_ns)
		return false;
	return now - fd->reader.done_ns < 2 * task->think_ns;
}

/*
 * Read preference and write blocking are for a device whose writes hold it longer than its
 * reads (the paper's flash: a write takes every unit for milliseconds, a read one unit for a
 * fraction of that). Where a write costs about what a read does — null_blk, an SSD whose
 * writes land in its cache — holding writes while any read is on the device only idles it
 * (two QD1 readers and two QD16 writers on two-vCPU null_blk: 0.73 of mq-deadline's
 * concurrent efficiency). So at `read_preference` 1 (the default) they apply while the
 * calibrated costs say a write costs at least twice a read, and always without a calibration
 * (the paper's). Costs measured on the fly would decide it without one, but a read's measured
 * cost takes in the CPU's delays: on a busy two-vCPU guest flashsim's reads measured over half
 * a write, write blocking went off, and with writes always on the device no read measured
 * alone came again to turn it back on. 2: always; 0: never.
 */
static bool fios_reads_first(struct fios_data *fd)
{
	if (fd->read_preference != FIOS_READS_FIRST_COSTLIER)
		return fd->read_preference == FIOS_READS_FIRST_ALWAYS;
	return !fios_calibrated(fd) ||
	       fd->cost_ns[FIOS_WRITE][0] >= 2 * fd->cost_ns[FIOS_READ][0];
}

/* The task's request that came first, read or write (no read preference). */
static struct request *fios_first(struct fios_task *task)
{
	struct request *r, *w;

	r = list_first_entry_or_null(&task->fifo[FIOS_READ], struct request, queuelist);
	w = list_first_entry_or_null(&task->fifo[FIOS_WRITE], struct request, queuelist);
	if (r && w)
		return r->start_time_ns <= w->start_time_ns ? r : w;
	return r ? r : w;
}

/*
 * Write blocking: why a write may not go now (FIOS_WAIT_*), or 0 — no write while reads are
 * outstanding or one is anticipated (an anticipation may start here), and at most write_depth
 * of them while a reader is due back.
 */
static unsigned int fios_write_held(struct fios_data *fd, u64 now)
{
	if (fd->inflight[FIOS_READ])
		return FIOS_WAIT_READS;
	if ((fd->antic_task && fd->antic_read) || fios_anticipate(fd, FIOS_READ, now))
		return FIOS_WAIT_ANTIC;
	if (fd->write_depth && fd->inflight[FIOS_WRITE] >= fd->write_depth &&
	    fios_reader_due(fd, now) && !fios_served(fd, fd->reader.task))
		return FIOS_WAIT_WRITES;
	return 0;
}

/* The request to issue among the eligible tasks' — or, to go on lent time (`lend`), among
 * the spent ones' — or NULL: reads first and write blocking where fios_reads_first says so.
 */
static struct request *fios_choose(struct fios_data *fd, u64 now, bool lend)
{
	struct fios_task *task;
	unsigned int why;

	if (!fios_reads_first(fd)) {
		task = fios_pick_task(fd, -1, lend);
		return task ? fios_first(task) : NULL;
	}
	task = fios_pick_task(fd, FIOS_READ, lend);
	if (task)
		return list_first_entry(&task->fifo[FIOS_READ], struct request, queuelist);
	task = fios_pick_task(fd, FIOS_WRITE, lend);
	if (!task)
		return NULL;
	why = fios_write_held(fd, now);
	if (why) {
		fd->wait_why |= why;
		fd->stats.writes_held++;
		return NULL;
	}
	return list_first_entry(&task->fifo[FIOS_WRITE], struct request, queuelist);
}

/* Why the epoch stays open although no task with slice left has requests queued (FIOS_WAIT_*:
 * what can end that), or 0: a task with slice left is anticipated (one may start here), or has
 * requests on the device.
 *
 * A task between two requests is anticipated only where reads go first (fios_reads_first):
 * there its next read would find the writes issued meanwhile ahead of it, each costing several
 * reads. Where a write costs about what a read does, the next request finds at most requests of
 * its own cost ahead of it, and holding the device for it — from every task whose slice is
 * spent — bought no fairness and cost throughput: on two-vCPU null_blk, calibrated, four
 * readers and four writers thinking a read's service time were kept within 1.45 of
 * proportional without it against 1.98 with it, and two QD1 readers against two QD16 writers
 * had a concurrent efficiency of 1.30-1.43 against 1.07-1.13 (issue 36, docs/benchmarks.md).
 * The epoch then ends once no task with slice left has a request queued or on the device, and
 * such a task's next request comes with a whole slice.
 */
static unsigned int fios_keep_epoch(struct fios_data *fd, u64 now)
{
	if (fd->antic_task)
		return FIOS_WAIT_ANTIC;
	if (fios_slice_holder_busy(fd))
		return FIOS_WAIT_ANY;
	if (fios_reads_first(fd) && fios_anticipate(fd, 1, now))
		return FIOS_WAIT_ANTIC;
	return 0;
}

/*
 * Lending: does every task that keeps the epoch open — the one anticipated, and those with
 * slice left and requests on the device — get its share (fios_served)? A walk over the tasks
 * on the device (at most max_depth of them, and those pruned here as fios_slice_holder_busy
 * does), only when everything queued belongs to spent tasks.
 */
static bool fios_holders_served(struct fios_data *fd)
{
	struct fios_task *task, *next;
	bool any = false;

	if (fd->antic_task) {
		if (!fios_served(fd, fd->antic_task))
			return false;
		any = true;
	}
	list_for_each_entry_safe(task, next, &fd->busy, busy_node) {
		if (!task->inflight) {
			list_del_init(&task->busy_node);
			continue;
		}
		if (task == &fd->unowned || task->exited || fios_remaining(fd, task) <= 0)
			continue;
		if (!fios_served(fd, task))
			return false;
		any = true;
	}
	return any;
}

/* The queued request that came first, of any task (a scan: only for a wait nothing ends). */
static struct request *fios_oldest(struct fios_data *fd)
{
	struct request *oldest = NULL;
	struct fios_task *task;
	int dir;

	list_for_each_entry(task, &fd->active, active_node)
		for (dir = 0; dir < 2; dir++) {
			struct request *rq = list_first_entry_or_null(&task->fifo[dir],
								      struct request, queuelist);

			if (rq && (!oldest || rq->start_time_ns < oldest->start_time_ns))
				oldest = rq;
		}
	return oldest;
}

static void fios_stop_waiting(struct fios_data *fd)
{
	WRITE_ONCE(fd->waiting, false);
	fd->wait_why = 0;
}

static struct request *fios_dispatch_request(struct blk_mq_hw_ctx *hctx)
{
	struct fios_data *fd = hctx->queue->elevator->elevator_data;
	struct request *rq;
	unsigned long flags;
	u64 now = ktime_get_ns();
	bool lent = false;

	spin_lock_irqsave(&fd->lock, flags);
	rq = list_first_entry_or_null(&fd->dispatch, struct request, queuelist);
	if (rq) {
		list_del_init(&rq->queuelist);
		fios_issue(fd, rq, now, false);
		goto out;
	}
	if (!fd->queued[FIOS_READ] && !fd->queued[FIOS_WRITE])
		goto out;
	if (fd->inflight[FIOS_READ] + fd->inflight[FIOS_WRITE] >= fd->max_depth) {
		fd->wait_why |= FIOS_WAIT_ANY;
		goto wait;
	}
	if (fd->antic_task && now >= fd->antic_deadline_ns)
		fios_end_anticipation(fd, now, false);

	rq = fios_choose(fd, now, false);
	if (!rq && !fios_pick_task(fd, -1, false)) {
		/*
		 * Everything queued belongs to tasks whose slice is used up. Keep the epoch while
		 * a task with slice left is anticipated or has requests on the device; otherwise
		 * start a new one.
		 */
		unsigned int keep = fios_keep_epoch(fd, now);

		if (keep) {
			/* while those it is kept for get their share, a spent task's request
			 * goes on lent time
			 */
			if (fd->lend_permille && fios_holders_served(fd)) {
				rq = fios_choose(fd, now, true);
				lent = !!rq;
			}
			if (!rq) {
				fd->wait_why |= keep;
				goto wait;
			}
		} else {
			fios_new_epoch(fd, now);
			rq = fios_choose(fd, now, false);
		}
		if (!rq && !fios_pick_task(fd, -1, false)) {
			/*
			 * Every queued task owes more than a slice: charges at completion can go
			 * that deep (each request in flight when a slice runs out is charged
			 * too). An epoch later their slices are whole. Without this, waiting
			 * here with nothing in flight would wait for an insert — and when the
			 * queued requests hold every scheduler tag, none comes (the stall seen
			 * on two vCPUs with deep writers, before this).
			 */
			fios_new_epoch(fd, now);
			fd->stats.debt_epochs++;
			rq = fios_choose(fd, now, false);
		}
	}
	if (!rq) {
		if (!fd->wait_why)
			fd->wait_why = FIOS_WAIT_ANY; /* a reason not named above: be safe */
		goto wait;
	}
	fios_remove_request(fd, rq);
	fios_issue(fd, rq, now, lent);
	goto out;
wait:
	/*
	 * Something is queued but may not go yet. Until an insert, a completion or the end of
	 * the anticipation changes that, has_work says there is nothing to do: blk-mq then
	 * neither spins on dispatch nor re-runs the queue on a timer.
	 */
	if (unlikely(!fd->inflight[FIOS_READ] && !fd->inflight[FIOS_WRITE] && !fd->antic_task)) {
		/*
		 * Nothing could end this wait: no completion will come and no anticipation ends,
		 * only an insert — none comes if what is queued holds every tag. So it is not
		 * one: the oldest queued request goes now, whatever the slices say, and the device
		 * cannot stall by construction. The rules above never get here (the debt epoch
		 * covers the case once seen); if they do, it is counted and said once.
		 */
		rq = fios_oldest(fd);
		if (rq) {
			WARN_ON_ONCE(1);
			fd->stats.rescues++;
			fios_stop_waiting(fd);
			fios_remove_request(fd, rq);
			fios_issue(fd, rq, now, false);
			goto out;
		}
	}
	WRITE_ONCE(fd->waiting, true);
out:
	spin_unlock_irqrestore(&fd->lock, flags);
	return rq;
}

static bool fios_has_work(struct blk_mq_hw_ctx *hctx)
{
	struct fios_data *fd = hctx->queue->elevator->elevator_data;

	return !list_empty_careful(&fd->dispatch) ||
	       ((READ_ONCE(fd->queued[FIOS_READ]) || READ_ONCE(fd->queued[FIOS_WRITE])) &&
		!READ_ONCE(fd->waiting));
}

static void fios_insert_requests(struct blk_mq_hw_ctx *hctx, struct list_head *list,
				 bool at_head)
{
	struct request_queue *q = hctx->queue;
	struct fios_data *fd = q->elevator->elevator_data;
	unsigned long flags;

	spin_lock_irqsave(&fd->lock, flags);
	fios_stop_waiting(fd); /* blk-mq runs the queue after inserting */
	while (!list_empty(list)) {
		struct request *rq = list_first_entry(list, struct request, queuelist);
		struct fios_task *task;
		int dir = rq_dir(rq);

		list_del_init(&rq->queuelist);
		if (at_head || !fios_owns_fields(rq)) {
			list_add_tail(&rq->queuelist, &fd->dispatch);
			continue;
		}
		task = rq_task(fd, rq);
		if (!task->inflight && !task->queued[FIOS_READ] && !task->queued[FIOS_WRITE] &&
		    task->last_done_ns && rq->start_time_ns > task->last_done_ns)
			fios_think(fd, task, rq->start_time_ns - task->last_done_ns);
		list_add_tail(&rq->queuelist, &task->fifo[dir]);
		if (!task->queued[dir]++)
			fios_place(fd, task, dir);
		fd->queued[dir]++;
		if (list_empty(&task->active_node))
			list_add_tail(&task->active_node, &fd->active);
		if (rq_mergeable(rq))
			elv_rqhash_add(q, rq);
		if (fd->antic_task == task && (!fd->antic_read || dir == FIOS_READ))
			fios_end_anticipation(fd, ktime_get_ns(), true);
	}
	spin_unlock_irqrestore(&fd->lock, flags);
}

/*
 * Runs in the submitter's context: find (or create) the task's io_cq and pin it until
 * finish_request.
 *
 * The pin is a count on the task, not a reference on the io_context per request (which is
 * what ioc_find_get_icq takes, and bfq keeps): the task's first request keeps that reference
 * for the task, later ones only count themselves in task->refs, on the line prepare reads
 * anyway, and finish does not touch the io_context at all. fios_exit_icq gives the task's own
 * count back; whoever brings refs to zero (it, or the last request of a task that exited with
 * requests out) drops the reference, so the io_context, and the io_cq in it, outlive every
 * request that points at them.
 *
 * blk-ioc keeps in ioc->icq_hint the io_cq the task last looked up; when that is this
 * queue's, it is taken without ioc_find_get_icq's queue_lock round trip (mq-deadline, which
 * tracks no tasks, has none). That is safe without the queue_lock that ioc_lookup_icq asserts
 * on 6.1, which only keeps an io_cq from being destroyed during the lookup. Memory: the hint is
 * read under rcu_read_lock, and an io_cq is freed by call_rcu (icq_free_icq_rcu). Validity: it
 * is used only if it is this queue's and has neither exited nor been destroyed, and none of
 * the three paths that destroy or exit it can run meanwhile: ioc_clear_queue runs when the
 * elevator goes, with the queue frozen — blk_mq_freeze_queue waits for q_usage_counter, which
 * this submitter holds while its request is prepared; ioc_release_fn runs when the io_context's
 * last reference goes — the submitter holds current->io_context's; ioc_exit_icqs runs when its
 * last active user exits — the submitter is one, and is not exiting while it submits. The
 * flags are still checked (READ_ONCE): a hint left from before a switch of elevators or a
 * CLONE_IO sharer's exit is refused, never used. A hint per task, unlike one per queue, holds
 * when tasks take turns at submitting.
 */
static void fios_prepare_request(struct request *rq)
{
	struct io_context *ioc = current->io_context;
	unsigned int weight, cg_weight;
	struct fios_task *task;
	struct io_cq *icq;

	rq->elv.priv[0] = NULL;
	rq->elv.priv[1] = NULL;
	if (likely(ioc)) {
		rcu_read_lock();
		icq = rcu_dereference(ioc->icq_hint);
		if (icq && icq->q == rq->q &&
		    !(READ_ONCE(icq->flags) & (ICQ_EXITED | ICQ_DESTROYED)) &&
		    atomic_inc_not_zero(&icq_to_task(icq)->refs)) {
			rcu_read_unlock();
			task = icq_to_task(icq);
			goto found;
		}
		rcu_read_unlock();
	}
	/* takes a reference on the io_context; sets ioc->icq_hint once the io_cq exists */
	icq = ioc_find_get_icq(rq->q);
	if (!icq) {
		rq->elv.icq = NULL;
		return;
	}
	/* the task's first request keeps the reference as the task's (refs: it and this
	 * request); a later one drops it — never the last, the submitter holds its own
	 */
	task = icq_to_task(icq);
	if (atomic_cmpxchg(&task->refs, 0, 2) != 0) {
		atomic_inc(&task->refs);
		put_io_context(icq->ioc);
	}
	/* the process id, for debugfs and traces: set here, where the io_cq is found the slow
	 * way (its first request, or after the submitter used another queue), not on every
	 * request — an io_context is one process's (CLONE_IO sharers show as the one that
	 * found it)
	 */
	WRITE_ONCE(task->pid, task_tgid_nr(current));
found:
	rq->elv.icq = icq;
	/* the submitter's I/O priority and cgroup weight now (ioprio_set or a move to another
	 * cgroup may change them at any time); written only when they change, so that the
	 * task's line is not dirtied on every request
	 */
	weight = fios_weight(get_current_ioprio());
	cg_weight = fios_cgroup_weight();
	if (unlikely(READ_ONCE(task->weight) != weight))
		WRITE_ONCE(task->weight, weight);
	if (unlikely(READ_ONCE(task->cg_weight) != cg_weight))
		WRITE_ONCE(task->cg_weight, cg_weight);
}

/* A request in flight left the device (now): what it cost, and what may go now. */
/* New costs: what was measured against the old ones says nothing of them. */
static void fios_forget_drift(struct fios_data *fd)
{
	fd->drift_x256[FIOS_READ] = 0;
	fd->drift_x256[FIOS_WRITE] = 0;
}

/* A request alone on the device: its measured time against its calibrated cost. */
static void fios_note_drift(struct fios_data *fd, int dir, u64 elapsed, u64 cost)
{
	u32 ratio = min_t(u64, div64_u64(elapsed << 8, cost), FIOS_MAX_DRIFT_X256);
	u32 avg = fd->drift_x256[dir];

	fd->drift_x256[dir] = avg ? avg - (avg >> 3) + (ratio >> 3) : ratio;
	if (ratio > (FIOS_DRIFT << 8) || ratio < (1U << 8) / FIOS_DRIFT)
		fd->stats.cost_drift++;
}

static void fios_completed(struct request *rq)
{
	struct fios_data *fd = rq->q->elevator->elevator_data;
	unsigned long rqflags;
	struct fios_task *task;
	unsigned long flags;
	bool kick = false;
	int dir = rq_dir(rq);
	u64 elapsed, cost, now;
	s64 left;

	if (!fios_owns_fields(rq))
		return;
	rqflags = (unsigned long)rq->elv.priv[1];
	if (!(rqflags & FIOS_RQ_INFLIGHT))
		return; /* never issued, or requeued: no clock read */
	now = ktime_get_ns();
	spin_lock_irqsave(&fd->lock, flags);
	task = rq_task(fd, rq);
	fd->inflight[dir]--;
	/* an exited task's io_cq may be freed once its last request is done: off the list now */
	if (!--task->inflight && task->exited)
		list_del_init(&task->busy_node);
	rq->elv.priv[1] = (void *)(rqflags & ~FIOS_RQ_INFLIGHT);
	/* modulo the width of unsigned long: right across a wrap */
	elapsed = (u64)((unsigned long)(now >> FIOS_TIME_SHIFT) -
			(unsigned long)(uintptr_t)rq->elv.priv[0]) << FIOS_TIME_SHIFT;
	/* the request's cost: the device's time for it, not its wait behind others */
	if (rqflags & (FIOS_RQ_CHARGED | FIOS_RQ_LENT)) {
		cost = fios_model_cost(fd, dir, blk_rq_bytes(rq));
		left = fios_remaining(fd, task);
	} else {
		unsigned long parallelism = rqflags >> FIOS_RQ_PAR_SHIFT;

		cost = parallelism > 1 ? div_u64(elapsed, parallelism) : elapsed;
		left = fios_charge(fd, task, cost);
	}
	if (dir == FIOS_WRITE)
		fd->write_cost_ns = fd->write_cost_ns ?
			fd->write_cost_ns - (fd->write_cost_ns >> 3) + (cost >> 3) : cost;
	if ((rqflags & FIOS_RQ_CHARGED) && (rqflags >> FIOS_RQ_PAR_SHIFT) == 1)
		fios_note_drift(fd, dir, elapsed, cost);

	if (!task->inflight)
		task->last_done_ns = now;
	if (task != &fd->unowned) {
		if (fios_calibrated(fd) && rq->start_time_ns && now > rq->start_time_ns) {
			/* the latency its process sees, over what the request costs alone */
			u64 ratio = div64_u64((now - rq->start_time_ns) << FIOS_SLOWDOWN_SHIFT,
					      fios_model_cost(fd, dir, blk_rq_bytes(rq)));
			u32 slowdown = min_t(u64, ratio, FIOS_MAX_SLOWDOWN);

			task->slowdown = task->slowdown ?
				task->slowdown - (task->slowdown >> 3) + (slowdown >> 3) : slowdown;
		}
		task->service_ns = task->service_ns ?
			task->service_ns - (task->service_ns >> 3) + (elapsed >> 3) : elapsed;
		if (dir == FIOS_READ && !task->exited) {
			fd->reader.task = task;
			fd->reader.done_ns = now;
		}
		/*
		 * Candidates for anticipation (see fios_anticipate): only a task with slice left,
		 * so that the completion of an exhausted task's request (a write that overlapped
		 * a reader's read) does not hide the reader that may keep the epoch going.
		 */
		if (!task->exited && left > 0) {
			fd->recent[1].task = task;
			fd->recent[1].done_ns = now;
			if (dir == FIOS_READ) {
				fd->recent[FIOS_READ].task = task;
				fd->recent[FIOS_READ].done_ns = now;
			}
		}
	}
	/*
	 * Re-run the queue if this completion can let what waits go (see FIOS_WAIT_*); an
	 * anticipation ends with the task's request (an insert, which runs the queue) or with
	 * the timer, which kicks. Re-running every hardware queue for nothing is most of what a
	 * completion would cost.
	 */
	if (fd->waiting &&
	    ((fd->wait_why & FIOS_WAIT_ANY) ||
	     ((fd->wait_why & FIOS_WAIT_READS) && !fd->inflight[FIOS_READ]) ||
	     ((fd->wait_why & FIOS_WAIT_WRITES) && dir == FIOS_WRITE) ||
	     ((fd->wait_why & FIOS_WAIT_ANTIC) && now >= fd->antic_deadline_ns))) {
		fios_stop_waiting(fd);
		fd->stats.kicks++;
		kick = true;
	}
	spin_unlock_irqrestore(&fd->lock, flags);
	if (kick)
		blk_mq_run_hw_queues(rq->q, true);
}

/* The request left the device without completing: it is no longer in flight, and what it
 * was charged at issue is refunded (it will be charged when issued again).
 */
static void fios_requeue_request(struct request *rq)
{
	struct fios_data *fd = rq->q->elevator->elevator_data;
	unsigned long rqflags;
	struct fios_task *task;
	unsigned long flags;
	bool kick;

	if (!fios_owns_fields(rq))
		return;
	rqflags = (unsigned long)rq->elv.priv[1];
	if (!(rqflags & FIOS_RQ_INFLIGHT))
		return;
	spin_lock_irqsave(&fd->lock, flags);
	task = rq_task(fd, rq);
	fd->inflight[rq_dir(rq)]--;
	/* an exited task's io_cq may be freed once its last request is done: off the list now */
	if (!--task->inflight && task->exited)
		list_del_init(&task->busy_node);
	if (rqflags & FIOS_RQ_CHARGED) {
		fios_refund(fd, task, fios_model_cost(fd, rq_dir(rq), blk_rq_bytes(rq)));
		fd->stats.refunds++;
	}
	rq->elv.priv[1] = (void *)(rqflags & ~(FIOS_RQ_INFLIGHT | FIOS_RQ_CHARGED | FIOS_RQ_LENT));
	/* what waited for it (the last read out, say) would otherwise wait for a completion
	 * that never comes
	 */
	kick = fd->waiting;
	if (kick) {
		fios_stop_waiting(fd);
		fd->stats.kicks++;
	}
	spin_unlock_irqrestore(&fd->lock, flags);
	if (kick)
		blk_mq_run_hw_queues(rq->q, true);
}

/*
 * A request is freed: if it was on the device, it completed (or failed at issue, which
 * completes it too). This is where fios takes a completion, not in a completed_request hook:
 * blk-mq passes that the completion time, but a second hook on every completion cost more
 * than one clock read here (bench/lab_hooks.py; docs/benchmarks.md).
 */
static void fios_finish_request(struct request *rq)
{
	struct io_cq *icq = rq->elv.icq;

	fios_completed(rq);
	if (icq) {
		rq->elv.icq = NULL;
		/* the last of a task whose io_cq exited: the task's io_context reference goes */
		if (atomic_dec_and_test(&icq_to_task(icq)->refs))
			put_io_context(icq->ioc);
	}
}

static enum hrtimer_restart fios_anticipation_timer(struct hrtimer *timer)
{
	struct fios_data *fd = container_of(timer, struct fios_data, timer);
	unsigned long flags;
	u64 now = ktime_get_ns();
	enum hrtimer_restart restart = HRTIMER_NORESTART;
	bool kick = false;

	spin_lock_irqsave(&fd->lock, flags);
	if (fd->antic_task && now >= fd->antic_deadline_ns)
		fios_end_anticipation(fd, now, false);
	if (fd->antic_task && hrtimer_is_queued(timer)) {
		/* re-armed for a newer anticipation while this ran (hrtimer_start is only called
		 * under fd->lock): that one's expiry stands
		 */
	} else if (fd->antic_task) {
		/*
		 * Not due by this CPU's clock (another CPU set the deadline; under SMP the clocks
		 * the two read may differ by a little): come back at the deadline rather than
		 * leave what waits for the anticipation's end waiting for ever.
		 */
		fd->stats.timer_early++;
		hrtimer_set_expires(timer, ns_to_ktime(fd->antic_deadline_ns));
		restart = HRTIMER_RESTART;
	} else if (fd->waiting) {
		fios_stop_waiting(fd);
		kick = true;
	}
	spin_unlock_irqrestore(&fd->lock, flags);
	if (kick)
		blk_mq_run_hw_queues(fd->q, true);
	return restart;
}

/*
 * Asynchronous requests and writes may take at most async_depth scheduler tags; synchronous
 * reads are not limited (mq-deadline's rule, and kyber's and bfq's in spirit).
 */
static void fios_limit_depth(blk_opf_t opf, struct blk_mq_alloc_data *data)
{
	struct fios_data *fd = data->q->elevator->elevator_data;

	if (op_is_sync(opf) && !op_is_write(opf))
		return;
	data->shallow_depth = READ_ONCE(fd->shallow_depth);
}

/* sbitmap applies a shallow depth to each word of the tag bitmap, not to the whole: scale
 * async_depth (of nr_requests tags) to a word, as bfq does. Under fd->lock.
 */
static void fios_update_shallow(struct fios_data *fd)
{
	unsigned long word = 1UL << fd->word_shift;
	unsigned long total = max(fd->q->nr_requests, 1UL);

	fd->async_depth = clamp_t(unsigned int, fd->async_depth, 1, total);
	WRITE_ONCE(fd->shallow_depth,
		   clamp_t(unsigned long, fd->async_depth * word / total, 1, word));
}

/* nr_requests changed (and at init): a default async depth follows it, a set one is clamped.
 * The tags' wake batch is sized for the smallest shallow depth there can be (1), so that no
 * async_depth written later can leave a waiter without a wake-up.
 */
static void fios_depth_updated(struct blk_mq_hw_ctx *hctx)
{
	struct request_queue *q = hctx->queue;
	struct fios_data *fd = q->elevator->elevator_data;
	unsigned long flags;

	spin_lock_irqsave(&fd->lock, flags);
	if (!fd->async_depth_set)
		fd->async_depth = max(1UL, 3 * q->nr_requests / 4);
	fd->word_shift = hctx->sched_tags->bitmap_tags.sb.shift;
	fios_update_shallow(fd);
	spin_unlock_irqrestore(&fd->lock, flags);
	sbitmap_queue_min_shallow_depth(&hctx->sched_tags->bitmap_tags, 1);
}

static int fios_init_hctx(struct blk_mq_hw_ctx *hctx, unsigned int hctx_idx)
{
	fios_depth_updated(hctx);
	return 0;
}

static void fios_init_icq(struct io_cq *icq)
{
	struct fios_task *task = icq_to_task(icq);

	fios_task_init(task);
	atomic_set(&task->refs, 0); /* pinned by its first request */
	task->weight = FIOS_DEFAULT_WEIGHT;
	task->cg_weight = FIOS_CG_DEFAULT_WEIGHT;
}

static void fios_exit_icq(struct io_cq *icq)
{
	struct fios_data *fd = icq->q->elevator->elevator_data;
	struct fios_task *task = icq_to_task(icq);
	unsigned long flags;
	bool kick = false;

	spin_lock_irqsave(&fd->lock, flags);
	task->exited = true;
	if (!task->inflight)
		list_del_init(&task->busy_node); /* its io_cq may be freed: never left listed */
	if (fd->recent[FIOS_READ].task == task)
		fd->recent[FIOS_READ].task = NULL;
	if (fd->recent[1].task == task)
		fd->recent[1].task = NULL;
	if (fd->reader.task == task)
		fd->reader.task = NULL;
	if (fd->antic_task == task) {
		/* what waited for this task may go now */
		fd->antic_task = NULL;
		kick = fd->waiting;
		fios_stop_waiting(fd);
	}
	spin_unlock_irqrestore(&fd->lock, flags);
	/*
	 * The task's own count (if a request ever pinned it): with no request out, its
	 * io_context reference goes now — never the last one here, as the exiting task's (or a
	 * live submitter's, when the elevator goes) is held through this call, which runs under
	 * ioc->lock that a last put would take again. Else the task's last request drops it.
	 */
	if (atomic_read(&task->refs) && atomic_dec_and_test(&task->refs))
		put_io_context(icq->ioc);
	if (kick)
		blk_mq_run_hw_queues(fd->q, true);
}

static bool fios_allow_merge(struct request_queue *q, struct request *rq, struct bio *bio)
{
	/* never let one task's bio ride on another task's request (and its slice) */
	return rq->elv.icq && current->io_context == rq->elv.icq->ioc;
}

/*
 * Can the submitter have a request queued here that this bio could join? A bio joins only a
 * queued request of its direction (blk_rq_merge_ok) whose io_context is the submitter's
 * (fios_allow_merge). With nothing of that direction queued, or none of it the submitter's,
 * the lock and the hash lookup are not taken: the synchronous reader's case, whose one request
 * is on the device when its next bio comes. The device-wide count is looked at first (fios'
 * own data, touched by every hook anyway), the submitter's io_cq only if that is not zero.
 * Read without the lock: a stale count only takes the locked path, or misses a merge, which
 * is never wrong. When the submitter's io_cq hint is another queue's, its io_cq here is not
 * looked up: the locked path decides.
 */
static bool fios_may_merge(struct fios_data *fd, struct bio *bio)
{
	int dir = bio_data_dir(bio) == READ ? FIOS_READ : FIOS_WRITE;
	struct io_context *ioc;
	struct io_cq *icq;
	bool may = true;

	if (!READ_ONCE(fd->queued[dir]))
		return false;
	ioc = current->io_context;
	if (!ioc)
		return false;
	rcu_read_lock();
	icq = rcu_dereference(ioc->icq_hint);
	if (icq && icq->q == fd->q)
		may = READ_ONCE(icq_to_task(icq)->queued[dir]) != 0;
	rcu_read_unlock();
	return may;
}

static bool fios_bio_merge(struct request_queue *q, struct bio *bio, unsigned int nr_segs)
{
	struct fios_data *fd = q->elevator->elevator_data;
	struct request *free = NULL;
	unsigned long flags;
	bool merged;

	if (!fios_may_merge(fd, bio))
		return false;
	spin_lock_irqsave(&fd->lock, flags);
	merged = blk_mq_sched_try_merge(q, bio, nr_segs, &free);
	spin_unlock_irqrestore(&fd->lock, flags);
	/* no former/next_request ops, so two requests are never merged into one */
	WARN_ON_ONCE(free);
	return merged;
}

static int fios_init_sched(struct request_queue *q, struct elevator_type *e)
{
	struct elevator_queue *eq;
	struct fios_data *fd;

	eq = elevator_alloc(q, e);
	if (!eq)
		return -ENOMEM;
	fd = kzalloc_node(sizeof(*fd), GFP_KERNEL, q->node);
	if (!fd) {
		kobject_put(&eq->kobj);
		return -ENOMEM;
	}
	spin_lock_init(&fd->lock);
	fd->q = q;
	INIT_LIST_HEAD(&fd->dispatch);
	INIT_LIST_HEAD(&fd->active);
	fd->by_left[FIOS_READ] = RB_ROOT_CACHED;
	fd->by_left[FIOS_WRITE] = RB_ROOT_CACHED;
	INIT_LIST_HEAD(&fd->busy);
	fios_task_init(&fd->unowned);
	hrtimer_init(&fd->timer, CLOCK_MONOTONIC, HRTIMER_MODE_ABS);
	fd->timer.function = fios_anticipation_timer;
	fd->timeslice_ns = (u64)FIOS_DEFAULT_TIMESLICE_US * NSEC_PER_USEC;
	fd->alpha_permille = FIOS_DEFAULT_ALPHA_PERMILLE;
	fd->read_preference = FIOS_READS_FIRST_COSTLIER;
	fd->max_depth = FIOS_DEFAULT_MAX_DEPTH;
	fd->write_depth = FIOS_DEFAULT_WRITE_DEPTH;
	fd->weigh_idle = true;
	fd->lend_permille = FIOS_DEFAULT_LEND_PERMILLE;
	fd->epoch = 1; /* 0: a task never charged */
	fd->epoch_floor_ns = fd->timeslice_ns;
	fd->unowned.weight = FIOS_DEFAULT_WEIGHT;
	fd->unowned.cg_weight = FIOS_CG_DEFAULT_WEIGHT;
	eq->elevator_data = fd;

	/* one scheduler per queue, dispatching for every hardware queue */
	blk_queue_flag_set(QUEUE_FLAG_SQ_SCHED, q);
	q->elevator = eq;
	return 0;
}

static void fios_exit_sched(struct elevator_queue *e)
{
	struct fios_data *fd = e->elevator_data;

	hrtimer_cancel(&fd->timer);
	WARN_ON_ONCE(!list_empty(&fd->dispatch));
	WARN_ON_ONCE(fd->queued[FIOS_READ] || fd->queued[FIOS_WRITE]);
	kfree(fd);
}

/* --- tunables under queue/iosched/ -------------------------------------------------------- */

static ssize_t fios_show_u64(char *page, u64 value)
{
	return sysfs_emit(page, "%llu\n", value);
}

/*
 * Parse a decimal within [min, max]; anything else, a number out of range too, is -EINVAL
 * and changes nothing. (mq-deadline and bfq clamp an out-of-range number; a value that
 * silently reads back as another is worse for a tool that checks what it wrote.)
 */
static int fios_parse(const char *page, u64 min, u64 max, u64 *value)
{
	int err = kstrtoull(page, 10, value);

	if (err)
		return err;
	if (*value < min || *value > max)
		return -EINVAL;
	return 0;
}

#define FIOS_ATTR(name, min, max, get, set)                                                \
	static ssize_t fios_##name##_show(struct elevator_queue *e, char *page)             \
	{                                                                                  \
		struct fios_data *fd = e->elevator_data;                                   \
		return fios_show_u64(page, (get));                                         \
	}                                                                                  \
	static ssize_t fios_##name##_store(struct elevator_queue *e, const char *page,      \
					   size_t count)                                   \
	{                                                                                  \
		struct fios_data *fd = e->elevator_data;                                   \
		unsigned long flags;                                                       \
		u64 value;                                                                 \
		int err = fios_parse(page, (min), (max), &value);                          \
		if (err)                                                                   \
			return err;                                                        \
		spin_lock_irqsave(&fd->lock, flags);                                       \
		set;                                                                       \
		fios_stop_waiting(fd);                                                     \
		spin_unlock_irqrestore(&fd->lock, flags);                                  \
		blk_mq_run_hw_queues(fd->q, true); /* what waited may go now */            \
		return count;                                                              \
	}

FIOS_ATTR(alpha_permille, 0, FIOS_MAX_ALPHA_PERMILLE, fd->alpha_permille,
	  fd->alpha_permille = value)
FIOS_ATTR(timeslice_us, FIOS_MIN_TIMESLICE_US, FIOS_MAX_TIMESLICE_US,
	  div_u64(fd->timeslice_ns, NSEC_PER_USEC), fd->timeslice_ns = value * NSEC_PER_USEC)
FIOS_ATTR(read_preference, 0, FIOS_READS_FIRST_ALWAYS, fd->read_preference,
	  fd->read_preference = value)
FIOS_ATTR(max_depth, 1, FIOS_MAX_DEPTH, fd->max_depth, fd->max_depth = value)
FIOS_ATTR(write_depth, 0, FIOS_MAX_DEPTH, fd->write_depth, fd->write_depth = value)
FIOS_ATTR(weigh_idle, 0, 1, fd->weigh_idle, fd->weigh_idle = value)
FIOS_ATTR(lend_permille, 0, FIOS_MAX_LEND_PERMILLE, fd->lend_permille,
	  fd->lend_permille = value)
FIOS_ATTR(async_depth, 1, fd->q->nr_requests, fd->async_depth,
	  (fd->async_depth = value, fd->async_depth_set = true, fios_update_shallow(fd)))
FIOS_ATTR(cost_read_4k_ns, 0, FIOS_MAX_COST_NS, fd->cost_ns[FIOS_READ][0],
	  (fd->cost_ns[FIOS_READ][0] = value, fios_forget_drift(fd)))
FIOS_ATTR(cost_read_128k_ns, 0, FIOS_MAX_COST_NS, fd->cost_ns[FIOS_READ][1],
	  (fd->cost_ns[FIOS_READ][1] = value, fios_forget_drift(fd)))
FIOS_ATTR(cost_write_4k_ns, 0, FIOS_MAX_COST_NS, fd->cost_ns[FIOS_WRITE][0],
	  (fd->cost_ns[FIOS_WRITE][0] = value, fios_forget_drift(fd)))
FIOS_ATTR(cost_write_128k_ns, 0, FIOS_MAX_COST_NS, fd->cost_ns[FIOS_WRITE][1],
	  (fd->cost_ns[FIOS_WRITE][1] = value, fios_forget_drift(fd)))

static ssize_t fios_stats_show(struct elevator_queue *e, char *page)
{
	struct fios_data *fd = e->elevator_data;
	struct fios_stats s;
	unsigned long flags;
	const char *problem;
	char model[80];
	u64 epoch;

	spin_lock_irqsave(&fd->lock, flags);
	s = fd->stats;
	epoch = fd->epoch;
	problem = fios_cost_problem(fd);
	spin_unlock_irqrestore(&fd->lock, flags);
	if (!problem)
		strscpy(model, "calibrated", sizeof(model));
	else if (problem == fios_costs_not_set)
		strscpy(model, "elapsed/parallelism", sizeof(model));
	else
		scnprintf(model, sizeof(model), "elapsed/parallelism (calibration refused: %s)",
			  problem);
	return sysfs_emit(page,
			  "epoch %llu\nepochs %llu\nreads %llu\nwrites %llu\nanticipations %llu\n"
			  "anticipation_hits %llu\nanticipation_idle_ns %llu\nwrites_held %llu\n"
			  "refunds %llu\ntimer_early %llu\nkicks %llu\ndebt_epochs %llu\n"
			  "rescues %llu\nlent %llu\ncost_drift %llu\ncost_model %s\n",
			  epoch, s.epochs, s.dispatched[FIOS_READ], s.dispatched[FIOS_WRITE],
			  s.anticipations, s.anticipation_hits, s.anticipation_idle_ns,
			  s.writes_held, s.refunds, s.timer_early, s.kicks, s.debt_epochs,
			  s.rescues, s.lent, s.cost_drift, model);
}

#define FIOS_RW(name) __ATTR(name, 0644, fios_##name##_show, fios_##name##_store)

static struct elv_fs_entry fios_attrs[] = {
	FIOS_RW(alpha_permille),
	FIOS_RW(timeslice_us),
	FIOS_RW(read_preference),
	FIOS_RW(max_depth),
	FIOS_RW(write_depth),
	FIOS_RW(weigh_idle),
	FIOS_RW(lend_permille),
	FIOS_RW(async_depth),
	FIOS_RW(cost_read_4k_ns),
	FIOS_RW(cost_read_128k_ns),
	FIOS_RW(cost_write_4k_ns),
	FIOS_RW(cost_write_128k_ns),
	__ATTR(stats, 0444, fios_stats_show, NULL),
	__ATTR_NULL
};

#ifdef CONFIG_BLK_DEBUG_FS
/* --- debugfs: /sys/kernel/debug/block/<dev>/sched/ ----------------------------------------- */

static s64 fios_ns_until(u64 deadline, u64 now)
{
	return deadline >= now ? (s64)(deadline - now) : -(s64)(now - deadline);
}

/* The queue's io_cqs (one per io_context that submitted here and has not been released)
 * and how many of them hold a reference on their io_context (see fios_prepare_request): once
 * the tasks that used the device have exited, both fall to zero, or a reference leaked.
 */
static void fios_show_icqs(struct request_queue *q, struct seq_file *m)
{
	unsigned int icqs = 0, pinned = 0;
	struct io_cq *icq;

	spin_lock_irq(&q->queue_lock);
	list_for_each_entry(icq, &q->icq_list, q_node) {
		icqs++;
		pinned += atomic_read(&icq_to_task(icq)->refs) > 0;
	}
	spin_unlock_irq(&q->queue_lock);
	seq_printf(m, "io_cqs %u pinned %u\n", icqs, pinned);
}

/* The scheduler's state now: epoch, counts, whether it waits and what it anticipates. */
static int fios_state_show(void *data, struct seq_file *m)
{
	struct request_queue *q = data;
	struct fios_data *fd = q->elevator->elevator_data;
	struct fios_task *antic;
	unsigned long flags;
	u64 now = ktime_get_ns();

	spin_lock_irqsave(&fd->lock, flags);
	antic = fd->antic_task;
	seq_printf(m, "epoch %llu\nepoch_floor_ns %llu\nwaiting %d\nwait_why %#x\n",
		   fd->epoch, fd->epoch_floor_ns, READ_ONCE(fd->waiting), fd->wait_why);
	seq_printf(m, "queued %u %u\ninflight %u %u\ndispatch_list %s\n",
		   fd->queued[FIOS_READ], fd->queued[FIOS_WRITE], fd->inflight[FIOS_READ],
		   fd->inflight[FIOS_WRITE], list_empty(&fd->dispatch) ? "empty" : "nonempty");
	if (antic)
		seq_printf(m, "anticipating pid %d %s deadline_in_ns %lld\n", antic->pid,
			   fd->antic_read ? "read" : "any",
			   fios_ns_until(fd->antic_deadline_ns, now));
	else
		seq_puts(m, "anticipating none\n");
	seq_printf(m, "epoch_ns %llu\nwrite_cost_ns %llu\nreads_first %d\n", fd->epoch_ns,
		   fd->write_cost_ns, fios_reads_first(fd));
	seq_printf(m, "epoch_slices_ns %llu\nlast_epoch_slices_ns %llu\n", fd->epoch_slices,
		   fd->last_epoch_slices);
	seq_printf(m, "measured_over_calibrated_x256 %u %u\n", fd->drift_x256[FIOS_READ],
		   fd->drift_x256[FIOS_WRITE]);
	seq_printf(m, "timer %s\nshallow_depth %u of %u\n",
		   hrtimer_is_queued(&fd->timer) ? "armed" : "idle", fd->shallow_depth,
		   1U << fd->word_shift);
	spin_unlock_irqrestore(&fd->lock, flags);
	fios_show_icqs(q, m);
	return 0;
}

static void fios_task_show(struct fios_data *fd, struct seq_file *m, struct fios_task *task,
			   const char *who)
{
	seq_printf(m,
		   "%s %d weight %u cg_weight %u left_ns %lld queued %u %u inflight %u service_ns %llu think_ns %llu slowdown_x256 %u served %d%s\n",
		   who, task->pid, task->weight, task->cg_weight, fios_remaining(fd, task),
		   task->queued[FIOS_READ], task->queued[FIOS_WRITE], task->inflight,
		   task->service_ns, task->think_ns, task->slowdown, fios_served(fd, task),
		   task->exited ? " exited" : "");
}

/*
 * One line per task with requests queued in FIOS or on the device: its slice left this epoch
 * (negative: in debt, waiting for the next epoch), queued reads and writes (writes held by
 * write blocking among them), requests in flight, its moving average cost per request and
 * think time (the gap from its last completion to its next request).
 */
static int fios_tasks_show(void *data, struct seq_file *m)
{
	struct request_queue *q = data;
	struct fios_data *fd = q->elevator->elevator_data;
	struct fios_task *task;
	unsigned long flags;

	spin_lock_irqsave(&fd->lock, flags);
	list_for_each_entry(task, &fd->active, active_node)
		fios_task_show(fd, m, task, task == &fd->unowned ? "unowned" : "pid");
	list_for_each_entry(task, &fd->busy, busy_node)
		if (task->inflight && list_empty(&task->active_node)) /* else shown above */
			fios_task_show(fd, m, task, task == &fd->unowned ? "unowned" : "pid");
	spin_unlock_irqrestore(&fd->lock, flags);
	return 0;
}

static const struct blk_mq_debugfs_attr fios_queue_debugfs_attrs[] = {
	{"state", 0400, fios_state_show},
	{"tasks", 0400, fios_tasks_show},
	{},
};
#endif

static struct elevator_type fios_sched = {
	.ops = {
		.limit_depth		= fios_limit_depth,
		.depth_updated		= fios_depth_updated,
		.init_hctx		= fios_init_hctx,
		.insert_requests	= fios_insert_requests,
		.dispatch_request	= fios_dispatch_request,
		.has_work		= fios_has_work,
		.prepare_request	= fios_prepare_request,
		.finish_request		= fios_finish_request,
		.requeue_request	= fios_requeue_request,
		.allow_merge		= fios_allow_merge,
		.bio_merge		= fios_bio_merge,
		.init_icq		= fios_init_icq,
		.exit_icq		= fios_exit_icq,
		.init_sched		= fios_init_sched,
		.exit_sched		= fios_exit_sched,
	},
#ifdef CONFIG_BLK_DEBUG_FS
	.queue_debugfs_attrs = fios_queue_debugfs_attrs,
#endif
	.icq_size = sizeof(struct fios_icq),
	.icq_align = __alignof__(struct fios_icq),
	.elevator_attrs = fios_attrs,
	.elevator_name = "fios",
	.elevator_owner = THIS_MODULE,
};
MODULE_ALIAS("fios-iosched");

static int __init fios_init(void)
{
	int ret = fios_blkcg_register();

	if (ret)
		return ret;
	ret = elv_register(&fios_sched);
	if (ret)
		fios_blkcg_unregister();
	return ret;
}

static void __exit fios_exit(void)
{
	elv_unregister(&fios_sched);
	fios_blkcg_unregister();
}

module_init(fios_init);
module_exit(fios_exit);

MODULE_AUTHOR("blkpilot");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("FIOS: fair, efficient flash I/O scheduler (FAST '12) for blk-mq");
