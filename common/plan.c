/*
 * plan.c — validation, copying, hashing and comparison of plans. Everything a
 * client declares passes through plan_from_pb() in the daemon, so this is the
 * edge where a plan's sizes, indices and hyperparameters are checked and
 * bounded.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "common.h"
#include "plan.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return ZC_EPLANINVAL;
}

const char *plan_optimizer_name(enum zc_optimizer o)
{
	switch (o) {
	case ZC_OPT_SGD:
		return "sgd";
	case ZC_OPT_ADAM:
		return "adam";
	case ZC_OPT_ADAMW:
		return "adamw";
	}
	return "?";
}

const char *plan_shard_name(enum zc_shard_mode m)
{
	switch (m) {
	case ZC_SHARD_BUCKET:
		return "bucket";
	case ZC_SHARD_SLICE:
		return "slice";
	}
	return "?";
}

const char *plan_step_name(enum zc_step_mode m)
{
	switch (m) {
	case ZC_STEP_INTERLEAVED:
		return "interleaved";
	case ZC_STEP_AT_END:
		return "at_end";
	}
	return "?";
}

const char *plan_dtype_name(enum zc_dtype t)
{
	switch (t) {
	case ZC_DTYPE_F32:
		return "fp32";
	case ZC_DTYPE_BF16:
		return "bf16";
	case ZC_DTYPE_F16:
		return "fp16";
	}
	return "?";
}

static bool finite_nonneg(double x)
{
	return isfinite(x) && x >= 0;
}

/* Whether optimizer opt reads group field `name`. */
static bool plan_group_uses(enum zc_optimizer opt, const char *name)
{
	bool sgd = strcmp(name, "momentum") == 0 || strcmp(name, "dampening") == 0;
	bool adam = strcmp(name, "beta1") == 0 || strcmp(name, "beta2") == 0 ||
		    strcmp(name, "eps") == 0;

	return opt == ZC_OPT_SGD ? !adam : !sgd;
}

int plan_group_check(enum zc_optimizer opt, const struct zc_param_group *g, char *err,
		     size_t errlen)
{
	const struct {
		const char *name;
		double v;
	} all[] = {{"lr", g->lr},       {"momentum", g->momentum}, {"dampening", g->dampening},
		   {"weight_decay", g->weight_decay}, {"beta1", g->beta1}, {"beta2", g->beta2},
		   {"eps", g->eps}};

	/* every field, also those this optimizer ignores: a NaN would make
	 * two equal plans compare unequal (NaN != NaN) */
	for (size_t i = 0; i < ARRAY_SIZE(all); i++)
		if (!isfinite(all[i].v))
			return fail(err, errlen, "%s must be finite (got %g)%s", all[i].name,
				    all[i].v,
				    plan_group_uses(opt, all[i].name) ? "" : ", even where unused");
	if (!finite_nonneg(g->lr))
		return fail(err, errlen, "lr must be finite and >= 0 (got %g)", g->lr);
	if (!finite_nonneg(g->weight_decay))
		return fail(err, errlen, "weight_decay must be finite and >= 0 (got %g)",
			    g->weight_decay);
	if (opt == ZC_OPT_SGD) {
		if (!finite_nonneg(g->momentum))
			return fail(err, errlen, "momentum must be finite and >= 0 (got %g)",
				    g->momentum);
		if (!isfinite(g->dampening))
			return fail(err, errlen, "dampening must be finite");
		if (g->nesterov && (g->momentum <= 0 || g->dampening != 0))
			return fail(err, errlen,
				    "nesterov needs momentum > 0 and dampening 0 (as torch)");
	} else {
		if (!(g->beta1 >= 0 && g->beta1 < 1))
			return fail(err, errlen, "beta1 must be in [0, 1) (got %g)", g->beta1);
		if (!(g->beta2 >= 0 && g->beta2 < 1))
			return fail(err, errlen, "beta2 must be in [0, 1) (got %g)", g->beta2);
		if (!finite_nonneg(g->eps))
			return fail(err, errlen, "eps must be finite and >= 0 (got %g)", g->eps);
	}
	if (!finite_nonneg(g->max_grad_norm))
		return fail(err, errlen, "max_grad_norm must be finite and >= 0 (got %g)",
			    g->max_grad_norm);
	return 0;
}

int plan_clip_check(const struct plan *p, const struct zc_param_group *g, char *err, size_t errlen)
{
	if (g->max_grad_norm == 0)
		return 0;
	if (p->step_mode != ZC_STEP_AT_END)
		return fail(err, errlen,
			    "max_grad_norm needs step_mode at_end: clipping needs every bucket "
			    "reduced before any step");
	if (p->max_grad_norm != 0)
		return fail(err, errlen,
			    "max_grad_norm of a group and of the plan: clip globally or per "
			    "group, not both");
	return 0;
}

void plan_free(struct plan *p)
{
	if (!p)
		return;
	if (p->buckets)
		for (uint32_t b = 0; b < p->nbuckets; b++)
			free(p->buckets[b].segments);
	free(p->buckets);
	free(p->groups);
	free(p);
}

/* FNV-1a, 64 bit: a stable fingerprint of the plan for logs and PlanOk. */
static void hash_bytes(uint64_t *h, const void *data, size_t n)
{
	const unsigned char *s = data;

	for (size_t i = 0; i < n; i++) {
		*h ^= s[i];
		*h *= 1099511628211ull;
	}
}

