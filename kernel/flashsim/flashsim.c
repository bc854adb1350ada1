// SPDX-License-Identifier: GPL-2.0
/*
 * flashsim: a memory-backed blk-mq block device that behaves like flash where it matters to
 * an I/O scheduler.
 *
 * - Reads and writes have separate service times: a fixed latency plus a per-KiB transfer
 *   time (writes are much slower than reads, as on NAND).
 * - The device has `units` parallel units (dies), the LBA space striped over them in chunks of
 *   `chunk_kb`; a request is served by every unit its sectors are striped onto, each piece
 *   (a fixed latency plus its own transfer) as soon as its unit is free, and completes with its
 *   last piece: a large read keeps several units busy, as on a real SSD. A unit serves one
 *   request at a time. A read that lands
 *   on a unit busy with a write waits behind it: the read-blocked-by-write effect the FIOS
 *   paper measures, while requests on different units proceed in parallel. A write may
 *   occupy several units (`write_units`), as writes striped over dies do: then it also
 *   disrupts the device's read parallelism, which the paper observed on its SSDs.
 * - Interrupt-style completion fires an hrtimer at the request's completion time. Polled
 *   queues (poll_queues > 0, io_uring with IOPOLL) complete a request only when a poll finds
 *   its completion time has passed — unlike null_blk, whose poll queues complete at the first
 *   poll whatever completion_nsec says.
 */

#include <linux/blk-mq.h>
#include <linux/hrtimer.h>
#include <linux/list.h>
#include <linux/log2.h>
#include <linux/module.h>
#include <linux/spinlock.h>
#include <linux/vmalloc.h>

static unsigned int size_mb = 128;
module_param(size_mb, uint, 0444);
MODULE_PARM_DESC(size_mb, "Capacity in MiB (memory backed)");

static unsigned int units = 4;
module_param(units, uint, 0444);
MODULE_PARM_DESC(units, "Parallel units; a unit serves one request at a time");

static unsigned int write_units = 1;
module_param(write_units, uint, 0444);
MODULE_PARM_DESC(write_units,
		 "Units a write occupies (its unit and the next ones): writes that disrupt read parallelism");

static unsigned int read_lat_ns = 25000;
module_param(read_lat_ns, uint, 0444);
MODULE_PARM_DESC(read_lat_ns, "Read latency before transfer");

static unsigned int read_ns_per_kb = 50;
module_param(read_ns_per_kb, uint, 0444);
MODULE_PARM_DESC(read_ns_per_kb, "Read transfer time per KiB");

static unsigned int write_lat_ns = 250000;
module_param(write_lat_ns, uint, 0444);
MODULE_PARM_DESC(write_lat_ns, "Write (program) latency before transfer");

static unsigned int write_ns_per_kb = 200;
module_param(write_ns_per_kb, uint, 0444);
MODULE_PARM_DESC(write_ns_per_kb, "Write transfer time per KiB");

static unsigned int poll_queues;
module_param(poll_queues, uint, 0444);
MODULE_PARM_DESC(poll_queues, "Hardware queues completed by polling (0: interrupts only)");

static unsigned int submit_queues = 1;
module_param(submit_queues, uint, 0444);
MODULE_PARM_DESC(submit_queues, "Hardware queues for submission (interrupt-completed)");

static unsigned int chunk_kb = 64;
module_param(chunk_kb, uint, 0444);
MODULE_PARM_DESC(chunk_kb, "Stripe unit in KiB (a power of two, 4 to 1024)");

static unsigned int queue_depth = 64;
module_param(queue_depth, uint, 0444);
MODULE_PARM_DESC(queue_depth, "Tags per hardware queue");

#define FLASHSIM_MAX_UNITS 64
#define FLASHSIM_MAX_QUEUES 16

struct flashsim_cmd {
	struct hrtimer timer;
	struct list_head poll_entry;
	u64 done_ns;
};

