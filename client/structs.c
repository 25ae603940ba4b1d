/*
 * structs.c — the public structs of zeroclient.h as a binary contract: their
 * frozen layouts (checked here at compile time), their init functions, the
 * library's version, and reading a caller's zc_config by its own size. The
 * plan's structs are read in common/plan.c (plan_from_zc), by the same rules
 * (common/abi.h).
 */
#include <errno.h>
#include <stddef.h>

#include "abi.h"
#include "internal.h"
#include "zeroclient.h"

/*
 * The layouts of ZC_VERSION_MAJOR 1. A binary built against this header
 * passes these offsets forever: a field may be added at the end (where the
 * size tells whether the caller has it), never moved. No implicit padding,
 * so every byte up to sizeof is a field the library reads.
 */
#define FROZEN(type, field, off)                                                                   \
	_Static_assert(offsetof(struct type, field) == (off),                                      \
		       "struct " #type "." #field " moved: the v1 layout is frozen")
#define FROZEN_SIZE(type, n)                                                                       \
	_Static_assert(sizeof(struct type) == (n), "struct " #type " changed size")

FROZEN(zc_param_group, size, 0);
FROZEN(zc_param_group, nesterov, 4);
FROZEN(zc_param_group, amsgrad, 5);
FROZEN(zc_param_group, maximize, 6);
FROZEN(zc_param_group, reserved, 7);
FROZEN(zc_param_group, lr, 8);
FROZEN(zc_param_group, momentum, 16);
FROZEN(zc_param_group, dampening, 24);
FROZEN(zc_param_group, weight_decay, 32);
FROZEN(zc_param_group, beta1, 40);
FROZEN(zc_param_group, beta2, 48);
FROZEN(zc_param_group, eps, 56);
FROZEN(zc_param_group, max_grad_norm, 64);
FROZEN_SIZE(zc_param_group, 72);

FROZEN(zc_segment, size, 0);
FROZEN(zc_segment, group, 4);
FROZEN(zc_segment, offset, 8);
FROZEN(zc_segment, numel, 16);
FROZEN(zc_segment, param_id, 24);
FROZEN_SIZE(zc_segment, 32);

FROZEN(zc_segment_state, size, 0);
FROZEN(zc_segment_state, bucket, 4);
FROZEN(zc_segment_state, segment, 8);
FROZEN(zc_segment_state, present, 12);
FROZEN(zc_segment_state, step, 16);
FROZEN(zc_segment_state, momentum_buffer, 24);
FROZEN(zc_segment_state, exp_avg, 32);
FROZEN(zc_segment_state, exp_avg_sq, 40);
FROZEN(zc_segment_state, max_exp_avg_sq, 48);
FROZEN(zc_segment_state, master, 56);
FROZEN_SIZE(zc_segment_state, 64);

FROZEN(zc_bucket, size, 0);
FROZEN(zc_bucket, nsegments, 4);
FROZEN(zc_bucket, numel, 8);
FROZEN(zc_bucket, segments, 16);
FROZEN(zc_bucket, dtype, 24);
FROZEN(zc_bucket, reserved2, 28);
FROZEN_SIZE(zc_bucket, 32);

FROZEN(zc_plan, size, 0);
FROZEN(zc_plan, optimizer, 4);
FROZEN(zc_plan, shard_mode, 8);
FROZEN(zc_plan, step_mode, 12);
FROZEN(zc_plan, ngroups, 16);
FROZEN(zc_plan, nbuckets, 20);
FROZEN(zc_plan, groups, 24);
FROZEN(zc_plan, buckets, 32);
FROZEN(zc_plan, max_grad_norm, 40);
FROZEN_SIZE(zc_plan, 48);

FROZEN(zc_config, size, 0);
FROZEN(zc_config, rank, 4);
FROZEN(zc_config, world_size, 8);
FROZEN(zc_config, local_rank, 12);
FROZEN(zc_config, local_size, 16);
FROZEN(zc_config, connect_timeout_ms, 20);
FROZEN(zc_config, register_timeout_ms, 24);
FROZEN(zc_config, reserved, 28);
FROZEN(zc_config, socket, 32);
FROZEN(zc_config, job_id, 40);
FROZEN(zc_config, rdzv, 48);
FROZEN(zc_config, job_secret, 56);
FROZEN(zc_config, nnodes, 64);
FROZEN(zc_config, node_rank, 68);
FROZEN(zc_config, has_node_rank, 72);
FROZEN(zc_config, reserved2, 76);
FROZEN_SIZE(zc_config, 80);

FROZEN(zc_buffers, size, 0);
FROZEN(zc_buffers, grad_fd, 4);
FROZEN(zc_buffers, grad_offset, 8);
FROZEN(zc_buffers, param_fd, 16);
FROZEN(zc_buffers, reserved, 20);
FROZEN(zc_buffers, param_offset, 24);
FROZEN(zc_buffers, kind, 32);
FROZEN(zc_buffers, reserved2, 36);
FROZEN(zc_buffers, grad_dev, 40);
FROZEN(zc_buffers, param_dev, 48);
FROZEN(zc_buffers, flags, 56);
FROZEN(zc_buffers, reserved3, 60);
FROZEN_SIZE(zc_buffers, 64);

_Static_assert(sizeof(enum zc_optimizer) == 4 && sizeof(bool) == 1, "the ABI assumes LP64");

unsigned zc_version(void)
{
	return ZC_VERSION;
}

static int init(void *s, size_t size, const void *defaults, size_t ours, const char *type)
{
	int r = abi_init(s, size, defaults, ours);

	if (r < 0)
		return client_err_set(r, "zc_%s_init: %s", type,
				      !s             ? "the struct is NULL"
				      : r == -EINVAL ? "size below 4 bytes"
						     : "size above ZC_STRUCT_MAX_SIZE");
	return 0;
}

int zc_param_group_init(struct zc_param_group *g, size_t size)
{
	static const struct zc_param_group d = ZC_PARAM_GROUP_INIT;

	return init(g, size, &d, sizeof(d), "param_group");
}

int zc_segment_init(struct zc_segment *s, size_t size)
{
	static const struct zc_segment d = ZC_SEGMENT_INIT;

	return init(s, size, &d, sizeof(d), "segment");
}

int zc_segment_state_init(struct zc_segment_state *s, size_t size)
{
	static const struct zc_segment_state d = ZC_SEGMENT_STATE_INIT;

	return init(s, size, &d, sizeof(d), "segment_state");
}

int zc_bucket_init(struct zc_bucket *b, size_t size)
{
	static const struct zc_bucket d = ZC_BUCKET_INIT;

	return init(b, size, &d, sizeof(d), "bucket");
}

int zc_plan_init(struct zc_plan *p, size_t size)
{
	static const struct zc_plan d = ZC_PLAN_INIT;

	return init(p, size, &d, sizeof(d), "plan");
}

int zc_config_init(struct zc_config *cfg, size_t size)
{
	static const struct zc_config d = ZC_CONFIG_INIT;

	return init(cfg, size, &d, sizeof(d), "config");
}

int zc_buffers_init(struct zc_buffers *b, size_t size)
{
	static const struct zc_buffers d = ZC_BUFFERS_INIT;

	return init(b, size, &d, sizeof(d), "buffers");
}

int structs_buffers_from_zc(const struct zc_buffers *src, struct zc_buffers *out)
{
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint32_t size;
	char why[256];
	int r;

	if (!src)
		return client_err_set(-EINVAL, "zc_register_buffers: the buffers are NULL");
	size = abi_size(src);
	r = abi_check(src, size, sizeof(b));
	if (r < 0) {
		abi_reason(r, size, "buffers", "buffers", why, sizeof(why));
		return client_err_set(r, "zc_register_buffers: %s", why);
	}
	ABI_TAKE(&b, src, size, grad_fd);
	ABI_TAKE(&b, src, size, grad_offset);
	ABI_TAKE(&b, src, size, param_fd);
	ABI_TAKE(&b, src, size, reserved);
	ABI_TAKE(&b, src, size, param_offset);
	ABI_TAKE(&b, src, size, kind);
	ABI_TAKE(&b, src, size, reserved2);
	ABI_TAKE(&b, src, size, grad_dev);
	ABI_TAKE(&b, src, size, param_dev);
	ABI_TAKE(&b, src, size, flags);
	ABI_TAKE(&b, src, size, reserved3);
	if (b.reserved || b.reserved2 || b.reserved3) {
		abi_reason(-E2BIG, size, "buffers", "buffers", why, sizeof(why));
		return client_err_set(-E2BIG, "zc_register_buffers: %s", why);
	}
	*out = b;
	return 0;
}

int structs_config_from_zc(const struct zc_config *src, struct zc_config *out)
{
	struct zc_config c = ZC_CONFIG_INIT;
	uint32_t size;
	char why[256];
	int r;

	if (!src)
		return client_err_set(-EINVAL, "zc_connect: the config is NULL");
	size = abi_size(src);
	r = abi_check(src, size, sizeof(c));
	if (r < 0) {
		abi_reason(r, size, "config", "config", why, sizeof(why));
		return client_err_set(r, "zc_connect: %s", why);
	}
	ABI_TAKE(&c, src, size, rank);
	ABI_TAKE(&c, src, size, world_size);
	ABI_TAKE(&c, src, size, local_rank);
	ABI_TAKE(&c, src, size, local_size);
	ABI_TAKE(&c, src, size, connect_timeout_ms);
	ABI_TAKE(&c, src, size, register_timeout_ms);
	ABI_TAKE(&c, src, size, reserved);
	ABI_TAKE(&c, src, size, socket);
	ABI_TAKE(&c, src, size, job_id);
	ABI_TAKE(&c, src, size, rdzv);
	ABI_TAKE(&c, src, size, job_secret);
	ABI_TAKE(&c, src, size, nnodes);
	ABI_TAKE(&c, src, size, node_rank);
	ABI_TAKE(&c, src, size, has_node_rank);
	ABI_TAKE(&c, src, size, reserved2);
	if (c.reserved || c.reserved2) {
		abi_reason(-E2BIG, size, "config", "config", why, sizeof(why));
		return client_err_set(-E2BIG, "zc_connect: %s", why);
	}
	*out = c;
	return 0;
}
