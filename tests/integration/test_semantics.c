/*
 * test_semantics.c — torch's semantics through a real zerod and real
 * trainer processes (issue 6 §4-5), against the reference of semtrain.c
 * written from torch's formulas: segments no rank (or some ranks) has a
 * gradient for, in both shard and step modes, SGD and Adam (a skipped
 * segment keeps its moments and its step count); the last of two
 * zc_set_hyper wins; clip_grad_norm_ globally and per group; a non-finite
 * gradient under a grad scale skips the step on every rank; and the
 * refusals: bad segment masks (client and daemon side), clipping or a grad
 * scale in interleaved mode, ranks that disagree on the scale. After each
 * refusal the job, or another job beside it, trains on.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "raw.h"
#include "semtrain.h"
#include "testlib.h"

static struct zd daemon_;

static int rank_main(void *arg, int idx)
{
	return sem_rank(arg, (uint32_t)idx);
}

/* Run every rank of s; each must end as s expects. */
static void run(struct sem_spec *s)
{
	pid_t pids[SEM_MAXW];

	REQUIRE(zd_alive(&daemon_), "zerod is not running");
	s->socket = daemon_.sock;
	for (uint32_t r = 0; r < s->world; r++)
		pids[r] = spawn(rank_main, s, (int)r);
	for (uint32_t r = 0; r < s->world; r++) {
		int st = wait_child(pids[r], 60000);
		CHECK(st == 0, "%s rank %u exited with %d", s->job, r, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

static void masked(const char *job, enum zc_optimizer opt, enum zc_shard_mode shard,
		   enum zc_step_mode step)
{
	struct sem_spec s;

	sem_spec_init(&s, job, 2);
	s.opt = opt;
	s.shard = shard;
	s.step = step;
	s.masks = true;
	s.iters = 7;
	if (opt == ZC_OPT_SGD) {
		s.hp[0].momentum = 0.9;
		s.hp[0].weight_decay = 0.01;
		s.hp[1].momentum = 0.5;
		s.hp[1].nesterov = true;
	} else {
		s.hp[0].lr = s.hp[1].lr = 0.01;
		s.hp[0].weight_decay = 0.1;
		s.hp[1].amsgrad = opt == ZC_OPT_ADAM;
	}
	run(&s);
}

static void t_unused_sgd_bucket_interleaved(void)
{
	masked("unused-sgd-bi", ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}
static void t_unused_sgd_slice_at_end(void)
{
	masked("unused-sgd-sa", ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}
static void t_unused_adam_bucket_interleaved(void)
{
	masked("unused-adam-bi", ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}
static void t_unused_adam_bucket_at_end(void)
{
	masked("unused-adam-ba", ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
}
static void t_unused_adam_slice_interleaved(void)
{
	masked("unused-adam-si", ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
}
static void t_unused_adamw_slice_at_end(void)
{
	masked("unused-adamw-sa", ZC_OPT_ADAMW, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}

static void last_hyper(const char *job, enum zc_shard_mode shard)
{
	struct sem_spec s;

	sem_spec_init(&s, job, 2);
	s.opt = ZC_OPT_ADAM;
	s.shard = shard;
	s.step = ZC_STEP_INTERLEAVED;
	s.hyper_iter = 3;
	s.hyper_first = s.hp[0];
	s.hyper_first.lr = 0.5;
	s.hyper_last = s.hp[0];
	s.hyper_last.lr = 0.001;
	s.hyper_last.weight_decay = 0.2;
	run(&s);
}

static void t_last_set_hyper_wins_bucket(void)
{
	last_hyper("hyper-b", ZC_SHARD_BUCKET);
}
static void t_last_set_hyper_wins_slice(void)
{
	last_hyper("hyper-s", ZC_SHARD_SLICE);
}

/* The gradients' total norm is about 8: a max of 5 clips every iteration,
 * group 0's 3 clips it and group 1's 100 never does. */
static void clip(const char *job, enum zc_optimizer opt, enum zc_shard_mode shard, bool global,
		 bool masks)
{
	struct sem_spec s;

	sem_spec_init(&s, job, 2);
	s.opt = opt;
	s.shard = shard;
	s.masks = masks;
	s.hp[0].momentum = s.hp[1].momentum = opt == ZC_OPT_SGD ? 0.9 : 0;
	if (global) {
		s.max_grad_norm = 5.0;
	} else {
		s.hp[0].max_grad_norm = 3.0;
		s.hp[1].max_grad_norm = 100.0;
	}
	s.tolerance = 1e-6;
	run(&s);
}

static void t_clip_global_bucket(void)
{
	clip("clip-gb", ZC_OPT_ADAM, ZC_SHARD_BUCKET, true, false);
}
static void t_clip_global_slice_masked(void)
{
	clip("clip-gs", ZC_OPT_ADAMW, ZC_SHARD_SLICE, true, true);
}
static void t_clip_group_bucket_masked(void)
{
	clip("clip-pb", ZC_OPT_SGD, ZC_SHARD_BUCKET, false, true);
}
static void t_clip_group_slice(void)
{
	clip("clip-ps", ZC_OPT_SGD, ZC_SHARD_SLICE, false, false);
}

/* Rank 1 writes +inf at iteration 3: no rank steps it; Adam's step counts
 * stay, so every later iteration matches the reference only if they did. */
static void found_inf(const char *job, enum zc_shard_mode shard, bool with_clip)
{
	struct sem_spec s;

	sem_spec_init(&s, job, 2);
	s.opt = ZC_OPT_ADAM;
	s.shard = shard;
	s.scale = true;
	s.inf_rank = 1;
	s.inf_iter = 3;
	s.max_grad_norm = with_clip ? 5.0 : 0;
	s.tolerance = with_clip ? 1e-6 : 0;
	run(&s);
}

static void t_found_inf_skips_bucket(void)
{
	found_inf("inf-b", ZC_SHARD_BUCKET, false);
}
static void t_found_inf_skips_slice_clipped(void)
{
	found_inf("inf-s", ZC_SHARD_SLICE, true);
}

/* A rank first hands over masks the library refuses; the job trains on,
 * and so does another one beside it. */
static void t_bad_masks_refused_by_client(void)
{
	struct sem_spec s, t;
	pid_t pids[4];

	sem_spec_init(&s, "badmask", 2);
	s.masks = true;
	s.bad_masks_rank = 1;
	s.socket = daemon_.sock;
	sem_spec_init(&t, "badmask-beside", 2);
	t.socket = daemon_.sock;
	t.opt = ZC_OPT_ADAM;
	for (uint32_t r = 0; r < 2; r++) {
		pids[r] = spawn(rank_main, &s, (int)r);
		pids[2 + r] = spawn(rank_main, &t, (int)r);
	}
	for (int i = 0; i < 4; i++) {
		int st = wait_child(pids[i], 60000);
		CHECK(st == 0, "%s rank %d exited with %d", i < 2 ? s.job : t.job, i % 2, st);
	}
}

/* What a client without the library's checks sends: the daemon refuses. */
static int raw_main(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketReady br = ZEROD__V1__BUCKET_READY__INIT;
	uint64_t w[2] = {2, 0};
	struct raw_reg g;
	struct raw r;

	(void)arg, (void)idx;
	child_bad = 0;
	if (raw_reg_init(&g, "rawmask") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "rawmask");
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");
	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_READY;
	env.bucket_ready = &br;
	br.iteration = 0;
	br.bucket = 0;
	br.unused = w;
	br.n_unused = 1; /* bucket 0 has one segment: bit 1 is past it */
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_ESEGMASK, "bits at or past 1", "bit 1 of 1 segment");
	br.n_unused = 2;
	w[0] = 1;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_ESEGMASK, "takes 1 words, got 2", "two words for one segment");
	/* the bucket was not taken: a right mask goes through */
	br.n_unused = 1;
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 0, its segment unused");
	raw_goodbye(&r);
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

static void t_bad_masks_refused_by_daemon(void)
{
	struct sem_spec t;
	pid_t raw, pids[2];
	int st;

	sem_spec_init(&t, "rawmask-beside", 2);
	t.socket = daemon_.sock;
	t.masks = true;
	raw = spawn(raw_main, NULL, 0);
	for (uint32_t r = 0; r < 2; r++)
		pids[r] = spawn(rank_main, &t, (int)r);
	st = wait_child(raw, 30000);
	CHECK(st == 0, "the raw client exited with %d", st);
	for (uint32_t r = 0; r < 2; r++) {
		st = wait_child(pids[r], 60000);
		CHECK(st == 0, "%s rank %u exited with %d", t.job, r, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* Rank 1 unscales by 1/512, rank 0 by 1/1024: the job fails, named. */
static void t_scale_disagreement_fails_the_job(void)
{
	struct sem_spec s, t;
	pid_t pids[4];

	sem_spec_init(&s, "scale-differs", 2);
	s.socket = daemon_.sock;
	s.scale = true;
	s.scale_odd_rank = 1;
	s.expect_code = ZC_EHYPER;
	s.expect_msg = "disagree on the grad scale of iteration 0: rank 0 inv_scale 0.000976562, "
		       "rank 1 inv_scale 0.00195312";
	sem_spec_init(&t, "scale-beside", 2);
	t.socket = daemon_.sock;
	t.scale = true;
	for (uint32_t r = 0; r < 2; r++) {
		pids[r] = spawn(rank_main, &s, (int)r);
		pids[2 + r] = spawn(rank_main, &t, (int)r);
	}
	for (int i = 0; i < 4; i++) {
		int st = wait_child(pids[i], 60000);
		CHECK(st == 0, "%s rank %d exited with %d", i < 2 ? s.job : t.job, i % 2, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* Clipping and grad scales need at_end; both clips at once are refused. */
static void t_interleaved_and_double_clip_refused(void)
{
	struct zc_param_group g = ZC_PARAM_GROUP_INIT;
	struct zc_segment sg = ZC_SEGMENT_INIT;
	struct zc_bucket b = ZC_BUCKET_INIT;
	struct zc_plan p = ZC_PLAN_INIT;
	struct zc_config cfg = test_config(&daemon_, "clip-refused", 0, 1);
	zc_future *f = NULL;
	zc_client *c;
	int r;

	sg.numel = b.numel = 16;
	b.nsegments = 1;
	b.segments = &sg;
	p.ngroups = p.nbuckets = 1;
	p.groups = &g;
	p.buckets = &b;
	REQUIRE(zc_connect(&cfg, &c) == 0, "connect: %s", zc_error_message());
	p.max_grad_norm = 1.0;
	r = zc_alloc_buffers(c, &p);
	CHECK(r == ZC_EPLANINVAL && strstr(zc_error_message(), "max_grad_norm needs step_mode "
							       "at_end"),
	      "global clip, interleaved: %s: %s", zc_strerror_name(r), zc_error_message());
	p.max_grad_norm = 0;
	g.max_grad_norm = 1.0;
	r = zc_alloc_buffers(c, &p);
	CHECK(r == ZC_EPLANINVAL && strstr(zc_error_message(), "groups[0]: max_grad_norm needs"),
	      "group clip, interleaved: %s: %s", zc_strerror_name(r), zc_error_message());
	p.step_mode = ZC_STEP_AT_END;
	p.max_grad_norm = 2.0;
	r = zc_alloc_buffers(c, &p);
	CHECK(r == ZC_EPLANINVAL && strstr(zc_error_message(), "not both"), "both clips: %s: %s",
	      zc_strerror_name(r), zc_error_message());
	g.max_grad_norm = -1;
	p.max_grad_norm = 0;
	r = zc_alloc_buffers(c, &p);
	CHECK(r == ZC_EPLANINVAL && strstr(zc_error_message(), "finite and >= 0"),
	      "negative clip: %s: %s", zc_strerror_name(r), zc_error_message());

	/* an interleaved job: no grad scale, no clip by set_hyper */
	g.max_grad_norm = 0;
	p.step_mode = ZC_STEP_INTERLEAVED;
	REQUIRE(zc_alloc_buffers(c, &p) == 0, "alloc: %s", zc_error_message());
	REQUIRE(zc_register_plan(c) == 0, "register: %s", zc_error_message());
	r = zc_set_grad_scale(c, 0.5);
	CHECK(r == ZC_ESTATE && strstr(zc_error_message(), "at_end"),
	      "grad scale, interleaved: %s: %s", zc_strerror_name(r), zc_error_message());
	g.max_grad_norm = 1.0;
	r = zc_set_hyper(c, 0, &g);
	CHECK(r == ZC_EHYPER && strstr(zc_error_message(), "needs step_mode at_end"),
	      "set_hyper clip, interleaved: %s: %s", zc_strerror_name(r), zc_error_message());

	/* it trains on; step_info of a bucket future is refused, of a step
	 * future with nothing measured its norm is NaN */
	REQUIRE(zc_bucket_ready(c, 0, &f) == 0, "bucket 0: %s", zc_error_message());
	CHECK(zc_future_wait(f, test_timeout(10000)) == 1, "bucket 0 done");
	struct zc_step_info info = ZC_STEP_INFO_INIT;
	r = zc_step_info(f, &info);
	CHECK(r == ZC_ESTATE, "step_info of a bucket future: %s", zc_strerror_name(r));
	zc_future_free(f);
	REQUIRE(zc_step_future(c, 0, &f) == 0, "step future");
	CHECK(zc_future_wait(f, test_timeout(10000)) == 1, "step 0 done");
	r = zc_step_info(f, &info);
	CHECK(r == 0 && info.found_inf == 0 && isnan(info.grad_norm),
	      "step_info, nothing measured: %d found_inf %u norm %g", r, info.found_inf,
	      info.grad_norm);
	zc_future_free(f);
	zc_close(c);
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);
	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

#define C(name)                                                                                    \
	{                                                                                          \
#name, t_##name, 90000                                                             \
	}
static const struct test_case cases[] = {
	C(unused_sgd_bucket_interleaved),
	C(unused_sgd_slice_at_end),
	C(unused_adam_bucket_interleaved),
	C(unused_adam_bucket_at_end),
	C(unused_adam_slice_interleaved),
	C(unused_adamw_slice_at_end),
	C(last_set_hyper_wins_bucket),
	C(last_set_hyper_wins_slice),
	C(clip_global_bucket),
	C(clip_global_slice_masked),
	C(clip_group_bucket_masked),
	C(clip_group_slice),
	C(found_inf_skips_bucket),
	C(found_inf_skips_slice_clipped),
	C(bad_masks_refused_by_client),
	C(bad_masks_refused_by_daemon),
	C(scale_disagreement_fails_the_job),
	C(interleaved_and_double_clip_refused),
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