#define HASH_FIELD(h, v)                                                                           \
	do {                                                                                       \
		__typeof__(v) hash_tmp_ = (v);                                                     \
		hash_bytes((h), &hash_tmp_, sizeof(hash_tmp_));                                    \
	} while (0)

static uint64_t plan_hash(const struct plan *p)
{
	uint64_t h = 14695981039346656037ull;

	HASH_FIELD(&h, (uint32_t)p->optimizer);
	HASH_FIELD(&h, (uint32_t)p->shard_mode);
	HASH_FIELD(&h, (uint32_t)p->step_mode);
	HASH_FIELD(&h, p->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++) {
		const struct zc_param_group *pg = &p->groups[g];
		/* + 0.0: -0.0 and 0.0 compare equal (plan_diff), so they hash
		 * the same */
		double d[] = {pg->lr + 0.0,    pg->momentum + 0.0, pg->dampening + 0.0,
			      pg->weight_decay + 0.0, pg->beta1 + 0.0, pg->beta2 + 0.0,
			      pg->eps + 0.0};
		uint8_t f[] = {pg->nesterov, pg->amsgrad, pg->maximize};
		hash_bytes(&h, d, sizeof(d));
		hash_bytes(&h, f, sizeof(f));
		if (pg->max_grad_norm != 0) /* older plans keep their hash */
			HASH_FIELD(&h, pg->max_grad_norm);
	}
	if (p->max_grad_norm != 0)
		HASH_FIELD(&h, p->max_grad_norm);
	HASH_FIELD(&h, p->nbuckets);
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		HASH_FIELD(&h, p->buckets[b].numel);
		HASH_FIELD(&h, p->buckets[b].nsegments);
		/* fp32 hashes as before dtypes existed */
		if (p->buckets[b].dtype != ZC_DTYPE_F32)
			HASH_FIELD(&h, (uint32_t)p->buckets[b].dtype);
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++) {
			const struct zc_segment *sg = &p->buckets[b].segments[s];
			HASH_FIELD(&h, sg->offset);
			HASH_FIELD(&h, sg->numel);
			HASH_FIELD(&h, sg->group);
			if (sg->param_id) /* plans of older callers keep their hash */
				HASH_FIELD(&h, sg->param_id);
		}
	}
	return h;
}

struct id_at {
	uint64_t id;
	uint32_t bucket, segment;
};

static int id_cmp(const void *a, const void *b)
{
	const struct id_at *x = a, *y = b;

	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return x->segment < y->segment ? -1 : x->segment > y->segment;
}

/* Nonzero param_ids name one segment each. */
static int check_param_ids(const struct plan *p, uint64_t nseg, char *err, size_t errlen)
{
	struct id_at *ids = calloc(nseg ? nseg : 1, sizeof(*ids));
	size_t n = 0;
	int r = 0;

	if (!ids)
		return -ENOMEM;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++)
			if (p->buckets[b].segments[s].param_id)
				ids[n++] = (struct id_at){
					.id = p->buckets[b].segments[s].param_id,
					.bucket = b,
					.segment = s,
				};
	qsort(ids, n, sizeof(*ids), id_cmp);
	for (size_t i = 1; i < n && r == 0; i++)
		if (ids[i].id == ids[i - 1].id)
			r = fail(err, errlen,
				 "buckets[%u].segments[%u].param_id: %" PRIu64
				 " is also buckets[%u].segments[%u]'s",
				 ids[i].bucket, ids[i].segment, ids[i].id, ids[i - 1].bucket,
				 ids[i - 1].segment);
	free(ids);
	return r;
}

/*
 * Checks shared by both sources once the scalar fields are copied: segments
 * tile each bucket exactly, indices are in range, totals are bounded; then
 * computes the flat layout and the hash.
 */
