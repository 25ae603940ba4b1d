/*
 * test_state.c — optimizer state export/import (zc_get_state, zc_set_state)
 * and re-planning (zc_alloc_buffers + zc_register_plan again) against a real
 * zerod and real trainer processes.
 *
 * The job, its layouts and the single-process reference are statefix.h's;
 * the daemon's parameters and state must equal the reference bit for bit, in
 * any layout, shard mode and world size, across exports, imports and
 * re-plans.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bufwire.h"
#include "harness.h"
#include "raw.h"
#include "refoptim.h"
#include "statefix.h"
#include "testlib.h"
#include "trainer.h"
#include "wire.h"

static struct zd daemon_;

/* ------------------------------------------------------ the layouts --- */

/* statefix.h's job in several layouts */
static const struct layout layouts[] = {
	{3, {{0, 1, -1}, {2, -1}, {3, 4, 5, -1}}},
	{4, {{5, 3, -1}, {4, 2, -1}, {1, -1}, {0, -1}}},
	{1, {{2, 0, 4, 1, 5, 3, -1}}},
	{3, {{0, -1}, {1, 2, 3, -1}, {4, 5, -1}}}, /* layout 0's order, other buckets */
	/* for the bf16/fp16 cases (sf_lowp): each bucket of one dtype */
	{3, {{0, 3, -1}, {1, 4, -1}, {2, 5, -1}}},
	{4, {{5, 2, -1}, {1, -1}, {4, -1}, {3, 0, -1}}},
	{4, {{0, 3, -1}, {1, -1}, {4, -1}, {2, 5, -1}}}, /* layout 4's order */
};

/* ------------------------------------------------------------ a rank --- */

/* What one job does; every rank runs the same script. */
struct script {
	char job[64];
	uint32_t world;
	enum zc_optimizer opt;
	enum zc_shard_mode shard;
	enum zc_step_mode step;
	int layout;
	bool ids;
	uint64_t seed;
	int start, iters; /* iterations [start, start + iters) */
	bool load;        /* start from *in (parameters and state) */
	int replan_at;    /* before this iteration, re-plan to replan_layout (-1: never) */
	int replan_layout;
	bool roundtrip;    /* at the end, import what was exported and export again */
	struct snap *in;   /* load: what to start from */
	struct snap *out;  /* rank 0 writes what it exported at the end (optional) */
	struct snap *want; /* what the export must equal at the end (optional) */
	/* over several zerods (nnodes > 1): rank r on node node_of[r] */
	uint32_t nnodes;
	uint32_t node_of[8];
	char socks[3][192];
	char rdzv[32];
	int replan_code; /* the re-plan's expected error (0: it succeeds) */
	bool check_maps; /* each rank checks it maps nothing from /dev/shm */
	int replan_layout_node1; /* > 0: the re-plan's layout on node 1's ranks */
	bool replan_ends;        /* the expected re-plan error ends the job */
};

/* Rank `rank`'s config: the case's zerod, or its node's. */
static struct zc_config script_config(const struct script *sc, uint32_t rank)
{
	struct zc_config cfg = test_config(&daemon_, sc->job, rank, sc->world);

	cfg.register_timeout_ms = test_timeout(20000);
	if (sc->nnodes < 2)
		return cfg;
	cfg.socket = sc->socks[sc->node_of[rank]];
	sf_config_nodes(&cfg, rank, sc->world, sc->node_of, sc->nnodes, sc->rdzv, "state secret");
	return cfg;
}

static int one_iteration(zc_client *c, const struct script *sc, const struct tplan *tp,
			 uint32_t rank, int it)
{
	zc_future *step = NULL;
	uint64_t t = zc_iteration(c); /* the job's count: `it` is the training's */
	int r;

	if ((r = sf_fill_grads(c, tp, sc->seed, rank, it)) < 0)
		return r;
	for (uint32_t b = 0; b < tp->plan.nbuckets; b++)
		if ((r = zc_bucket_ready(c, b, NULL)) < 0)
			return r;
	r = zc_step_future(c, t, &step);
	if (r >= 0)
		r = zc_future_wait(step, test_timeout(20000));
	if (r == 0)
		r = ZC_ETIMEDOUT;
	zc_future_free(step);
	return r < 0 ? r : 0;
}