struct flashsim_pollq {
	spinlock_t lock;	/* pending */
	struct list_head pending;
};

struct flashsim {
	u8 *data;
	sector_t sectors;
	spinlock_t units_lock;	/* busy_until */
	u64 busy_until[FLASHSIM_MAX_UNITS];
	struct flashsim_pollq *pollqs;
	struct blk_mq_tag_set tag_set;
	struct gendisk *disk;
	int major;
};

static struct flashsim *flashsim;

static u64 service_ns(bool write, unsigned int bytes)
{
	u64 kib = DIV_ROUND_UP(bytes, 1024);

	if (write)
		return write_lat_ns + kib * write_ns_per_kb;
	return read_lat_ns + kib * read_ns_per_kb;
}

/*
 * When the request finishes. Each chunk-sized piece goes to its unit (a write to `write_units`
 * units from there) and starts when those units are free; the request is done with its last
 * piece. Pieces of one request on the same unit run one after the other. A write that takes
 * several units (write_units > 1) is one piece on the units from its first chunk.
 */
static u64 schedule_on_units(struct flashsim *dev, struct request *rq)
{
	unsigned int chunk_sectors = chunk_kb << 1;
	bool write = rq_data_dir(rq) == WRITE;
	unsigned int span = write ? write_units : 1;
	sector_t pos = blk_rq_pos(rq), end = pos + blk_rq_sectors(rq);
	u64 now = ktime_get_ns(), done = now;
	unsigned long flags;

	spin_lock_irqsave(&dev->units_lock, flags);
	do {
		/* a write that occupies several units anyway is served whole, as before */
		sector_t next = span > 1 ? end :
			min_t(sector_t, round_down(pos, chunk_sectors) + chunk_sectors, end);
		unsigned int unit = div_u64(pos, chunk_sectors) % units;
		u64 start = now, finish;
		unsigned int i;

		for (i = 0; i < span; i++)
			start = max(start, dev->busy_until[(unit + i) % units]);
		finish = start + service_ns(write, (next - pos) << SECTOR_SHIFT);
		for (i = 0; i < span; i++)
			dev->busy_until[(unit + i) % units] = finish;
		done = max(done, finish);
		pos = next;
	} while (pos < end);
	spin_unlock_irqrestore(&dev->units_lock, flags);
	return done;
}

static blk_status_t copy_data(struct flashsim *dev, struct request *rq)
{
	struct req_iterator iter;
	struct bio_vec bvec;
	loff_t pos = (loff_t)blk_rq_pos(rq) << SECTOR_SHIFT;

	if (blk_rq_pos(rq) + blk_rq_sectors(rq) > dev->sectors)
		return BLK_STS_IOERR;
	rq_for_each_segment(bvec, rq, iter) {
		void *buf = bvec_kmap_local(&bvec);

		if (rq_data_dir(rq) == WRITE)
			memcpy(dev->data + pos, buf, bvec.bv_len);
		else
			memcpy(buf, dev->data + pos, bvec.bv_len);
		kunmap_local(buf);
		pos += bvec.bv_len;
	}
	return BLK_STS_OK;
}

static enum hrtimer_restart flashsim_timer(struct hrtimer *timer)
{
	struct flashsim_cmd *cmd = container_of(timer, struct flashsim_cmd, timer);

	blk_mq_end_request(blk_mq_rq_from_pdu(cmd), BLK_STS_OK);
	return HRTIMER_NORESTART;
}