static int plan_finish(struct plan *p, char *err, size_t errlen)
{
	uint64_t bytes = 0, nseg = 0, sslots = 0;
	int r;

	if (p->optimizer < ZC_OPT_SGD || p->optimizer > ZC_OPT_ADAMW)
		return fail(err, errlen, "optimizer: unknown value %d", (int)p->optimizer);
	if (p->shard_mode != ZC_SHARD_BUCKET && p->shard_mode != ZC_SHARD_SLICE)
		return fail(err, errlen, "shard_mode: unknown value %d", (int)p->shard_mode);
	if (p->step_mode != ZC_STEP_INTERLEAVED && p->step_mode != ZC_STEP_AT_END)
		return fail(err, errlen, "step_mode: unknown value %d", (int)p->step_mode);
	if (p->ngroups == 0 || p->ngroups > PLAN_MAX_GROUPS)
		return fail(err, errlen, "groups: need 1..%u, got %u", PLAN_MAX_GROUPS, p->ngroups);
	if (p->nbuckets == 0 || p->nbuckets > PLAN_MAX_BUCKETS)
		return fail(err, errlen, "buckets: need 1..%u, got %u", PLAN_MAX_BUCKETS,
			    p->nbuckets);
	if (!finite_nonneg(p->max_grad_norm))
		return fail(err, errlen, "max_grad_norm must be finite and >= 0 (got %g)",
			    p->max_grad_norm);
	if (p->max_grad_norm != 0 && p->step_mode != ZC_STEP_AT_END)
		return fail(err, errlen,
			    "max_grad_norm needs step_mode at_end: clipping needs every bucket "
			    "reduced before any step");
	for (uint32_t g = 0; g < p->ngroups; g++) {
		char why[160];
		if (plan_group_check(p->optimizer, &p->groups[g], why, sizeof(why)) < 0 ||
		    plan_clip_check(p, &p->groups[g], why, sizeof(why)) < 0)
			return fail(err, errlen, "groups[%u]: %s", g, why);
	}
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		struct plan_bucket *bk = &p->buckets[b];
		uint64_t at = 0;

		if (bk->numel == 0 || bk->numel > PLAN_MAX_NUMEL)
			return fail(err, errlen, "buckets[%u].numel: %" PRIu64 " out of range", b,
				    bk->numel);
		if (bk->dtype != ZC_DTYPE_F32 && bk->dtype != ZC_DTYPE_BF16 &&
		    bk->dtype != ZC_DTYPE_F16)
			return fail(err, errlen,
				    "buckets[%u].dtype: unknown value %u (0 fp32, 1 bf16, 2 fp16)",
				    b, (unsigned)bk->dtype);
		if (bk->nsegments == 0)
			return fail(err, errlen, "buckets[%u]: no segments", b);
		nseg += bk->nsegments;
		if (nseg > PLAN_MAX_SEGMENTS)
			return fail(err, errlen, "more than %u segments", PLAN_MAX_SEGMENTS);
		for (uint32_t s = 0; s < bk->nsegments; s++) {
			const struct zc_segment *sg = &bk->segments[s];
			if (sg->group >= p->ngroups)
				return fail(err, errlen,
					    "buckets[%u].segments[%u].group: %u, only %u groups", b,
					    s, sg->group, p->ngroups);
			if (sg->offset != at)
				return fail(err, errlen,
					    "buckets[%u].segments[%u].offset: %" PRIu64
					    ", expected %" PRIu64
					    " (segments must tile the bucket)",
					    b, s, sg->offset, at);
			if (sg->numel == 0 || sg->numel > bk->numel - at)
				return fail(err, errlen,
					    "buckets[%u].segments[%u].numel: %" PRIu64
					    " does not fit the bucket",
					    b, s, sg->numel);
			at += sg->numel;
		}
		if (at != bk->numel)
			return fail(err, errlen,
				    "buckets[%u]: segments cover %" PRIu64 " of %" PRIu64
				    " elements",
				    b, at, bk->numel);
		bk->base = bytes / plan_dtype_size(bk->dtype);
		bk->sbase = sslots;
		sslots += (bk->numel + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
		bytes += (bk->numel * plan_dtype_size(bk->dtype) + PLAN_ALIGN_BYTES - 1) /
			 PLAN_ALIGN_BYTES * PLAN_ALIGN_BYTES;
		if (bk->dtype != ZC_DTYPE_F32)
			p->low_precision = true;
		if (bytes > PLAN_MAX_NUMEL * sizeof(float))
			return fail(err, errlen, "plan larger than %llu bytes",
				    PLAN_MAX_NUMEL * sizeof(float));
	}
	p->total_numel = bytes / sizeof(float);
	p->total_bytes = bytes;
	p->state_numel = sslots;
	r = check_param_ids(p, nseg, err, errlen);
	if (r < 0)
		return r;
	p->hash = plan_hash(p);
	return 0;
}

static struct plan *plan_alloc(uint32_t ngroups, uint32_t nbuckets)
{
	struct plan *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->ngroups = ngroups;
	p->nbuckets = nbuckets;
	p->groups = calloc(ngroups ? ngroups : 1, sizeof(*p->groups));
	p->buckets = calloc(nbuckets ? nbuckets : 1, sizeof(*p->buckets));
	if (!p->groups || !p->buckets) {
		plan_free(p);
		return NULL;
	}
	return p;
}

/*
 * Reading the caller's structs (zeroclient.h, "ABI"): each by its own size,
 * arrays with the stride of their first element's size.
 */
static int abi_fail(int r, const void *src, const char *what, const char *type, char *err,
		    size_t errlen)
{
	abi_reason(r, abi_size(src), what, type, err, errlen);
	return r;
}

/* Element i of an array whose elements are all `stride` bytes: -EINVAL if it
 * says otherwise. */
static int array_elem(const void *base, uint32_t stride, uint32_t i, const char *what,
		      const void **ret, char *err, size_t errlen)
{
	const void *e = (const char *)base + (size_t)stride * i;

	if (abi_size(e) != stride) {
		snprintf(err, errlen,
			 "%s[%u].size is %u, %s[0].size %u: the elements of one array have one "
			 "size",
			 what, i, abi_size(e), what, stride);
		return -EINVAL;
	}
	*ret = e;
	return 0;
}