/* Lines of /proc/PID/maps holding needle. */
static int maps_lines(pid_t pid, const char *needle)
{
	char path[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return n;
}

static int rank_main(void *arg, int idx)
{
	const struct script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct zc_config cfg = script_config(sc, rank);
	struct tplan *tp = calloc(1, sizeof(*tp)), *tp2 = calloc(1, sizeof(*tp2));
	struct snap *got = calloc(1, sizeof(*got));
	zc_client *c = NULL;
	const char *step = "connect";
	int r;

	make_plan(tp, &layouts[sc->layout], sc->opt, sc->shard, sc->step, sc->ids);
	r = zc_connect(&cfg, &c);
	if (r >= 0) {
		step = "alloc_buffers";
		r = zc_alloc_buffers(c, &tp->plan);
	}
	if (r >= 0)
		r = sf_begin(c, tp, sc->opt, sc->load ? sc->in : NULL, sc->seed, &step);
	for (int it = sc->start; r >= 0 && it < sc->start + sc->iters; it++) {
		step = "set_hyper";
		if ((r = sf_hyper_at(c, tp, it)) < 0)
			break;
		if (it == sc->replan_at) {
			int to = sc->replan_layout_node1 > 0 && sc->nnodes > 1 &&
						 sc->node_of[rank] == 1
					 ? sc->replan_layout_node1
					 : sc->replan_layout;
			make_plan(tp2, &layouts[to], sc->opt, sc->shard, sc->step, sc->ids);
			step = "re-plan: alloc_buffers";
			r = zc_alloc_buffers(c, &tp2->plan);
			if (r >= 0) {
				step = "re-plan: register_plan";
				r = zc_register_plan(c);
			}
			if (sc->replan_code && r == sc->replan_code && sc->replan_ends) {
				printf("# rank %u: re-plan refused: %s\n", rank,
				       zc_error_message());
				zc_close(c);
				free(tp);
				free(tp2);
				free(got);
				return child_bad;
			} else if (sc->replan_code && r == sc->replan_code) {
				/* refused: the job goes on with the plan it had */
				printf("# rank %u: re-plan refused: %s\n", rank,
				       zc_error_message());
				r = 0;
			} else if (sc->replan_code) {
				EXPECT(0, "rank %u: the re-plan: %s, not %s", rank,
				       zc_strerror_name(r), zc_strerror_name(sc->replan_code));
				r = r < 0 ? r : ZC_EINTERNAL;
			} else if (r >= 0) {
				struct tplan *t = tp;
				tp = tp2, tp2 = t;
			}
			if (r < 0)
				break;
		}
		step = "iteration";
		r = one_iteration(c, sc, tp, rank, it);
	}
	if (r >= 0) {
		step = "get_state";
		r = export_snap(c, tp, sc->opt, got);
	}
	if (r >= 0 && sc->roundtrip) {
		struct snap *again = calloc(1, sizeof(*again));
		step = "round trip: set_state";
		r = sf_import(c, tp, sc->opt, got);
		if (r >= 0) {
			step = "round trip: get_state";
			r = export_snap(c, tp, sc->opt, again);
		}
		if (r >= 0)
			EXPECT(snap_compare("round trip", again, got, sc->opt) == 0,
			       "rank %u: the state imported and exported again differs", rank);
		free(again);
	}
	if (r >= 0 && sc->check_maps)
		EXPECT(maps_lines(getpid(), "/dev/shm/") == 0 &&
			       maps_lines(getpid(), "memfd:zerod-buffers") >= 1,
		       "rank %u maps from /dev/shm, or no memfd", rank);
	if (r < 0) {
		EXPECT(0, "%s rank %u: %s: %s: %s", sc->job, rank, step, zc_strerror_name(r),
		       zc_error_message());
	} else {
		if (sc->want)
			EXPECT(snap_compare(sc->job, got, sc->want, sc->opt) == 0,
			       "rank %u: differs from the reference", rank);
		if (sc->out && rank == 0)
			*sc->out = *got;
	}
	zc_close(c);
	free(tp);
	free(tp2);
	free(got);
	return child_bad;
}

static void run_script(struct script *sc)
{
	pid_t pids[8];

	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(rank_main, sc, (int)r);
	for (uint32_t r = 0; r < sc->world; r++) {
		int st = wait_child(pids[r], test_timeout(60000));
		CHECK(st == 0, "%s rank %u exited with %d", sc->job, r, st);
	}
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* ------------------------------------------------------------- cases --- */

static struct script *script_new(const char *job, uint32_t world, enum zc_optimizer opt,
				 enum zc_shard_mode shard, enum zc_step_mode step)
{
	struct script *sc = test_shared(sizeof(*sc));

	snprintf(sc->job, sizeof(sc->job), "%s", job);
	sc->world = world;
	sc->opt = opt;
	sc->shard = shard;
	sc->step = step;
	sc->seed = 7;
	sc->replan_at = -1;
	return sc;
}

/* Train 3 iterations: the export equals the reference bit for bit (torch's
 * names and presence), and importing it and exporting again changes nothing. */
static void roundtrip(enum zc_optimizer opt, enum zc_shard_mode shard)
{
	struct script *sc = script_new("roundtrip", 2, opt, shard, ZC_STEP_INTERLEAVED);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, sc->seed);
	ref_train(want, opt, sc->seed, 2, 0, 3);
	sc->iters = 3;
	sc->roundtrip = true;
	sc->want = want;
	run_script(sc);
}

static void t_roundtrip_sgd_bucket(void)
{
	roundtrip(ZC_OPT_SGD, ZC_SHARD_BUCKET);
}
static void t_roundtrip_sgd_slice(void)
{
	roundtrip(ZC_OPT_SGD, ZC_SHARD_SLICE);
}
static void t_roundtrip_adam_bucket(void)
{
	roundtrip(ZC_OPT_ADAM, ZC_SHARD_BUCKET);
}
static void t_roundtrip_adamw_slice(void)
{
	roundtrip(ZC_OPT_ADAMW, ZC_SHARD_SLICE);
}

/* Before the first step torch has no state at all: every segment reads
 * present 0 (and no tensor is touched). */
static void t_empty_before_first_step(void)
{
	struct script *sc = script_new("empty", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, sc->seed);
	sc->iters = 0;
	sc->want = want;
	run_script(sc);
}

/* torch's formats: SGD keeps only momentum_buffer, none for a group with
 * momentum 0 (and refuses one given there); Adam counts steps, amsgrad
 * groups have max_exp_avg_sq. Checked against the reference's presence in
 * the round trips; here, what a binding reads directly. */
static int formats_rank(void *arg, int idx)
{
	const struct script *sc = arg;
	struct zc_config cfg = test_config(&daemon_, sc->job, (uint32_t)idx, 1);
	struct tplan tp;
	zc_client *c = NULL;
	struct zc_segment_state segs[NP];
	float buf[5001];
	int r;

	make_plan(&tp, &layouts[0], sc->opt, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, false);
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &tp.plan)) < 0 ||
	    (r = zc_register_plan(c)) < 0) {
		EXPECT(0, "setup: %s: %s", zc_strerror_name(r), zc_error_message());
		zc_close(c);
		return 1;
	}
	for (int it = 0; it < 4 && r >= 0; it++)
		r = one_iteration(c, sc, &tp, 0, it);
	for (int k = 0; k < NP; k++) {
		segs[k] = (struct zc_segment_state)ZC_SEGMENT_STATE_INIT;
		segs[k].bucket = tp.bucket_of[k];
		segs[k].segment = tp.seg_of[k];
	}
	if (r >= 0)
		r = zc_get_state(c, segs, NP);
	EXPECT(r == 0, "get_state: %s: %s", zc_strerror_name(r), zc_error_message());
	for (int k = 0; k < NP && r == 0; k++) {
		uint32_t g = params[k].group;
		if (sc->opt == ZC_OPT_SGD) {
			EXPECT(segs[k].present == (g == 2 ? 0 : ZC_STATE_MOMENTUM_BUFFER),
			       "SGD param %d (group %u): present 0x%x", k, g, segs[k].present);
			EXPECT(segs[k].step == 0, "SGD keeps no step: %g", segs[k].step);
		} else {
			uint32_t want = ZC_STATE_STEP | ZC_STATE_EXP_AVG | ZC_STATE_EXP_AVG_SQ |
					(g == 1 ? ZC_STATE_MAX_EXP_AVG_SQ : 0);
			EXPECT(segs[k].present == want, "Adam param %d: present 0x%x, want 0x%x", k,
			       segs[k].present, want);
			EXPECT(segs[k].step == 4.0, "Adam param %d: step %g after 4 steps", k,
			       segs[k].step);
		}
	}
	if (sc->opt == ZC_OPT_SGD) {
		/* param 2 is in group 2, momentum 0: torch keeps no buffer there */
		struct zc_segment_state s = ZC_SEGMENT_STATE_INIT;
		s.bucket = tp.bucket_of[2];
		s.segment = tp.seg_of[2];
		s.present = ZC_STATE_MOMENTUM_BUFFER;
		s.momentum_buffer = buf;
		memset(buf, 0, sizeof(buf));
		r = zc_set_state(c, &s, 1);
		EXPECT(r == ZC_ESTATEINVAL && strstr(zc_error_message(), "momentum_buffer"),
		       "momentum_buffer for a group without momentum: %s: %s", zc_strerror_name(r),
		       zc_error_message());
	}
	zc_close(c);
	return child_bad;
}