static blk_status_t flashsim_queue_rq(struct blk_mq_hw_ctx *hctx,
				      const struct blk_mq_queue_data *bd)
{
	struct request *rq = bd->rq;
	struct flashsim *dev = hctx->queue->queuedata;
	struct flashsim_cmd *cmd = blk_mq_rq_to_pdu(rq);
	blk_status_t status;

	blk_mq_start_request(rq);
	switch (req_op(rq)) {
	case REQ_OP_READ:
	case REQ_OP_WRITE:
		break;
	case REQ_OP_FLUSH:
	case REQ_OP_DISCARD:
		blk_mq_end_request(rq, BLK_STS_OK);
		return BLK_STS_OK;
	default:
		return BLK_STS_NOTSUPP;
	}
	status = copy_data(dev, rq);
	if (status != BLK_STS_OK)
		return status;
	cmd->done_ns = schedule_on_units(dev, rq);
	if (hctx->type == HCTX_TYPE_POLL) {
		struct flashsim_pollq *pq = hctx->driver_data;

		spin_lock(&pq->lock);
		list_add_tail(&cmd->poll_entry, &pq->pending);
		spin_unlock(&pq->lock);
		return BLK_STS_OK;
	}
	hrtimer_start(&cmd->timer, ns_to_ktime(cmd->done_ns), HRTIMER_MODE_ABS);
	return BLK_STS_OK;
}

/* Complete what is due, and only that: polling cannot make the device faster. */
static int flashsim_poll(struct blk_mq_hw_ctx *hctx, struct io_comp_batch *iob)
{
	struct flashsim_pollq *pq = hctx->driver_data;
	struct flashsim_cmd *cmd, *next;
	LIST_HEAD(due);
	u64 now = ktime_get_ns();
	int completed = 0;

	spin_lock(&pq->lock);
	list_for_each_entry_safe(cmd, next, &pq->pending, poll_entry) {
		if (cmd->done_ns <= now)
			list_move_tail(&cmd->poll_entry, &due);
	}
	spin_unlock(&pq->lock);
	list_for_each_entry_safe(cmd, next, &due, poll_entry) {
		list_del_init(&cmd->poll_entry);
		blk_mq_end_request(blk_mq_rq_from_pdu(cmd), BLK_STS_OK);
		completed++;
	}
	return completed;
}

static int flashsim_init_hctx(struct blk_mq_hw_ctx *hctx, void *data, unsigned int index)
{
	struct flashsim *dev = data;

	hctx->driver_data = &dev->pollqs[index];
	return 0;
}

static int flashsim_init_request(struct blk_mq_tag_set *set, struct request *rq,
				 unsigned int hctx_idx, unsigned int numa_node)
{
	struct flashsim_cmd *cmd = blk_mq_rq_to_pdu(rq);

	hrtimer_init(&cmd->timer, CLOCK_MONOTONIC, HRTIMER_MODE_ABS);
	cmd->timer.function = flashsim_timer;
	INIT_LIST_HEAD(&cmd->poll_entry);
	return 0;
}

static void flashsim_map_queues(struct blk_mq_tag_set *set)
{
	struct blk_mq_queue_map *map;

	map = &set->map[HCTX_TYPE_DEFAULT];
	map->nr_queues = submit_queues;
	map->queue_offset = 0;
	blk_mq_map_queues(map);
	if (set->nr_maps > HCTX_TYPE_POLL) {
		set->map[HCTX_TYPE_READ].nr_queues = 0;
		map = &set->map[HCTX_TYPE_POLL];
		map->nr_queues = poll_queues;
		map->queue_offset = submit_queues;
		blk_mq_map_queues(map);
	}
}

static const struct blk_mq_ops flashsim_mq_ops = {
	.queue_rq = flashsim_queue_rq,
	.poll = flashsim_poll,
	.init_hctx = flashsim_init_hctx,
	.init_request = flashsim_init_request,
	.map_queues = flashsim_map_queues,
};

static const struct block_device_operations flashsim_fops = {
	.owner = THIS_MODULE,
};