int plan_group_from_zc(const void *src, const char *what, struct zc_param_group *out, char *err,
		       size_t errlen)
{
	static const struct zc_param_group defaults = ZC_PARAM_GROUP_INIT;
	uint32_t size = abi_size(src);
	struct zc_param_group g = defaults;
	int r = abi_check(src, size, sizeof(g));

	if (r < 0)
		return abi_fail(r, src, what, "param_group", err, errlen);
	ABI_TAKE_BOOL(&g, src, size, nesterov);
	ABI_TAKE_BOOL(&g, src, size, amsgrad);
	ABI_TAKE_BOOL(&g, src, size, maximize);
	ABI_TAKE(&g, src, size, reserved);
	ABI_TAKE(&g, src, size, lr);
	ABI_TAKE(&g, src, size, momentum);
	ABI_TAKE(&g, src, size, dampening);
	ABI_TAKE(&g, src, size, weight_decay);
	ABI_TAKE(&g, src, size, beta1);
	ABI_TAKE(&g, src, size, beta2);
	ABI_TAKE(&g, src, size, eps);
	ABI_TAKE(&g, src, size, max_grad_norm);
	if (g.reserved)
		return abi_fail(-E2BIG, src, what, "param_group", err, errlen);
	g.size = sizeof(g);
	*out = g;
	return 0;
}

static int segment_from_zc(const void *src, const char *what, struct zc_segment *out, char *err,
			   size_t errlen)
{
	uint32_t size = abi_size(src);
	struct zc_segment s = ZC_SEGMENT_INIT;
	int r = abi_check(src, size, sizeof(s));

	if (r < 0)
		return abi_fail(r, src, what, "segment", err, errlen);
	ABI_TAKE(&s, src, size, group);
	ABI_TAKE(&s, src, size, offset);
	ABI_TAKE(&s, src, size, numel);
	ABI_TAKE(&s, src, size, param_id);
	*out = s;
	return 0;
}

static int bucket_from_zc(const void *src, const char *what, struct zc_bucket *out, char *err,
			  size_t errlen)
{
	uint32_t size = abi_size(src);
	struct zc_bucket b = ZC_BUCKET_INIT;
	int r = abi_check(src, size, sizeof(b));

	if (r < 0)
		return abi_fail(r, src, what, "bucket", err, errlen);
	ABI_TAKE(&b, src, size, nsegments);
	ABI_TAKE(&b, src, size, numel);
	ABI_TAKE(&b, src, size, segments);
	ABI_TAKE(&b, src, size, dtype);
	ABI_TAKE(&b, src, size, reserved2);
	if (b.reserved2)
		return abi_fail(-E2BIG, src, what, "bucket", err, errlen);
	*out = b;
	return 0;
}

static int plan_struct_from_zc(const void *src, struct zc_plan *out, char *err, size_t errlen)
{
	uint32_t size = abi_size(src);
	struct zc_plan p = ZC_PLAN_INIT;
	int r = abi_check(src, size, sizeof(p));

	if (r < 0)
		return abi_fail(r, src, "plan", "plan", err, errlen);
	ABI_TAKE(&p, src, size, optimizer);
	ABI_TAKE(&p, src, size, shard_mode);
	ABI_TAKE(&p, src, size, step_mode);
	ABI_TAKE(&p, src, size, ngroups);
	ABI_TAKE(&p, src, size, nbuckets);
	ABI_TAKE(&p, src, size, groups);
	ABI_TAKE(&p, src, size, buckets);
	ABI_TAKE(&p, src, size, max_grad_norm);
	*out = p;
	return 0;
}

int plan_from_zc(const struct zc_plan *zp, struct plan **ret, char *err, size_t errlen)
{
	struct zc_plan in;
	struct plan *p;
	char what[64];
	uint32_t gstride, bstride;
	int r;

	if (!zp)
		return fail(err, errlen, "no plan");
	r = plan_struct_from_zc(zp, &in, err, errlen);
	if (r < 0)
		return r;
	if (in.ngroups > PLAN_MAX_GROUPS || in.nbuckets > PLAN_MAX_BUCKETS)
		return fail(err, errlen, "too many groups or buckets");
	if ((in.ngroups && !in.groups) || (in.nbuckets && !in.buckets))
		return fail(err, errlen, "groups or buckets array is NULL");
	p = plan_alloc(in.ngroups, in.nbuckets);
	if (!p)
		return -ENOMEM;
	p->optimizer = in.optimizer;
	p->shard_mode = in.shard_mode;
	p->step_mode = in.step_mode;
	p->max_grad_norm = in.max_grad_norm;
	gstride = in.ngroups ? abi_size(in.groups) : 0;
	for (uint32_t g = 0; g < in.ngroups; g++) {
		const void *src;

		snprintf(what, sizeof(what), "groups[%u]", g);
		r = array_elem(in.groups, gstride, g, "groups", &src, err, errlen);
		if (r >= 0)
			r = plan_group_from_zc(src, what, &p->groups[g], err, errlen);
		if (r < 0)
			goto out;
	}
	bstride = in.nbuckets ? abi_size(in.buckets) : 0;
	for (uint32_t b = 0; b < in.nbuckets; b++) {
		struct plan_bucket *dst = &p->buckets[b];
		const void *src;
		struct zc_bucket bk;
		uint32_t sstride;

		snprintf(what, sizeof(what), "buckets[%u]", b);
		r = array_elem(in.buckets, bstride, b, "buckets", &src, err, errlen);
		if (r >= 0)
			r = bucket_from_zc(src, what, &bk, err, errlen);
		if (r < 0)
			goto out;
		if (bk.nsegments > PLAN_MAX_SEGMENTS || (bk.nsegments && !bk.segments)) {
			r = fail(err, errlen, "buckets[%u]: bad segment array", b);
			goto out;
		}
		dst->numel = bk.numel;
		dst->dtype = (enum zc_dtype)bk.dtype;
		dst->nsegments = bk.nsegments;
		dst->segments = calloc(bk.nsegments ? bk.nsegments : 1, sizeof(*dst->segments));
		if (!dst->segments) {
			r = -ENOMEM;
			goto out;
		}
		sstride = bk.nsegments ? abi_size(bk.segments) : 0;
		for (uint32_t s = 0; s < bk.nsegments; s++) {
			const void *ssrc;

			snprintf(what, sizeof(what), "buckets[%u].segments", b);
			r = array_elem(bk.segments, sstride, s, what, &ssrc, err, errlen);
			snprintf(what, sizeof(what), "buckets[%u].segments[%u]", b, s);
			if (r >= 0)
				r = segment_from_zc(ssrc, what, &dst->segments[s], err, errlen);
			if (r < 0)
				goto out;
		}
	}
	r = plan_finish(p, err, errlen);
	if (r < 0)
		goto out;
	*ret = p;
	return 0;
out:
	plan_free(p);
	return r;
}