static void t_formats_sgd(void)
{
	struct script *sc =
		script_new("formats-sgd", 1, ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	pid_t p = spawn(formats_rank, sc, 0);

	CHECK(wait_child(p, test_timeout(30000)) == 0, "see above");
}

static void t_formats_adam(void)
{
	struct script *sc =
		script_new("formats-adam", 1, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	pid_t p = spawn(formats_rank, sc, 0);

	CHECK(wait_child(p, test_timeout(30000)) == 0, "see above");
}

/* Export from a job of 2 ranks in bucket mode, import into one of 3 ranks in
 * slice mode (another layout too): its next steps equal the reference's. */
static void other_world(enum zc_optimizer opt)
{
	struct script *a = script_new("export-w2", 2, opt, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct script *b = script_new("import-w3", 3, opt, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *saved = test_shared(sizeof(*saved)), *want = test_shared(sizeof(*want));

	snap_init(want, a->seed);
	ref_train(want, opt, a->seed, 2, 0, 3);
	a->iters = 3;
	a->want = want;
	a->out = saved;
	run_script(a);
	REQUIRE(saved->valid && !test_failed_, "the export failed");
	ref_train(want, opt, a->seed, 3, 3, 5);
	b->layout = 1;
	b->load = true;
	b->in = saved;
	b->start = 3;
	b->iters = 2;
	b->want = want;
	run_script(b);
}

static void t_other_world_sgd(void)
{
	other_world(ZC_OPT_SGD);
}

static void t_other_world_adamw(void)
{
	other_world(ZC_OPT_ADAMW);
}

/* Train 5 iterations, re-plan to another layout, train 5 more: equal to the
 * reference, which is what a run on the second layout throughout computes
 * from the same state (the numbers do not depend on the layout), bit for
 * bit: parameters, moments and step counts moved without loss. */
static void replan(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step,
		   int from, int to, bool ids, uint32_t world)
{
	struct script *sc = script_new("replan", world, opt, shard, step);
	struct snap *want = test_shared(sizeof(*want));

	sf_hyper_iter = 3; /* the lr in force then goes on after the re-plan */
	snap_init(want, sc->seed);
	ref_train(want, opt, sc->seed, world, 0, 10);
	sc->layout = from;
	sc->ids = ids;
	sc->iters = 10;
	sc->replan_at = 5;
	sc->replan_layout = to;
	sc->roundtrip = true;
	sc->want = want;
	run_script(sc);
}

static void t_replan_sgd_bucket_ids(void)
{
	replan(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 0, 1, true, 2);
}
static void t_replan_sgd_slice_position(void)
{
	replan(ZC_OPT_SGD, ZC_SHARD_SLICE, ZC_STEP_AT_END, 0, 3, false, 3);
}
static void t_replan_adam_slice_ids(void)
{
	replan(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED, 1, 2, true, 2);
}
static void t_replan_adamw_bucket_position(void)
{
	replan(ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END, 3, 0, false, 2);
}
static void t_replan_world1(void)
{
	replan(ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 0, 2, true, 1);
}

/* The wording, directly: a run on the second layout throughout,
 * from the state the first one had after 5 iterations, ends bit for bit
 * where the run that re-planned after those 5 ends. */
static void t_replan_equals_second_layout_run(void)
{
	struct script *a = script_new("first5", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *b = script_new("second", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct script *c = script_new("replans", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *at5 = test_shared(sizeof(*at5)), *end = test_shared(sizeof(*end));

	a->iters = 5;
	a->out = at5;
	run_script(a);
	REQUIRE(at5->valid && !test_failed_, "the first 5 iterations failed");
	b->layout = 1;
	b->ids = true;
	b->load = true;
	b->in = at5;
	b->start = 5;
	b->iters = 5;
	b->out = end;
	run_script(b);
	REQUIRE(end->valid && !test_failed_, "the run on the second layout failed");
	c->ids = true;
	c->iters = 10;
	c->replan_at = 5;
	c->replan_layout = 1;
	c->want = end;
	run_script(c);
}

/* ------------------------------------------------ bf16/fp16 parameters --- */

/* What an export of a plan with bf16/fp16 buckets must hold: a master
 * exactly for those parameters, the parameters its rounding, and (after
 * some steps) masters that are not just the rounded parameters widened
 * again: the fp32 bits the parameters lost. */
static void lowp_check(const struct snap *s)
{
	uint64_t finer = 0;

	for (int k = 0; k < NP; k++) {
		uint64_t o = param_base(k);
		bool lp = sf_lowp_dt[k] != ZC_DTYPE_F32;

		CHECK(!!(s->present[k] & ZC_STATE_MASTER) == lp, "param %d (%s): present 0x%x", k,
		      lp ? "bf16/fp16" : "fp32", s->present[k]);
		for (uint64_t i = 0; lp && i < params[k].numel; i++) {
			float r = ref_lowp_widen(ref_lowp_round(s->master[o + i], sf_lowp_dt[k]),
						 sf_lowp_dt[k]);
			if (memcmp(&r, &s->p[o + i], sizeof(r)) != 0) {
				CHECK(0, "param %d[%llu] = %.9g is not its master %.9g rounded", k,
				      (unsigned long long)i, s->p[o + i], s->master[o + i]);
				break;
			}
			finer += s->master[o + i] != s->p[o + i];
		}
	}
	CHECK(finer > 0, "every master equals its rounded parameter: not a master");
	printf("# %llu masters finer than their parameters\n", (unsigned long long)finer);
}

/* fp32, bf16 and fp16 buckets: the export has the masters (ZC_STATE_MASTER)
 * and the moments, importing it and exporting again gives the same bits,
 * the parameters untouched. */
static void lowp_roundtrip(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step)
{
	struct script *sc = script_new("lowp-roundtrip", 2, opt, shard, step);
	struct snap *out = test_shared(sizeof(*out));

	sf_lowp = true;
	sc->layout = 4;
	sc->iters = 3;
	sc->roundtrip = true;
	sc->out = out;
	run_script(sc);
	REQUIRE(out->valid && !test_failed_, "the run failed");
	lowp_check(out);
}

static void t_lowp_roundtrip_adam_slice(void)
{
	lowp_roundtrip(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
}
static void t_lowp_roundtrip_sgd_bucket(void)
{
	lowp_roundtrip(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
}

/* As replan_equals_second_layout_run with fp32, bf16 and fp16 buckets: the
 * run on the second layout from the export after 5 iterations (masters
 * imported) ends bit for bit where the run that re-planned ends, masters
 * included. The masters at 5 are finer than the parameters (lowp_check), so
 * a re-plan that re-derived them from the rounded parameters would not. */
static void lowp_replan(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step,
			uint32_t world, bool ids, int to)
{
	struct script *a = script_new("lowp-first5", world, opt, shard, step);
	struct script *b = script_new("lowp-second", world, opt, shard, step);
	struct script *c = script_new("lowp-replans", world, opt, shard, step);
	struct snap *at5 = test_shared(sizeof(*at5)), *end = test_shared(sizeof(*end));

	sf_lowp = true;
	a->layout = 4;
	a->iters = 5;
	a->out = at5;
	run_script(a);
	REQUIRE(at5->valid && !test_failed_, "the first 5 iterations failed");
	lowp_check(at5);
	b->layout = to;
	b->ids = ids;
	b->load = true;
	b->in = at5;
	b->start = 5;
	b->iters = 5;
	b->out = end;
	run_script(b);
	REQUIRE(end->valid && !test_failed_, "the run on the second layout failed");
	c->layout = 4;
	c->ids = ids;
	c->iters = 10;
	c->replan_at = 5;
	c->replan_layout = to;
	c->roundtrip = true;
	c->want = end;
	run_script(c);
}

static void t_lowp_replan_adam_slice_ids(void)
{
	lowp_replan(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 2, true, 5);
}
static void t_lowp_replan_sgd_bucket_position(void)
{
	lowp_replan(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 3, false, 6);
}

/* A bf16/fp16 segment given without its master (a state saved by plain
 * torch): the master is the owner's parameters widened, the moments are
 * taken, and the job trains on. */
static void t_lowp_import_without_master(void)
{
	struct script *a =
		script_new("lowp-nomaster", 2, ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct script *b =
		script_new("lowp-nomaster2", 2, ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct snap *saved = test_shared(sizeof(*saved)), *got = test_shared(sizeof(*got));

	sf_lowp = true;
	a->layout = 4;
	a->iters = 3;
	a->out = saved;
	run_script(a);
	REQUIRE(saved->valid && !test_failed_, "the export failed");
	for (int k = 0; k < NP; k++)
		saved->present[k] &= ~ZC_STATE_MASTER;
	b->layout = 5;
	b->ids = true;
	b->load = true;
	b->in = saved;
	b->start = 3;
	b->iters = 0;
	b->out = got;
	run_script(b);
	REQUIRE(got->valid && !test_failed_, "the import failed");
	for (int k = 0; k < NP; k++) {
		uint64_t o = param_base(k);
		if (sf_lowp_dt[k] == ZC_DTYPE_F32)
			continue;
		CHECK(memcmp(got->master + o, saved->p + o, params[k].numel * sizeof(float)) == 0,
		      "param %d: the master is not the parameter widened", k);
		CHECK(memcmp(got->m + o, saved->m + o, params[k].numel * sizeof(float)) == 0,
		      "param %d: exp_avg not imported", k);
	}
}

/* A master given to zc_set_state(): the rank's parameters become it
 * rounded (as apex loads its masters into the model), the export gives it
 * back bit for bit, and the next step starts from it (no ZC_EPARAMEDIT); a
 * NaN in one, or NULL, is refused naming the master, nothing applied. */
static int master_rank(void *arg, int idx)
{
	const struct script *sc = arg;
	struct zc_config cfg = test_config(&daemon_, sc->job, (uint32_t)idx, 1);
	struct tplan tp;
	zc_client *c = NULL;
	struct zc_segment_state s = ZC_SEGMENT_STATE_INIT, got = ZC_SEGMENT_STATE_INIT;
	static float master[2500], back[2500];
	const int k = 4; /* bf16, 2500 elements */
	const uint16_t *pb;
	int r;

	make_plan(&tp, &layouts[4], sc->opt, ZC_SHARD_BUCKET, ZC_STEP_AT_END, false);
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &tp.plan)) < 0 ||
	    (r = zc_register_plan(c)) < 0) {
		EXPECT(0, "setup: %s: %s", zc_strerror_name(r), zc_error_message());
		zc_close(c);
		return 1;
	}
	for (uint64_t i = 0; i < params[k].numel; i++)
		master[i] = 1.0f + (float)i * 1e-5f; /* finer than bf16 */
	s.bucket = got.bucket = tp.bucket_of[k];
	s.segment = got.segment = tp.seg_of[k];
	s.present = ZC_STATE_MASTER;
	s.master = master;
	r = zc_set_state(c, &s, 1);
	EXPECT(r == 0, "set_state with a master: %s: %s", zc_strerror_name(r), zc_error_message());
	pb = (const uint16_t *)zc_param_ptr(c, tp.bucket_of[k]) +
	     tp.segs[tp.bucket_of[k]][tp.seg_of[k]].offset;
	for (uint64_t i = 0; r == 0 && i < params[k].numel; i++)
		if (pb[i] != ref_lowp_round(master[i], ZC_DTYPE_BF16)) {
			EXPECT(0, "param[%llu] = 0x%04x, not its master %.9g rounded",
			       (unsigned long long)i, pb[i], master[i]);
			break;
		}
	got.master = back;
	if (r == 0)
		r = zc_get_state(c, &got, 1);
	EXPECT(r == 0 && (got.present & ZC_STATE_MASTER) &&
		       memcmp(back, master, sizeof(master)) == 0,
	       "the master exported differs from the one imported (%s)", zc_strerror_name(r));
	if (r == 0)
		r = one_iteration(c, sc, &tp, 0, 0);
	EXPECT(r == 0, "a step after the import: %s: %s", zc_strerror_name(r), zc_error_message());
	master[7] = NAN;
	r = zc_set_state(c, &s, 1);
	EXPECT(r == ZC_ESTATEINVAL && strstr(zc_error_message(), "master[7]: nan"),
	       "a NaN master: %s: %s", zc_strerror_name(r), zc_error_message());
	s.master = NULL;
	r = zc_set_state(c, &s, 1);
	EXPECT(r == ZC_ESTATEINVAL && strstr(zc_error_message(), "master: present but NULL"),
	       "a NULL master: %s: %s", zc_strerror_name(r), zc_error_message());
	zc_close(c);
	return child_bad;
}

static void t_lowp_master_sets_params(void)
{
	struct script *sc =
		script_new("lowp-master", 1, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);

	sf_lowp = true;
	CHECK(wait_child(spawn(master_rank, sc, 0), test_timeout(30000)) == 0, "the rank failed");
}

/* ---------------------------------------------------- nothing named --- */

/* Names created in /dev/shm while a job exports, imports and re-plans (an
 * inotify watch from before the run: a name made and unlinked at once still
 * shows), and what its trainers map from there: none. Only names of this
 * job are counted, other runs on the machine may make their own. */
static void t_no_name_in_dev_shm(void)
{
	struct script *sc = script_new("noshm", 2, ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));
	char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC), n = 0;
	ssize_t len;

	REQUIRE(fd >= 0 && inotify_add_watch(fd, "/dev/shm", IN_CREATE | IN_MOVED_TO) >= 0,
		"inotify on /dev/shm: %s", strerror(errno));
	sf_hyper_iter = 3;
	snap_init(want, sc->seed);
	ref_train(want, ZC_OPT_ADAM, sc->seed, 2, 0, 6);
	sc->ids = true;
	sc->iters = 6;
	sc->replan_at = 3;
	sc->replan_layout = 1;
	sc->roundtrip = true;
	sc->check_maps = true;
	sc->want = want;
	run_script(sc);
	while ((len = read(fd, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + len;) {
			const struct inotify_event *ev = (const void *)p;
			if (ev->len && strstr(ev->name, "noshm")) {
				printf("# made in /dev/shm: %s\n", ev->name);
				n++;
			}
			p += sizeof(*ev) + ev->len;
		}
	close(fd);
	CHECK(n == 0, "%d names of the job were made in /dev/shm", n);
}

/* A job beside the one the bad input goes to: it must keep training. */
static int bystander_rank(void *arg, int idx)
{
	return train_rank(arg, (uint32_t)idx);
}

static pid_t *bystander_start(struct train_spec *s, pid_t *pids)
{
	*s = (struct train_spec){
		.socket = daemon_.sock,
		.job = "bystander",
		.world = 2,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_SLICE,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 40,
		.seed = 99,
		.hyper_iter = -1,
	};
	for (uint32_t r = 0; r < s->world; r++)
		pids[r] = spawn(bystander_rank, s, (int)r);
	return pids;
}

static void bystander_check(const struct train_spec *s, const pid_t *pids)
{
	for (uint32_t r = 0; r < s->world; r++)
		CHECK(wait_child(pids[r], test_timeout(60000)) == 0,
		      "the job beside it, rank %u, did not train to the reference", r);
}

/* Each bad zc_set_state() and re-plan: a named error naming the segment and
 * the field, nothing applied (the job then trains to the reference as if
 * nothing had been tried), and a job beside it keeps training. */
static int bad_rank(void *arg, int idx)
{
	const struct script *sc = arg;
	uint32_t rank = (uint32_t)idx;
	struct zc_config cfg = test_config(&daemon_, sc->job, rank, sc->world);
	struct tplan *tp = calloc(1, sizeof(*tp)), *bad = calloc(1, sizeof(*bad));
	struct snap *s = calloc(1, sizeof(*s)), *want = calloc(1, sizeof(*want));
	struct zc_segment_state segs[NP];
	zc_client *c = NULL;
	int r;

	cfg.register_timeout_ms = test_timeout(20000);
	make_plan(tp, &layouts[0], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
	snap_init(s, sc->seed);
	if ((r = zc_connect(&cfg, &c)) < 0 || (r = zc_alloc_buffers(c, &tp->plan)) < 0 ||
	    sf_fill_params(c, tp, s) < 0 || (r = zc_register_plan(c)) < 0) {
		EXPECT(0, "setup: %s: %s", zc_strerror_name(r), zc_error_message());
		zc_close(c);
		return 1;
	}
	for (int it = 0; it < 2 && r >= 0; it++)
		r = one_iteration(c, sc, tp, rank, it);
	if (r >= 0)
		r = export_snap(c, tp, ZC_OPT_ADAM, s);
	EXPECT(r == 0, "export: %s: %s", zc_strerror_name(r), zc_error_message());

	/* param 1 is in group 1 (amsgrad): step, exp_avg, exp_avg_sq, max_exp_avg_sq */
	static const struct {
		const char *what, *needle;
		int code;
	} tries[] = {
		{"NaN step", "step: nan", ZC_ESTATEINVAL},
		{"negative step", "step: -1", ZC_ESTATEINVAL},
		{"step 1.5", "step: 1.5", ZC_ESTATEINVAL},
		{"a NaN in exp_avg", "exp_avg[3]: nan", ZC_ESTATEINVAL},
		{"a negative exp_avg_sq", "exp_avg_sq[5]", ZC_ESTATEINVAL},
		{"an infinite max_exp_avg_sq", "max_exp_avg_sq[0]: inf", ZC_ESTATEINVAL},
		{"momentum_buffer for Adam", "momentum_buffer: not a state of adam",
		 ZC_ESTATEINVAL},
		{"a master for fp32", "master", ZC_ESTATEINVAL},
		{"no exp_avg_sq", "exp_avg_sq: missing", ZC_ESTATEINVAL},
		{"no max_exp_avg_sq under amsgrad", "max_exp_avg_sq: missing", ZC_ESTATEINVAL},
		{"exp_avg NULL", "exp_avg: present but NULL", ZC_ESTATEINVAL},
		{"bucket 9", "bucket: 9", ZC_ESTATEINVAL},
		{"segment 7", "segment: 7", ZC_ESTATEINVAL},
		{"a segment twice", "given twice", ZC_ESTATEINVAL},
		{"unknown present bits", "unknown bits", ZC_ESTATEINVAL},
	};
	for (size_t t = 0; t < sizeof(tries) / sizeof(tries[0]) && r == 0; t++) {
		uint32_t n = NP;
		float saved;
		snap_segs(s, tp, ZC_OPT_ADAM, segs);
		struct zc_segment_state *x = &segs[1];
		switch (t) {
		case 0:
			x->step = NAN;
			break;
		case 1:
			x->step = -1;
			break;
		case 2:
			x->step = 1.5;
			break;
		case 3:
			saved = x->exp_avg[3], x->exp_avg[3] = NAN;
			break;
		case 4:
			saved = x->exp_avg_sq[5], x->exp_avg_sq[5] = -1;
			break;
		case 5:
			saved = x->max_exp_avg_sq[0], x->max_exp_avg_sq[0] = INFINITY;
			break;
		case 6:
			x->present |= ZC_STATE_MOMENTUM_BUFFER, x->momentum_buffer = x->exp_avg;
			break;
		case 7:
			x->present |= ZC_STATE_MASTER, x->master = x->exp_avg;
			break;
		case 8:
			x->present &= ~ZC_STATE_EXP_AVG_SQ;
			break;
		case 9:
			x->present &= ~ZC_STATE_MAX_EXP_AVG_SQ;
			break;
		case 10:
			x->exp_avg = NULL;
			break;
		case 11:
			x->bucket = 9;
			break;
		case 12:
			x->segment = 7;
			break;
		case 13:
			segs[2] = segs[1];
			break;
		case 14:
			x->present |= 1u << 8;
			break;
		}
		r = zc_set_state(c, segs, n);
		EXPECT(r == tries[t].code && strstr(zc_error_message(), tries[t].needle),
		       "%s: %s: %s", tries[t].what, zc_strerror_name(r), zc_error_message());
		EXPECT(t >= 11 || strstr(zc_error_message(), "buckets[0].segments[1]"),
		       "%s: the reason names the segment: %s", tries[t].what, zc_error_message());
		if (t == 3)
			x->exp_avg[3] = saved;
		if (t == 4)
			x->exp_avg_sq[5] = saved;
		if (t == 5)
			x->max_exp_avg_sq[0] = saved;
		r = r == tries[t].code ? 0 : -1;
	}
	/* ranks that disagree: the daemon compares their lists; every rank hears
	 * it, nothing is applied */
	if (r == 0 && sc->world > 1) {
		snap_segs(s, tp, ZC_OPT_ADAM, segs);
		if (rank == 1)
			segs[4].step += 1;
		r = zc_set_state(c, segs, NP);
		EXPECT(r == ZC_ESTATEINVAL && strstr(zc_error_message(), "differs from rank"),
		       "ranks that disagree: %s: %s", zc_strerror_name(r), zc_error_message());
		r = r == ZC_ESTATEINVAL ? 0 : -1;
	}
	/* a re-plan that changes the parameters: refused, the plan stays */
	make_plan(bad, &layouts[1], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
	bad->segs[0][0].numel += 1, bad->segs[0][1].offset += 1, bad->buckets[0].numel += 1;
	if (r == 0) {
		r = zc_alloc_buffers(c, &bad->plan);
		EXPECT(r == ZC_EREPLAN && strstr(zc_error_message(), "numel 301"),
		       "re-plan with another numel: %s: %s", zc_strerror_name(r),
		       zc_error_message());
		make_plan(bad, &layouts[1], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
		bad->segs[1][1].group = 0;
		r = zc_alloc_buffers(c, &bad->plan);
		EXPECT(r == ZC_EREPLAN && strstr(zc_error_message(), "group 0"),
		       "re-plan with another group: %s: %s", zc_strerror_name(r),
		       zc_error_message());
		make_plan(bad, &layouts[1], ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
		r = zc_alloc_buffers(c, &bad->plan);
		EXPECT(r == ZC_EREPLAN && strstr(zc_error_message(), "optimizer"),
		       "re-plan with another optimizer: %s: %s", zc_strerror_name(r),
		       zc_error_message());
		make_plan(bad, &layouts[1], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
		bad->segs[0][1].param_id = 555;
		r = zc_alloc_buffers(c, &bad->plan);
		EXPECT(r == ZC_EREPLAN && strstr(zc_error_message(), "555"),
		       "re-plan with an unknown param_id: %s: %s", zc_strerror_name(r),
		       zc_error_message());
		make_plan(bad, &layouts[1], ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, true);
		bad->segs[0][1].param_id = bad->segs[0][0].param_id;
		r = zc_alloc_buffers(c, &bad->plan);
		EXPECT(r == ZC_EPLANINVAL && strstr(zc_error_message(), "param_id"),
		       "a param_id twice: %s: %s", zc_strerror_name(r), zc_error_message());
		r = 0;
	}
	/* nothing of it was applied: two more iterations equal the reference */
	for (int it = 2; it < 4 && r >= 0; it++)
		r = one_iteration(c, sc, tp, rank, it);
	EXPECT(r == 0, "training after the refusals: %s: %s", zc_strerror_name(r),
	       zc_error_message());
	if (r == 0 && export_snap(c, tp, ZC_OPT_ADAM, s) == 0) {
		snap_init(want, sc->seed);
		ref_train(want, ZC_OPT_ADAM, sc->seed, sc->world, 0, 4);
		EXPECT(snap_compare("after bad input", s, want, ZC_OPT_ADAM) == 0,
		       "rank %u: the refused input changed something", rank);
	}
	zc_close(c);
	free(tp);
	free(bad);
	free(s);
	free(want);
	return child_bad;
}

static void t_bad_input(void)
{
	struct script *sc = script_new("bad", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED);
	struct train_spec *by = test_shared(sizeof(*by));
	pid_t bp[2], pids[2];

	bystander_start(by, bp);
	for (uint32_t r = 0; r < sc->world; r++)
		pids[r] = spawn(bad_rank, sc, (int)r);
	for (uint32_t r = 0; r < sc->world; r++)
		CHECK(wait_child(pids[r], test_timeout(60000)) == 0, "rank %u: see above", r);
	bystander_check(by, bp);
	if (test_failed_)
		zd_dump_log(&daemon_);
}

/* The daemon checks what a client that skipped libzeroclient's checks
 * sends: a staging of the wrong size, a segment out of range, a NaN step, a
 * tensor SGD does not keep, a state call before the plan; each a named
 * error, and the job trains on. */
static int raw_rank(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__GetState gs = ZEROD__V1__GET_STATE__INIT;
	Zerod__V1__SetState ss = ZEROD__V1__SET_STATE__INIT;
	Zerod__V1__CheckpointState cs = ZEROD__V1__CHECKPOINT_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	Zerod__V1__SegmentState item = ZEROD__V1__SEGMENT_STATE__INIT, *items[1] = {&item};
	struct raw_reg g;
	struct raw r = {0};
	char name[96];

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "state") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_hello(&r, "raw-state");
	snprintf(name, sizeof(name), "/zerodtest-state-%d-staging", (int)getpid());
	sg.shm_name = name;
	sg.bytes = 5 * g.bytes;
	gs.staging = &sg;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_GET_STATE;
	env.get_state = &gs;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_ESTATE, "the job is not running", "GetState before the plan");
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");

	raw_make_shm(name, 4 * g.bytes); /* one region short */
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_ESIZE, "state staging", "a staging of the wrong size");

	env.body_case = ZEROD__V1__ENVELOPE__BODY_SET_STATE;
	env.set_state = &ss;
	ss.staging = &sg;
	ss.segments = items;
	ss.n_segments = 1;
	static const struct {
		uint32_t bucket, segment, present;
		double step;
		const char *needle;
	} bad[] = {
		{2, 0, 0, 0, "bucket 2"},
		{1, 1, 0, 0, "buckets[1].segments[1]"},
		{0, 0, ZC_STATE_STEP, 0, "step: torch.optim.SGD keeps no step"},
		{0, 0, ZC_STATE_EXP_AVG, NAN, "exp_avg: not a state of torch.optim.SGD"},
		{0, 0, ZC_STATE_MOMENTUM_BUFFER, 0, "momentum 0"},
	};
	for (size_t t = 0; t < sizeof(bad) / sizeof(bad[0]); t++) {
		raw_make_shm(name, 5 * g.bytes);
		item.bucket = bad[t].bucket;
		item.segment = bad[t].segment;
		item.present = bad[t].present;
		item.step = bad[t].step;
		raw_send(&r, &env);
		raw_expect_error(&r, ZC_ESTATEINVAL, bad[t].needle, bad[t].needle);
	}
	/* and the job goes on */
	raw_bucket(&r, 0, 0);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 0");
	raw_bucket(&r, 0, 1);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 1");
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STEP_DONE, "step 0");
	/* a good one now: the staging of the right size, nothing given */
	raw_make_shm(name, 5 * g.bytes);
	ss.n_segments = 0;
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STATE_OK, "an empty SetState");
	/* a checkpoint's export (zc_checkpoint): a rank without staging takes
	 * part and gets nothing; a staging of the wrong size is refused, one
	 * of the right size served */
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_STATE;
	env.checkpoint_state = &cs;
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STATE_OK, "CheckpointState, no staging");
	raw_make_shm(name, 4 * g.bytes);
	cs.staging = &sg;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_ESIZE, "state staging", "CheckpointState, the wrong size");
	raw_make_shm(name, 5 * g.bytes);
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STATE_OK, "CheckpointState, a staging");
	raw_goodbye(&r);
	raw_close(&r);
	shm_unlink(name);
	raw_reg_free(&g);
	return child_bad;
}

/* An FDSTAGE record (common/bufwire.h) with fds over the fd socket, as
 * libzeroclient sends a staging: zerod's answer (status, message). */
static int stage_send(const char *path, uint64_t token, const int *fds, int nfds, uint64_t bytes,
		      struct fdbufs_reply *rep)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct fdbufs_offer o = {.magic = FDSTAGE_MAGIC,
				 .token = token,
				 .version = FDBUFS_VERSION,
				 .nfds = (uint32_t)nfds,
				 .bytes = bytes};
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = {.iov_base = &o, .iov_len = sizeof(o)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf.buf,
			    .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
	struct cmsghdr *cm;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n = -1;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	memset(cbuf.buf, 0, sizeof(cbuf.buf));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	memset(rep, 0, sizeof(*rep));
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(o))
		n = recv(fd, rep, sizeof(*rep), 0);
	if (fd >= 0)
		close(fd);
	rep->message[sizeof(rep->message) - 1] = 0;
	return n == (ssize_t)sizeof(*rep) ? 0 : -1;
}

/* A staging memfd of `bytes`, sealed against shrinking (or not). */
static int stage_memfd(uint64_t bytes, bool seal)
{
	int fd = memfd_create("test-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd >= 0 && (ftruncate(fd, (off_t)bytes) < 0 ||
			(seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The staging passed as a memfd (FDSTAGE): refused before the plan is
 * registered, unsealed, as two fds, too small, or named by a serial never
 * passed, each with its named error, and the job trains on; a good one
 * serves the round. */
static int stage_rank(void *arg, int idx)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT, *in;
	Zerod__V1__GetState gs = ZEROD__V1__GET_STATE__INIT;
	Zerod__V1__StateStaging sg = ZEROD__V1__STATE_STAGING__INIT;
	Zerod__V1__Hello h;
	struct fdbufs_reply rep;
	struct raw_reg g;
	struct raw r = {0};
	char path[256] = "";
	uint64_t token = 0;
	int good, fds[2];

	(void)arg, (void)idx;
	if (raw_reg_init(&g, "stage") < 0 || raw_open(&r, daemon_.sock, 0) < 0)
		return 1;
	raw_fill_hello(&h, "raw-stage", 0, 1);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	raw_send(&r, &env);
	in = raw_recv(&r, "HelloOk");
	if (in && in->body_case == ZEROD__V1__ENVELOPE__BODY_HELLO_OK &&
	    in->hello_ok->fastpath_socket) {
		snprintf(path, sizeof(path), "%s", in->hello_ok->fastpath_socket);
		token = in->hello_ok->fastpath_token;
	}
	wire_free(in);
	good = stage_memfd(5 * g.bytes, true);
	if (!path[0] || good < 0) {
		EXPECT(0, "no fd socket offered, or no memfd: %s", strerror(errno));
		return 1;
	}
	EXPECT(stage_send(path, token, &good, 1, 5 * g.bytes, &rep) == 0 &&
		       rep.status == ZC_ESTATE &&
		       strstr(rep.message, "once the plan is registered"),
	       "a staging before the plan: %d %s", rep.status, rep.message);
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "RegisterPlan");

	fds[0] = stage_memfd(5 * g.bytes, false);
	EXPECT(stage_send(path, token, fds, 1, 5 * g.bytes, &rep) == 0 &&
		       rep.status == ZC_EBUFFER && strstr(rep.message, "not sealed"),
	       "an unsealed staging: %d %s", rep.status, rep.message);
	close(fds[0]);
	fds[0] = fds[1] = good;
	EXPECT(stage_send(path, token, fds, 2, 5 * g.bytes, &rep) == 0 && rep.status == ZC_EPROTO &&
		       strstr(rep.message, "one memfd"),
	       "a staging of two fds: %d %s", rep.status, rep.message);
	fds[0] = stage_memfd(4 * g.bytes, true); /* one region short */
	EXPECT(stage_send(path, token, fds, 1, 4 * g.bytes, &rep) == 0 && rep.status == 0,
	       "a small staging is taken (its size is checked by the request): %d %s", rep.status,
	       rep.message);
	close(fds[0]);
	sg.shm_name = (char *)"";
	sg.bytes = 4 * g.bytes;
	sg.has_fd_serial = true;
	sg.fd_serial = rep.serial;
	gs.staging = &sg;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_GET_STATE;
	env.get_state = &gs;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_EBUFFER, "state staging: the buffers hold",
			 "a staging one region short");
	sg.fd_serial = 999999;
	raw_send(&r, &env);
	raw_expect_error(&r, ZC_EBUFFER, "no state staging 999999", "a serial never passed");
	/* the job goes on */
	raw_bucket(&r, 0, 0);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 0");
	raw_bucket(&r, 0, 1);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE, "bucket 1");
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STEP_DONE, "step 0");
	/* and a good staging serves the round */
	EXPECT(stage_send(path, token, &good, 1, 5 * g.bytes, &rep) == 0 && rep.status == 0,
	       "a good staging: %d %s", rep.status, rep.message);
	sg.bytes = 5 * g.bytes;
	sg.fd_serial = rep.serial;
	raw_send(&r, &env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STATE_OK, "GetState with a memfd staging");
	/* a checkpoint's staging: kept mapped by zerod, used again when the
	 * same memfd comes back, replaced by another one, refused when small */
	Zerod__V1__CheckpointState cs = ZEROD__V1__CHECKPOINT_STATE__INIT;
	static const struct {
		int which; /* 0: good, 1: another, 2: one region short */
		const char *what;
	} ck[] = {{0, "kept"},
		  {0, "the kept one again"},
		  {1, "another"},
		  {2, "one region short"},
		  {0, "the first again"}};
	int other = stage_memfd(5 * g.bytes, true), small = stage_memfd(4 * g.bytes, true);
	env.body_case = ZEROD__V1__ENVELOPE__BODY_CHECKPOINT_STATE;
	env.checkpoint_state = &cs;
	cs.staging = &sg;
	for (size_t i = 0; i < sizeof(ck) / sizeof(ck[0]); i++) {
		int fd = ck[i].which == 0 ? good : ck[i].which == 1 ? other : small;
		uint64_t bytes = (ck[i].which == 2 ? 4 : 5) * g.bytes;
		EXPECT(stage_send(path, token, &fd, 1, bytes, &rep) == 0 && rep.status == 0,
		       "a checkpoint's staging (%s): %d %s", ck[i].what, rep.status, rep.message);
		sg.bytes = bytes;
		sg.fd_serial = rep.serial;
		raw_send(&r, &env);
		if (ck[i].which == 2)
			raw_expect_error(&r, ZC_EBUFFER, "state staging", ck[i].what);
		else
			raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_STATE_OK, ck[i].what);
	}
	close(other);
	close(small);
	close(good);
	raw_goodbye(&r);
	raw_close(&r);
	raw_reg_free(&g);
	return child_bad;
}

static void t_staging_fd_checks(void)
{
	CHECK(wait_child(spawn(stage_rank, NULL, 0), test_timeout(30000)) == 0, "see above");
}

static void t_daemon_checks(void)
{
	CHECK(wait_child(spawn(raw_rank, NULL, 0), test_timeout(30000)) == 0, "see above");
}

/* ------------------------------------------- over several nodes (gloo) --- */

/* nnodes real zerods on loopback, each its own socket, for sc; the
 * rendezvous on a port the kernel picked free. */
static struct zd nodes_[3];

static int nodes_start(struct script *sc, uint32_t nnodes, const uint32_t *node_of)
{
	const char *const args[] = {"--workers", "2", NULL};
	int port;

	sc->nnodes = nnodes;
	memcpy(sc->node_of, node_of, sc->world * sizeof(*node_of));
	for (uint32_t k = 0; k < nnodes; k++) {
		int r = zd_start(&nodes_[k], args);
		if (r < 0)
			return r;
		snprintf(sc->socks[k], sizeof(sc->socks[k]), "%s", nodes_[k].sock);
	}
	port = zd_free_port();
	snprintf(sc->rdzv, sizeof(sc->rdzv), "127.0.0.1:%d", port);
	return port > 0 ? 0 : -EADDRINUSE;
}

static void nodes_stop(const struct script *sc)
{
	for (uint32_t k = 0; k < sc->nnodes; k++) {
		if (test_failed_) {
			printf("# ---- node %u ----\n", k);
			zd_dump_log(&nodes_[k]);
		}
		CHECK(zd_stop(&nodes_[k], 10000) == 0, "node %u's zerod did not stop cleanly", k);
	}
}

static void run_nodes(struct script *sc, uint32_t nnodes, const uint32_t *node_of)
{
	int r = nodes_start(sc, nnodes, node_of);

	CHECK(r == 0, "cannot start the nodes: %s", strerror(-r));
	if (r == 0)
		run_script(sc);
	nodes_stop(sc);
}

/* The export gathers every node's pieces: each rank of a job over 2 nodes
 * gets the whole state, equal to the reference (summed in node order), and
 * imports it back unchanged. */
static void nodes_roundtrip(enum zc_optimizer opt, enum zc_shard_mode shard, uint32_t world,
			    const uint32_t *node_of)
{
	struct script *sc = script_new("nodes-roundtrip", world, opt, shard, ZC_STEP_AT_END);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, sc->seed);
	ref_train_nodes(want, opt, sc->seed, world, node_of, 0, 3);
	sc->iters = 3;
	sc->roundtrip = true;
	sc->want = want;
	run_nodes(sc, 2, node_of);
}