static int __init flashsim_init(void)
{
	struct flashsim *dev;
	unsigned int hw_queues;
	int err;

	if (!units || units > FLASHSIM_MAX_UNITS || !size_mb || poll_queues > 4 ||
	    !write_units || write_units > units || !submit_queues ||
	    submit_queues > FLASHSIM_MAX_QUEUES || chunk_kb < 4 || chunk_kb > 1024 ||
	    !is_power_of_2(chunk_kb))
		return -EINVAL;
	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	spin_lock_init(&dev->units_lock);
	dev->sectors = (sector_t)size_mb << (20 - SECTOR_SHIFT);
	dev->data = vzalloc((size_t)size_mb << 20);
	hw_queues = submit_queues + poll_queues;
	dev->pollqs = kcalloc(hw_queues, sizeof(*dev->pollqs), GFP_KERNEL);
	err = -ENOMEM;
	if (!dev->data || !dev->pollqs)
		goto free;
	for (unsigned int i = 0; i < hw_queues; i++) {
		spin_lock_init(&dev->pollqs[i].lock);
		INIT_LIST_HEAD(&dev->pollqs[i].pending);
	}

	dev->major = register_blkdev(0, "flashsim");
	if (dev->major < 0) {
		err = dev->major;
		goto free;
	}
	dev->tag_set.ops = &flashsim_mq_ops;
	dev->tag_set.nr_hw_queues = hw_queues;
	dev->tag_set.nr_maps = poll_queues ? HCTX_MAX_TYPES : 1;
	dev->tag_set.queue_depth = queue_depth;
	dev->tag_set.numa_node = NUMA_NO_NODE;
	dev->tag_set.cmd_size = sizeof(struct flashsim_cmd);
	dev->tag_set.flags = BLK_MQ_F_SHOULD_MERGE;
	dev->tag_set.driver_data = dev;
	err = blk_mq_alloc_tag_set(&dev->tag_set);
	if (err)
		goto unregister;

	dev->disk = blk_mq_alloc_disk(&dev->tag_set, dev);
	if (IS_ERR(dev->disk)) {
		err = PTR_ERR(dev->disk);
		goto free_tags;
	}
	dev->disk->major = dev->major;
	dev->disk->first_minor = 0;
	dev->disk->minors = 1;
	dev->disk->fops = &flashsim_fops;
	dev->disk->private_data = dev;
	snprintf(dev->disk->disk_name, DISK_NAME_LEN, "flashsim0");
	set_capacity(dev->disk, dev->sectors);
	blk_queue_logical_block_size(dev->disk->queue, 512);
	blk_queue_physical_block_size(dev->disk->queue, 4096);
	/* whole requests up to 1 MiB, as flash takes them (and no split polled bios) */
	blk_queue_max_hw_sectors(dev->disk->queue, 2048);
	blk_queue_flag_set(QUEUE_FLAG_NONROT, dev->disk->queue);
	err = add_disk(dev->disk);
	if (err)
		goto put_disk;
	flashsim = dev;
	pr_info("flashsim0: %u MiB, %u units of %u KiB stripes, read %u ns + %u ns/KiB, write %u ns + %u ns/KiB on %u units, %u submit and %u poll queues\n",
		size_mb, units, chunk_kb, read_lat_ns, read_ns_per_kb, write_lat_ns,
		write_ns_per_kb, write_units, submit_queues, poll_queues);
	return 0;

put_disk:
	put_disk(dev->disk);
free_tags:
	blk_mq_free_tag_set(&dev->tag_set);
unregister:
	unregister_blkdev(dev->major, "flashsim");
free:
	kfree(dev->pollqs);
	vfree(dev->data);
	kfree(dev);
	return err;
}

static void __exit flashsim_exit(void)
{
	struct flashsim *dev = flashsim;

	del_gendisk(dev->disk);
	put_disk(dev->disk);
	blk_mq_free_tag_set(&dev->tag_set);
	unregister_blkdev(dev->major, "flashsim");
	kfree(dev->pollqs);
	vfree(dev->data);
	kfree(dev);
}

module_init(flashsim_init);
module_exit(flashsim_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("A memory-backed blk-mq device with flash-like read/write asymmetry");