void plan_group_from_pb(const Zerod__V1__ParamGroup *in, struct zc_param_group *out)
{
	/* protobuf-c fills absent optional fields with the .proto defaults. */
	*out = (struct zc_param_group){
		.size = sizeof(*out),
		.lr = in->lr,
		.momentum = in->momentum,
		.dampening = in->dampening,
		.weight_decay = in->weight_decay,
		.beta1 = in->beta1,
		.beta2 = in->beta2,
		.eps = in->eps,
		.nesterov = in->nesterov,
		.amsgrad = in->amsgrad,
		.maximize = in->maximize,
		.max_grad_norm = in->max_grad_norm,
	};
}

void plan_group_to_pb(const struct zc_param_group *in, Zerod__V1__ParamGroup *out)
{
	zerod__v1__param_group__init(out);
	out->lr = in->lr;
	out->has_momentum = out->has_dampening = out->has_weight_decay = 1;
	out->has_beta1 = out->has_beta2 = out->has_eps = 1;
	out->has_nesterov = out->has_amsgrad = out->has_maximize = 1;
	out->momentum = in->momentum;
	out->dampening = in->dampening;
	out->weight_decay = in->weight_decay;
	out->beta1 = in->beta1;
	out->beta2 = in->beta2;
	out->eps = in->eps;
	out->nesterov = in->nesterov;
	out->amsgrad = in->amsgrad;
	out->maximize = in->maximize;
	/* absent when 0: an older daemon reads the message it always did */
	out->has_max_grad_norm = in->max_grad_norm != 0;
	out->max_grad_norm = in->max_grad_norm;
}

int plan_from_pb(const Zerod__V1__Plan *in, struct plan **ret, char *err, size_t errlen)
{
	struct plan *p;
	int r;

	if (in->n_groups > PLAN_MAX_GROUPS || in->n_buckets > PLAN_MAX_BUCKETS)
		return fail(err, errlen, "too many groups (%zu) or buckets (%zu)", in->n_groups,
			    in->n_buckets);
	p = plan_alloc((uint32_t)in->n_groups, (uint32_t)in->n_buckets);
	if (!p)
		return -ENOMEM;
	p->optimizer = (enum zc_optimizer)in->optimizer;
	p->shard_mode = (enum zc_shard_mode)in->shard_mode;
	p->step_mode = (enum zc_step_mode)in->step_mode;
	p->max_grad_norm = in->max_grad_norm;
	for (size_t g = 0; g < in->n_groups; g++)
		plan_group_from_pb(in->groups[g], &p->groups[g]);
	for (size_t b = 0; b < in->n_buckets; b++) {
		const Zerod__V1__Bucket *src = in->buckets[b];
		struct plan_bucket *dst = &p->buckets[b];

		if (src->n_segments > PLAN_MAX_SEGMENTS) {
			r = fail(err, errlen, "buckets[%zu]: too many segments", b);
			goto out;
		}
		dst->numel = src->numel;
		dst->dtype = (enum zc_dtype)src->dtype;
		dst->nsegments = (uint32_t)src->n_segments;
		dst->segments =
			calloc(src->n_segments ? src->n_segments : 1, sizeof(*dst->segments));
		if (!dst->segments) {
			r = -ENOMEM;
			goto out;
		}
		for (size_t s = 0; s < src->n_segments; s++)
			dst->segments[s] = (struct zc_segment){
				.size = sizeof(struct zc_segment),
				.offset = src->segments[s]->offset,
				.numel = src->segments[s]->numel,
				.group = src->segments[s]->group,
				.param_id = src->segments[s]->has_param_id
						    ? src->segments[s]->param_id
						    : 0,
			};
	}
	r = plan_finish(p, err, errlen);
	if (r < 0)
		goto out;
	*ret = p;
	return 0;
out:
	plan_free(p);
	return r;
}