static void t_nodes_roundtrip_sgd_bucket(void)
{
	static const uint32_t node_of[] = {0, 1};
	nodes_roundtrip(ZC_OPT_SGD, ZC_SHARD_BUCKET, 2, node_of);
}

static void t_nodes_roundtrip_adam_slice(void)
{
	static const uint32_t node_of[] = {0, 1, 1};
	nodes_roundtrip(ZC_OPT_ADAM, ZC_SHARD_SLICE, 3, node_of);
}

/* A state exported on one node, imported into a job of 3 ranks over 2
 * nodes (another shard mode and layout): its next steps equal the
 * reference's, through a re-plan over the 2 nodes too. */
static void t_nodes_import_other_world(void)
{
	static const uint32_t node_of[] = {1, 0, 1};
	struct script *a =
		script_new("nodes-export", 2, ZC_OPT_ADAMW, ZC_SHARD_SLICE, ZC_STEP_INTERLEAVED);
	struct script *b =
		script_new("nodes-import", 3, ZC_OPT_ADAMW, ZC_SHARD_BUCKET, ZC_STEP_AT_END);
	struct snap *saved = test_shared(sizeof(*saved)), *want = test_shared(sizeof(*want));

	snap_init(want, a->seed);
	ref_train(want, ZC_OPT_ADAMW, a->seed, 2, 0, 3);
	a->iters = 3;
	a->want = want;
	a->out = saved;
	run_script(a);
	REQUIRE(saved->valid && !test_failed_, "the export failed");
	ref_train_nodes(want, ZC_OPT_ADAMW, a->seed, 3, node_of, 3, 6);
	b->layout = 1;
	b->ids = true;
	b->load = true;
	b->in = saved;
	b->start = 3;
	b->iters = 3;
	b->replan_at = 4;
	b->replan_layout = 0;
	b->want = want;
	run_nodes(b, 2, node_of);
}

/* Re-planning over 2 nodes (the gloo group opens again under fresh store
 * keys): train 3, re-plan, train 3 more, equal to the reference bit for
 * bit, moments moved, and a round trip after. */
static void nodes_replan(enum zc_optimizer opt, enum zc_shard_mode shard, enum zc_step_mode step,
			 uint32_t world, const uint32_t *node_of, int from, int to, bool ids)
{
	struct script *sc = script_new("nodes-replan", world, opt, shard, step);
	struct snap *want = test_shared(sizeof(*want));

	snap_init(want, sc->seed);
	ref_train_nodes(want, opt, sc->seed, world, node_of, 0, 6);
	sc->layout = from;
	sc->ids = ids;
	sc->iters = 6;
	sc->replan_at = 3;
	sc->replan_layout = to;
	sc->roundtrip = true;
	sc->want = want;
	run_nodes(sc, 2, node_of);
}

static void t_nodes_replan_adam_slice(void)
{
	static const uint32_t node_of[] = {0, 1, 1};
	nodes_replan(ZC_OPT_ADAM, ZC_SHARD_SLICE, ZC_STEP_AT_END, 3, node_of, 0, 1, true);
}

static void t_nodes_replan_sgd_bucket(void)
{
	static const uint32_t node_of[] = {1, 0};
	nodes_replan(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 2, node_of, 0, 3, false);
}