void plan_pb_free(Zerod__V1__Plan *pb)
{
	if (!pb)
		return;
	if (pb->groups)
		free(pb->groups[0]);
	free(pb->groups);
	if (pb->buckets) {
		for (size_t b = 0; b < pb->n_buckets; b++) {
			if (pb->buckets[b] && pb->buckets[b]->segments)
				free(pb->buckets[b]->segments[0]);
			if (pb->buckets[b])
				free(pb->buckets[b]->segments);
		}
		free(pb->buckets[0]);
	}
	free(pb->buckets);
	pb->groups = NULL;
	pb->buckets = NULL;
}

int plan_to_pb(const struct plan *p, Zerod__V1__Plan *out)
{
	Zerod__V1__ParamGroup *groups;
	Zerod__V1__Bucket *buckets;

	zerod__v1__plan__init(out);
	out->optimizer = (Zerod__V1__Optimizer)p->optimizer;
	out->shard_mode = (Zerod__V1__ShardMode)p->shard_mode;
	out->step_mode = (Zerod__V1__StepMode)p->step_mode;
	out->has_max_grad_norm = p->max_grad_norm != 0;
	out->max_grad_norm = p->max_grad_norm;
	out->groups = calloc(p->ngroups, sizeof(*out->groups));
	groups = calloc(p->ngroups, sizeof(*groups));
	out->buckets = calloc(p->nbuckets, sizeof(*out->buckets));
	buckets = calloc(p->nbuckets, sizeof(*buckets));
	if (!out->groups || !groups || !out->buckets || !buckets) {
		free(groups);
		free(buckets);
		plan_pb_free(out);
		return -ENOMEM;
	}
	out->n_groups = p->ngroups;
	for (uint32_t g = 0; g < p->ngroups; g++) {
		plan_group_to_pb(&p->groups[g], &groups[g]);
		out->groups[g] = &groups[g];
	}
	out->n_buckets = p->nbuckets;
	for (uint32_t b = 0; b < p->nbuckets; b++) {
		const struct plan_bucket *bk = &p->buckets[b];
		Zerod__V1__Segment *segs;

		zerod__v1__bucket__init(&buckets[b]);
		out->buckets[b] = &buckets[b];
		buckets[b].numel = bk->numel;
		buckets[b].has_dtype = bk->dtype != ZC_DTYPE_F32;
		buckets[b].dtype = (uint32_t)bk->dtype;
		buckets[b].segments = calloc(bk->nsegments, sizeof(*buckets[b].segments));
		segs = calloc(bk->nsegments, sizeof(*segs));
		if (!buckets[b].segments || !segs) {
			free(segs);
			plan_pb_free(out);
			return -ENOMEM;
		}
		buckets[b].n_segments = bk->nsegments;
		for (uint32_t s = 0; s < bk->nsegments; s++) {
			zerod__v1__segment__init(&segs[s]);
			segs[s].offset = bk->segments[s].offset;
			segs[s].numel = bk->segments[s].numel;
			segs[s].group = bk->segments[s].group;
			segs[s].has_param_id = bk->segments[s].param_id != 0;
			segs[s].param_id = bk->segments[s].param_id;
			buckets[b].segments[s] = &segs[s];
		}
	}
	return 0;
}