/* The two nodes' ranks re-plan to different layouts (each node's ranks
 * agree among themselves): the new executors compare plans before their
 * group opens, and every rank hears ZC_EPLANMISMATCH, no hang. */
static void t_nodes_replan_mismatch(void)
{
	static const uint32_t node_of[] = {0, 1};
	struct script *sc =
		script_new("nodes-replan-mm", 2, ZC_OPT_ADAM, ZC_SHARD_BUCKET, ZC_STEP_AT_END);

	sc->ids = true;
	sc->iters = 4;
	sc->replan_at = 2;
	sc->replan_layout = 1;
	sc->replan_layout_node1 = 2;
	sc->replan_code = ZC_EPLANMISMATCH;
	sc->replan_ends = true;
	run_nodes(sc, 2, node_of);
}

static const struct test_case node_cases[] = {
	{"nodes_replan_adam_slice", t_nodes_replan_adam_slice, 120000},
	{"nodes_replan_sgd_bucket", t_nodes_replan_sgd_bucket, 120000},
	{"nodes_replan_mismatch", t_nodes_replan_mismatch, 120000},
	{"nodes_roundtrip_sgd_bucket", t_nodes_roundtrip_sgd_bucket, 90000},
	{"nodes_roundtrip_adam_slice", t_nodes_roundtrip_adam_slice, 90000},
	{"nodes_import_other_world", t_nodes_import_other_world, 120000},
};

static const struct test_case cases[] = {
	{"roundtrip_sgd_bucket", t_roundtrip_sgd_bucket, 60000},
	{"roundtrip_sgd_slice", t_roundtrip_sgd_slice, 60000},
	{"roundtrip_adam_bucket", t_roundtrip_adam_bucket, 60000},
	{"roundtrip_adamw_slice", t_roundtrip_adamw_slice, 60000},
	{"empty_before_first_step", t_empty_before_first_step, 60000},
	{"formats_sgd", t_formats_sgd, 40000},
	{"formats_adam", t_formats_adam, 40000},
	{"other_world_sgd", t_other_world_sgd, 90000},
	{"other_world_adamw", t_other_world_adamw, 90000},
	{"replan_sgd_bucket_ids", t_replan_sgd_bucket_ids, 90000},
	{"replan_sgd_slice_position", t_replan_sgd_slice_position, 90000},
	{"replan_adam_slice_ids", t_replan_adam_slice_ids, 90000},
	{"replan_adamw_bucket_position", t_replan_adamw_bucket_position, 90000},
	{"replan_world1", t_replan_world1, 90000},
	{"replan_equals_second_layout_run", t_replan_equals_second_layout_run, 120000},
	{"bad_input", t_bad_input, 120000},
	{"daemon_checks", t_daemon_checks, 40000},
	{"staging_fd_checks", t_staging_fd_checks, 40000},
	{"lowp_roundtrip_adam_slice", t_lowp_roundtrip_adam_slice, 60000},
	{"lowp_roundtrip_sgd_bucket", t_lowp_roundtrip_sgd_bucket, 60000},
	{"lowp_replan_adam_slice_ids", t_lowp_replan_adam_slice_ids, 120000},
	{"lowp_replan_sgd_bucket_position", t_lowp_replan_sgd_bucket_position, 120000},
	{"lowp_import_without_master", t_lowp_import_without_master, 90000},
	{"lowp_master_sets_params", t_lowp_master_sets_params, 60000},
	{"no_name_in_dev_shm", t_no_name_in_dev_shm, 90000},
};

int main(int argc, char **argv)
{
	/* TEST_STATE_NODES=1: the cases over several zerods (they need gloo) */
	if (getenv("TEST_STATE_NODES"))
		return zd_test_main(&daemon_, NULL, node_cases,
				    sizeof(node_cases) / sizeof(node_cases[0]), argc, argv);
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