#define DIFF(cond, ...)                                                                            \
	do {                                                                                       \
		if (cond) {                                                                        \
			snprintf(field, len, __VA_ARGS__);                                         \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

static int group_diff(uint32_t g, const struct zc_param_group *a, const struct zc_param_group *b,
		      char *field, size_t len)
{
#define DIFF_D(name) DIFF(a->name != b->name, "groups[%u]." #name ": %g vs %g", g, a->name, b->name)
#define DIFF_B(name) DIFF(a->name != b->name, "groups[%u]." #name ": %d vs %d", g, a->name, b->name)
	DIFF_D(lr);
	DIFF_D(momentum);
	DIFF_D(dampening);
	DIFF_D(weight_decay);
	DIFF_D(beta1);
	DIFF_D(beta2);
	DIFF_D(eps);
	DIFF_B(nesterov);
	DIFF_B(amsgrad);
	DIFF_B(maximize);
	DIFF_D(max_grad_norm);
#undef DIFF_D
#undef DIFF_B
	return 0;
}

bool plan_group_equal(const struct zc_param_group *a, const struct zc_param_group *b)
{
	char field[160];

	return group_diff(0, a, b, field, sizeof(field)) == 0;
}

int plan_diff(const struct plan *a, const struct plan *b, char *field, size_t len)
{
	DIFF(a->optimizer != b->optimizer, "optimizer: %s vs %s", plan_optimizer_name(a->optimizer),
	     plan_optimizer_name(b->optimizer));
	DIFF(a->shard_mode != b->shard_mode, "shard_mode: %s vs %s", plan_shard_name(a->shard_mode),
	     plan_shard_name(b->shard_mode));
	DIFF(a->step_mode != b->step_mode, "step_mode: %s vs %s", plan_step_name(a->step_mode),
	     plan_step_name(b->step_mode));
	DIFF(a->max_grad_norm != b->max_grad_norm, "max_grad_norm: %g vs %g", a->max_grad_norm,
	     b->max_grad_norm);
	DIFF(a->ngroups != b->ngroups, "ngroups: %u vs %u", a->ngroups, b->ngroups);
	for (uint32_t g = 0; g < a->ngroups; g++)
		if (group_diff(g, &a->groups[g], &b->groups[g], field, len))
			return 1;
	DIFF(a->nbuckets != b->nbuckets, "nbuckets: %u vs %u", a->nbuckets, b->nbuckets);
	for (uint32_t k = 0; k < a->nbuckets; k++) {
		const struct plan_bucket *x = &a->buckets[k], *y = &b->buckets[k];
		DIFF(x->numel != y->numel, "buckets[%u].numel: %" PRIu64 " vs %" PRIu64, k,
		     x->numel, y->numel);
		DIFF(x->nsegments != y->nsegments, "buckets[%u].nsegments: %u vs %u", k,
		     x->nsegments, y->nsegments);
		DIFF(x->dtype != y->dtype, "buckets[%u].dtype: %s vs %s", k,
		     plan_dtype_name(x->dtype), plan_dtype_name(y->dtype));
		for (uint32_t s = 0; s < x->nsegments; s++) {
			const struct zc_segment *u = &x->segments[s], *v = &y->segments[s];
			DIFF(u->numel != v->numel,
			     "buckets[%u].segments[%u].numel: %" PRIu64 " vs %" PRIu64, k, s,
			     u->numel, v->numel);
			DIFF(u->group != v->group, "buckets[%u].segments[%u].group: %u vs %u", k, s,
			     u->group, v->group);
			DIFF(u->param_id != v->param_id,
			     "buckets[%u].segments[%u].param_id: %" PRIu64 " vs %" PRIu64, k, s,
			     u->param_id, v->param_id);
		}
	}
	return 0;
}

unsigned plan_state_arrays(enum zc_optimizer opt, const struct zc_param_group *groups,
			   uint32_t ngroups)
{
	unsigned need = opt == ZC_OPT_SGD ? 0 : PLAN_STATE_M | PLAN_STATE_V;

	for (uint32_t i = 0; i < ngroups; i++) {
		if (opt == ZC_OPT_SGD && groups[i].momentum != 0)
			need |= PLAN_STATE_M;
		if (opt != ZC_OPT_SGD && groups[i].amsgrad)
			need |= PLAN_STATE_VMAX;
	}
	return need;
}

static int state_check(const struct plan *p, uint32_t bucket, uint32_t segment, uint32_t present,
		       double step, char *err, size_t errlen)
{
	const uint32_t adam = ZC_STATE_STEP | ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ;
	const struct zc_param_group *g;
	uint32_t b = bucket, s = segment;

	if (bucket >= p->nbuckets)
		return fail(err, errlen, "bucket %u: the plan has %u buckets", bucket, p->nbuckets);
	if (segment >= p->buckets[bucket].nsegments)
		return fail(err, errlen, "buckets[%u].segments[%u]: the bucket has %u segments", b,
			    s, p->buckets[bucket].nsegments);
	g = &p->groups[p->buckets[bucket].segments[segment].group];
	if (present & ~PLAN_STATE_ALL)
		return fail(err, errlen, "buckets[%u].segments[%u].present: unknown bits 0x%x", b,
			    s, present & ~PLAN_STATE_ALL);
	if ((present & ZC_STATE_MASTER) && p->buckets[bucket].dtype == ZC_DTYPE_F32)
		return fail(err, errlen,
			    "buckets[%u].segments[%u].master: fp32 parameters have no master copy",
			    b, s);
	if (p->optimizer == ZC_OPT_SGD) {
		if (present & ZC_STATE_STEP)
			return fail(err, errlen,
				    "buckets[%u].segments[%u].step: torch.optim.SGD keeps no step",
				    b, s);
		if (present & (adam | ZC_STATE_MAX_EXP_AVG_SQ))
			return fail(err, errlen,
				    "buckets[%u].segments[%u].%s: not a state of torch.optim.SGD",
				    b, s,
				    present & ZC_STATE_EXP_AVG      ? "exp_avg"
				    : present & ZC_STATE_EXP_AVG_SQ ? "exp_avg_sq"
								    : "max_exp_avg_sq");
		if ((present & ZC_STATE_MOMENTUM_BUFFER) && g->momentum == 0)
			return fail(err, errlen,
				    "buckets[%u].segments[%u].momentum_buffer: its group has "
				    "momentum 0, torch keeps none",
				    b, s);
		return 0;
	}
	if (present & ZC_STATE_MOMENTUM_BUFFER)
		return fail(err, errlen,
			    "buckets[%u].segments[%u].momentum_buffer: not a state of %s", b, s,
			    plan_optimizer_name(p->optimizer));
	if ((present & ZC_STATE_MAX_EXP_AVG_SQ) && !g->amsgrad)
		return fail(err, errlen,
			    "buckets[%u].segments[%u].max_exp_avg_sq: its group has no amsgrad", b,
			    s);
	if ((present & ~ZC_STATE_MASTER) == 0)
		return 0; /* before the first step (a master exists from the start) */
	if ((present & adam) != adam)
		return fail(err, errlen,
			    "buckets[%u].segments[%u].%s: missing (step, exp_avg and exp_avg_sq "
			    "go together)",
			    b, s,
			    !(present & ZC_STATE_STEP)      ? "step"
			    : !(present & ZC_STATE_EXP_AVG) ? "exp_avg"
							    : "exp_avg_sq");
	if (g->amsgrad && !(present & ZC_STATE_MAX_EXP_AVG_SQ))
		return fail(
			err, errlen,
			"buckets[%u].segments[%u].max_exp_avg_sq: missing (the group has amsgrad)",
			b, s);
	if (!(step >= 0 && step <= PLAN_STATE_MAX_STEP && step == (double)(uint64_t)step))
		return fail(err, errlen,
			    "buckets[%u].segments[%u].step: %g is not a whole number in 0..%u", b,
			    s, step, PLAN_STATE_MAX_STEP);
	return 0;
}

int plan_state_check(const struct plan *p, uint32_t bucket, uint32_t segment, uint32_t present,
		     double step, char *err, size_t errlen)
{
	return state_check(p, bucket, segment, present, step, err, errlen) < 0 ? ZC_ESTATEINVAL : 0;
}

int plan_replan_match(const struct plan *old, const struct plan *p, uint32_t *map, char *err,
		      size_t errlen)
{
	uint32_t nold = 0, nnew = 0, k = 0;
	bool ids = true;
	struct id_at *byid = NULL;
	const struct zc_segment **oflat = NULL;
	enum zc_dtype *odt = NULL;
	char field[192];
	int r = 0;

#define REPLAN(...) (snprintf(err, errlen, __VA_ARGS__), ZC_EREPLAN)
	if (old->optimizer != p->optimizer)
		return REPLAN("optimizer: %s, the registered plan's is %s",
			      plan_optimizer_name(p->optimizer),
			      plan_optimizer_name(old->optimizer));
	if (old->ngroups != p->ngroups)
		return REPLAN("ngroups: %u, the registered plan has %u", p->ngroups, old->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++)
		if (group_diff(g, &old->groups[g], &p->groups[g], field, sizeof(field)))
			return REPLAN("%s (the registered plan's vs the new one's)", field);
	for (uint32_t b = 0; b < old->nbuckets; b++)
		for (uint32_t s = 0; s < old->buckets[b].nsegments; s++, nold++)
			ids = ids && old->buckets[b].segments[s].param_id != 0;
	for (uint32_t b = 0; b < p->nbuckets; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments; s++, nnew++)
			ids = ids && p->buckets[b].segments[s].param_id != 0;
	if (nold != nnew)
		return REPLAN("%u segments, the registered plan has %u", nnew, nold);
	oflat = calloc(nold ? nold : 1, sizeof(*oflat));
	odt = calloc(nold ? nold : 1, sizeof(*odt));
	if (!oflat || !odt) {
		free(oflat);
		free(odt);
		return -ENOMEM;
	}
	for (uint32_t b = 0, i = 0; b < old->nbuckets; b++)
		for (uint32_t s = 0; s < old->buckets[b].nsegments; s++, i++) {
			oflat[i] = &old->buckets[b].segments[s];
			odt[i] = old->buckets[b].dtype;
		}
	if (ids) {
		byid = calloc(nold, sizeof(*byid));
		if (!byid) {
			free(oflat);
			free(odt);
			return -ENOMEM;
		}
		for (uint32_t b = 0, i = 0; b < old->nbuckets; b++)
			for (uint32_t s = 0; s < old->buckets[b].nsegments; s++, i++)
				byid[i] = (struct id_at){.id = old->buckets[b].segments[s].param_id,
							 .bucket = i};
		qsort(byid, nold, sizeof(*byid), id_cmp);
	}
	for (uint32_t b = 0; b < p->nbuckets && r == 0; b++)
		for (uint32_t s = 0; s < p->buckets[b].nsegments && r == 0; s++, k++) {
			const struct zc_segment *n = &p->buckets[b].segments[s], *o;
			uint32_t at = k;

			if (ids) {
				struct id_at key = {.id = n->param_id}, *hit;
				uint32_t lo = 0, hi = nold;
				while (lo < hi) { /* the first of that id */
					uint32_t mid = lo + (hi - lo) / 2;
					if (byid[mid].id < key.id)
						lo = mid + 1;
					else
						hi = mid;
				}
				hit = lo < nold && byid[lo].id == key.id ? &byid[lo] : NULL;
				if (!hit) {
					r = REPLAN("buckets[%u].segments[%u].param_id: %" PRIu64
						   " is not in the registered plan",
						   b, s, n->param_id);
					break;
				}
				at = hit->bucket; /* its flat index there */
			}
			o = oflat[at];
			if (o->numel != n->numel || o->group != n->group)
				r = REPLAN("buckets[%u].segments[%u]%s: numel %" PRIu64
					   ", group %u; the registered plan's: numel %" PRIu64
					   ", group %u",
					   b, s, ids ? " (by param_id)" : " (by position)",
					   n->numel, n->group, o->numel, o->group);
			else if (odt[at] != p->buckets[b].dtype)
				/* a parameter keeps its element type */
				r = REPLAN("buckets[%u].segments[%u]%s: a %s parameter; the "
					   "registered plan's is %s",
					   b, s, ids ? " (by param_id)" : " (by position)",
					   plan_dtype_name(p->buckets[b].dtype),
					   plan_dtype_name(odt[at]));
			if (map)
				map[k] = at;
		}
#undef REPLAN
	free(byid);
	free(oflat);
	free(odt);
	return r;
}
