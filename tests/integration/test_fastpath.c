/*
 * test_fastpath.c — the fast path against a real zerod: it is in use by
 * default, the order of ring and ZeroMQ holds where futures can tell, and a
 * client that writes garbage into its ring (a head past the ring, a torn
 * slot, a tail the daemon never gave, a bucket that does not exist) gets a
 * named error while the background job "bg" trains on to the reference
 * parameters. Attaching a ring is refused to a process that did not say
 * Hello, to a wrong token and to memory that is not sealed.
 *
 * A trainer reaches its own ring the raw way: its mapping in
 * /proc/self/maps (memfd "zerod-ring") and its doorbell, the socket whose
 * peer is <socket>.fd. With ZEROD_FASTPATH=0 (the zeromq variant of this
 * suite) the ring cases skip and the rest must hold over ZeroMQ alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "ring.h"
#include "testlib.h"
#include "trainer.h"
#include "wire.h"
#include "zctest.h"

static struct zd daemon_;
static bool ring_off; /* ZEROD_FASTPATH=0 */

static const struct zc_param_group group = {GROUP_SIZE, .lr = 0.5};
static const struct zc_segment segs[2][1] = {{SEG(0, 64, 0)}, {SEG(0, 32, 0)}};
static const struct zc_bucket buckets[2] = {BUCKET(64, 1, segs[0]), BUCKET(32, 1, segs[1])};
static const struct zc_plan plan1 =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &group, 1, buckets);
static const struct zc_plan plan2 =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &group, 2, buckets);

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		printf("# " __VA_ARGS__);                                                          \
		printf("\n");                                                                      \
		return 1;                                                                          \
	} while (0)

static zc_client *join(const char *job, uint32_t rank, uint32_t world, const struct zc_plan *p)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, world);
	zc_client *c = NULL;
	int r = zc_connect(&cfg, &c);

	if (r >= 0)
		r = zc_alloc_buffers(c, p);
	if (r >= 0)
		r = zc_register_plan(c);
	if (r < 0) {
		printf("# %s rank %u: join: %s %s\n", job, rank, zc_strerror_name(r),
		       zc_error_message());
		zc_close(c);
		return NULL;
	}
	return c;
}

/* One whole iteration; the step's result (1 done). */
static int iterate(zc_client *c, uint32_t nbuckets)
{
	uint64_t it = zc_iteration(c);
	zc_future *step = NULL;
	int r = 0;

	for (uint32_t b = 0; b < nbuckets && r >= 0; b++)
		r = zc_bucket_ready(c, b, NULL);
	if (r >= 0)
		r = zc_step_future(c, it, &step);
	if (r >= 0)
		r = zc_future_wait(step, test_timeout(20000));
	zc_future_free(step);
	return r;
}

/* ---- raw access to this process's own ring ---- */

static struct ring_shared *find_ring(void)
{
	char line[512];
	struct ring_shared *mem = NULL;
	FILE *f = fopen("/proc/self/maps", "re");

	while (f && !mem && fgets(line, sizeof(line), f)) {
		unsigned long lo;
		if (strstr(line, "memfd:zerod-ring") && sscanf(line, "%lx-", &lo) == 1)
			mem = (struct ring_shared *)lo;
	}
	if (f)
		fclose(f);
	return mem;
}

/* The socket whose peer is zerod's <socket>.fd: this client's doorbell. */
static int find_doorbell(void)
{
	char want[sizeof(daemon_.sock) + 4];

	snprintf(want, sizeof(want), "%s.fd", daemon_.sock);
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_un sa;
		socklen_t len = sizeof(sa);
		if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_family == AF_UNIX &&
		    strcmp(sa.sun_path, want) == 0)
			return fd;
	}
	return -1;
}

/* ---- the background job ---- */

/* Cases run in processes of their own: what the last case needs of the
 * first lives in memory they share (set up in main()). */
static struct bg_job *bg;

static void t_background_job_starts(void)
{
	bg_job_start(bg, &(struct train_spec){
		.socket = daemon_.sock,
		.job = "bg",
		.world = 2,
		.optimizer = ZC_OPT_ADAM,
		.shard_mode = ZC_SHARD_SLICE,
		.step_mode = ZC_STEP_INTERLEAVED,
		.iters = 100000,
		.seed = 7,
		.hyper_iter = 5,
		.sleep_us = 2000,
	});
}

/* ---- the ring is in use, or not ---- */

static int in_use_child(void *arg, int idx)
{
	zc_client *c = join("in-use", 0, 1, &plan2);
	struct ring_shared *mem;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	for (int i = 0; i < 3; i++)
		if (iterate(c, 2) != 1)
			FAIL("iteration %d did not complete", i);
	mem = find_ring();
	if (ring_off && mem)
		FAIL("ZEROD_FASTPATH=0, yet a ring is mapped");
	if (!ring_off) {
		if (!mem || find_doorbell() < 0)
			FAIL("no ring (%p) or no doorbell: the fast path is not in use", (void *)mem);
		/* 3 iterations of 2 buckets went through it, after the MARK
		 * that orders them behind RegisterPlan, and zerod took all */
		if (atomic_load(&mem->up.head) != 7 || atomic_load(&mem->up.tail) != 7)
			FAIL("up ring head %u tail %u, want 7 and 7", atomic_load(&mem->up.head),
			     atomic_load(&mem->up.tail));
	}
	/* 3 steps of lr 0.5 on gradient 0: the parameters did not move */
	for (uint32_t i = 0; i < 64; i++)
		if (zc_param_buffer(c, 0)[i] != 0.0f)
			FAIL("param[%u] = %g", i, zc_param_buffer(c, 0)[i]);
	zc_close(c);
	return 0;
}

static void t_fast_path_in_use(void)
{
	CHECK(wait_child(spawn(in_use_child, NULL, 0), 30000) == 0,
	      ring_off ? "ZeroMQ alone did not serve a job" : "the fast path did not serve a job");
}

/* ---- a client that never has to sleep ---- */

/*
 * A trainer that polls its step future (zc_future_poll) finds every
 * completion already in the ring and never sleeps; it must still free the
 * ring's slots for zerod, or after down_slots / 2 iterations zerod finds the
 * ring full and drops it as a client that does not read. 4 rings' worth of
 * iterations must complete.
 */
static int poller_child(void *arg, int idx)
{
	zc_client *c = join("poller", 0, 1, &plan1);
	struct ring_shared *mem;
	uint32_t n;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	mem = find_ring();
	if (!mem)
		FAIL("no ring");
	n = 4 * mem->down_slots;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t it = zc_iteration(c);
		zc_future *step = NULL;
		int64_t end = test_ms() + test_timeout(20000);
		int r = zc_bucket_ready(c, 0, NULL);

		if (r >= 0)
			r = zc_step_future(c, it, &step);
		while (r >= 0 && (r = zc_future_poll(step)) == 0 && test_ms() < end)
			;
		zc_future_free(step);
		if (r != 1)
			FAIL("iteration %u of %u: %s: %s", i, n, zc_strerror_name(r),
			     zc_error_message());
	}
	zc_close(c);
	return 0;
}

static void t_poller_frees_the_ring(void)
{
	if (ring_off)
		SKIP("ZEROD_FASTPATH=0: no ring");
	CHECK(wait_child(spawn(poller_child, NULL, 0), 60000) == 0, "the poller");
}

/* ---- garbage in the ring ---- */

enum garbage { HEAD_PAST_RING, TORN_SLOT, DOWN_TAIL, BAD_BUCKET };

static const struct {
	const char *job;
	int code;
	const char *needle;
} garbage_want[] = {
	[HEAD_PAST_RING] = {"g-head", ZC_EPROTO, "slots past the tail"},
	[TORN_SLOT] = {"g-slot", ZC_EPROTO, "torn head"},
	[DOWN_TAIL] = {"g-tail", ZC_EPROTO, "its tail"},
	[BAD_BUCKET] = {"g-bucket", ZC_EBUCKET, "bucket 7 does not exist"},
};

static int garbage_child(void *arg, int kind)
{
	zc_client *c = join(garbage_want[kind].job, 0, 1, &plan1);
	struct ring_slot *slots;
	struct ring_shared *mem;
	zc_future *step = NULL;
	uint32_t tail;
	int bell, r;

	(void)arg;
	if (!c)
		return 1;
	if (iterate(c, 1) != 1)
		FAIL("the first iteration failed");
	/* the client tells zerod its down tail when it has read something,
	 * here once and for all: no later write undoes the garbage */
	if (zc_dispatch(c) < 0)
		FAIL("dispatch");
	mem = find_ring();
	bell = find_doorbell();
	if (!mem || bell < 0)
		FAIL("cannot find the ring (%p) or its doorbell (%d)", (void *)mem, bell);
	slots = ring_up_slots(mem);
	tail = atomic_load(&mem->up.tail);
	switch (kind) {
	case HEAD_PAST_RING: /* a huge count */
		atomic_store(&mem->up.head, tail + 0x40000000u);
		break;
	case TORN_SLOT: /* head moved, the slot never written */
		slots[tail % mem->up_slots] = (struct ring_slot){.iteration = 1, .tag = 0xdeadbeef};
		atomic_store(&mem->up.head, tail + 1);
		break;
	case BAD_BUCKET: /* a well-formed slot, a bucket the plan lacks */
		slots[tail % mem->up_slots] = (struct ring_slot){
			.iteration = 1, .bucket = 7, .tag = ring_tag(RING_READY, tail)};
		atomic_store(&mem->up.head, tail + 1);
		break;
	case DOWN_TAIL: /* the daemon finds it when it pushes BucketDone */
		atomic_store(&mem->down.tail, 0xdeadbeefu);
		break;
	}
	if (kind == DOWN_TAIL)
		r = zc_bucket_ready(c, 0, NULL);
	else
		r = send(bell, "", 1, MSG_NOSIGNAL) == 1 ? 0 : -errno;
	if (r < 0)
		FAIL("could not hand the garbage over: %s", zc_strerror_name(r));
	if (zc_step_future(c, 1, &step) < 0)
		FAIL("step future");
	r = zc_future_wait(step, test_timeout(20000));
	printf("# %s -> %s: %s\n", garbage_want[kind].job, r == 1 ? "done" : zc_strerror_name(r),
	       zc_future_message(step));
	if (r != garbage_want[kind].code || !strstr(zc_future_message(step), garbage_want[kind].needle))
		FAIL("%s: got %s \"%s\", want %s naming \"%s\"", garbage_want[kind].job,
		     zc_strerror_name(r), zc_future_message(step),
		     zc_strerror_name(garbage_want[kind].code), garbage_want[kind].needle);
	zc_future_free(step);
	zc_close(c);
	return 0;
}

static void garbage(enum garbage kind)
{
	if (ring_off)
		SKIP("ZEROD_FASTPATH=0: no ring to break");
	CHECK(wait_child(spawn(garbage_child, NULL, kind), 30000) == 0, "%s",
	      garbage_want[kind].job);
	CHECK(zd_alive(&daemon_), "zerod died");
}

static void t_head_past_ring(void)
{
	garbage(HEAD_PAST_RING);
}

static void t_torn_slot(void)
{
	garbage(TORN_SLOT);
}

static void t_down_tail(void)
{
	garbage(DOWN_TAIL);
}

static void t_bad_bucket(void)
{
	garbage(BAD_BUCKET);
}

/* ---- attaching: who, with what ---- */

struct raw {
	void *ctx, *sock;
	char path[128];
	uint64_t token;
};

/* Hello on a raw DEALER; the fast-path offer of HelloOk into r. */
static int raw_hello(struct raw *r, const char *job)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT, *rep = NULL;
	Zerod__V1__Hello h = ZEROD__V1__HELLO__INIT;
	char ep[256];
	int zero = 0, tmo = 10000;
	zmq_msg_t m;

	r->ctx = zmq_ctx_new();
	r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
	zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(r->sock, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
	snprintf(ep, sizeof(ep), "ipc://%s", daemon_.sock);
	if (zmq_connect(r->sock, ep) < 0)
		return -1;
	h.protocol_version = ZC_PROTOCOL_VERSION;
	h.job_id = (char *)job;
	h.world_size = h.local_size = 1;
	h.pid = getpid();
	env.body_case = ZEROD__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	if (wire_send(r->sock, NULL, 0, &env) < 0)
		return -1;
	zmq_msg_init(&m);
	if (zmq_msg_recv(&m, r->sock, 0) < 0 ||
	    wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &rep) < 0 ||
	    rep->body_case != ZEROD__V1__ENVELOPE__BODY_HELLO_OK ||
	    !rep->hello_ok->fastpath_socket || !rep->hello_ok->has_fastpath_token) {
		zmq_msg_close(&m);
		wire_free(rep);
		return -1;
	}
	snprintf(r->path, sizeof(r->path), "%s", rep->hello_ok->fastpath_socket);
	r->token = rep->hello_ok->fastpath_token;
	zmq_msg_close(&m);
	wire_free(rep);
	return 0;
}

static void raw_close(struct raw *r)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__Goodbye g = ZEROD__V1__GOODBYE__INIT;
	int linger = 1000;

	env.body_case = ZEROD__V1__ENVELOPE__BODY_GOODBYE;
	env.goodbye = &g;
	(void)wire_send(r->sock, NULL, 0, &env);
	zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_close(r->sock);
	zmq_ctx_term(r->ctx);
}

/* ATTACH a ring of 16 + 16 slots (sealed or not) with token; the answer's
 * status, its message in msg. */
static int attach(const char *path, uint64_t token, bool sealed, char *msg, size_t msglen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct ring_attach a = {.magic = RING_ATTACH_MAGIC,
				.token = token,
				.zsent = 1,
				.version = RING_VERSION,
				.up_slots = 16,
				.down_slots = 16};
	struct ring_attach_reply rep = {0};
	size_t bytes = ring_bytes(16, 16);
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cbuf = {0};
	struct iovec iov = {.iov_base = &a, .iov_len = sizeof(a)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf.buf,
			    .msg_controllen = sizeof(cbuf.buf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	struct ring_shared *mem;
	int memfd = memfd_create("zerod-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int r = -EIO;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (memfd < 0 || sock < 0 || ftruncate(memfd, (off_t)bytes) < 0)
		goto out;
	if (sealed && fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		goto out;
	mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (mem == MAP_FAILED)
		goto out;
	*mem = (struct ring_shared){.magic = RING_MAGIC, .version = RING_VERSION,
				    .up_slots = 16, .down_slots = 16};
	munmap(mem, bytes);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
	if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    sendmsg(sock, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(a) ||
	    recv(sock, &rep, sizeof(rep), 0) != (ssize_t)sizeof(rep))
		goto out;
	rep.message[sizeof(rep.message) - 1] = 0;
	snprintf(msg, msglen, "%s", rep.message);
	r = rep.status;
out:
	if (memfd >= 0)
		close(memfd);
	if (sock >= 0)
		close(sock);
	return r;
}

static int stranger(void *arg, int idx)
{
	const struct raw *r = arg;
	char msg[256] = "";
	int st = attach(r->path, r->token, true, msg, sizeof(msg));

	(void)idx;
	printf("# another process with the token -> %s: %s\n", zc_strerror_name(st), msg);
	if (st != -EPERM || !strstr(msg, "not the trainer that said Hello"))
		FAIL("another process attached with a stolen token: %s %s", zc_strerror_name(st),
		     msg);
	return 0;
}

static int attach_child(void *arg, int idx)
{
	struct raw r = {0};
	char msg[256] = "";
	int st;

	(void)arg, (void)idx;
	if (raw_hello(&r, "attach") < 0)
		FAIL("no HelloOk with a fast-path offer");
	if (wait_child(spawn(stranger, &r, 0), 10000) != 0)
		return 1;
	st = attach(r.path, r.token ^ 1, true, msg, sizeof(msg));
	if (st != -EPERM || !strstr(msg, "no session has this token"))
		FAIL("a wrong token: %s %s", zc_strerror_name(st), msg);
	st = attach(r.path, r.token, false, msg, sizeof(msg));
	if (st != ZC_EPROTO || !strstr(msg, "sealed"))
		FAIL("unsealed memory: %s %s", zc_strerror_name(st), msg);
	st = attach(r.path, r.token, true, msg, sizeof(msg));
	if (st != 0)
		FAIL("the trainer that said Hello, its token, a sealed ring: %s %s",
		     zc_strerror_name(st), msg);
	raw_close(&r);
	return 0;
}

static void t_attach_checks(void)
{
	if (ring_off)
		SKIP("ZEROD_FASTPATH=0: zerod offers no ring");
	CHECK(wait_child(spawn(attach_child, NULL, 0), 30000) == 0, "attach checks");
}

/* ---- order: each side reads the two channels in the order they were sent ---- */

/*
 * Both ranks of "order" hand over bucket 0, set group 0's lr for the next
 * iteration, each to its own value, then bucket 1, and finish iteration 0.
 * zerod compares the ranks' values when iteration 1 starts (every rank's
 * SetHyper for it came before its bucket 0): rank 0's apply, and rank 1
 * hears ZC_EHYPER. That goes out before BucketDone(1, 0), by ZeroMQ, while
 * the BucketDone goes by the ring: the client must read the refusal first.
 * zc_last_error() reads only what was processed, so right after the bucket
 * future completed it shows whether the refusal was read before it. Each rank
 * exits with what it saw: ORDER_E the refusal by then, ORDER_L only after a
 * zc_dispatch(), ORDER_N none, 1 something went wrong.
 */
enum { ORDER_N = 10, ORDER_E, ORDER_L };

static int hyper_rank(void *arg, int rank)
{
	zc_client *c = join("order", (uint32_t)rank, 2, &plan2);
	struct zc_param_group g = group;
	zc_future *step = NULL, *b0 = NULL;
	int r, seen = 1;

	(void)arg;
	if (!c)
		return 1;
	g.lr = rank ? 0.25 : 0.125;
	if (zc_bucket_ready(c, 0, NULL) < 0 || zc_set_hyper(c, 0, &g) < 0 ||
	    zc_bucket_ready(c, 1, NULL) < 0 || zc_step_future(c, 0, &step) < 0 ||
	    zc_future_wait(step, test_timeout(20000)) != 1 || zc_bucket_ready(c, 0, &b0) < 0)
		FAIL("order rank %d: iteration 0: %s", rank, zc_error_message());
	zc_future_free(step);
	/* both channels delivered by now: a BucketDone read out of its turn
	 * would show */
	usleep(100000);
	r = zc_future_wait(b0, test_timeout(20000));
	if (r != 1)
		FAIL("order rank %d: bucket 0 of iteration 1: %s", rank, zc_strerror_name(r));
	/* what was read by the time the bucket was: nothing processed since */
	r = zc_last_error(c);
	if (r == ZC_EHYPER && strstr(zc_error_message(), "other hyperparameters"))
		seen = ORDER_E;
	else if (r == 0 && zc_dispatch(c) >= 0 && zc_last_error(c) == ZC_EHYPER)
		seen = ORDER_L;
	else if (r == 0)
		seen = ORDER_N;
	printf("# order rank %d: %s (%s: %s)\n", rank,
	       seen == ORDER_E ? "E" : seen == ORDER_L ? "L" : seen == ORDER_N ? "N" : "F",
	       zc_strerror_name(r), zc_error_message());
	if (zc_bucket_ready(c, 1, NULL) < 0 || zc_step_future(c, 1, &step) < 0 ||
	    zc_future_wait(step, test_timeout(20000)) != 1)
		FAIL("order rank %d: iteration 1: %s", rank, zc_error_message());
	zc_future_free(step);
	zc_future_free(b0);
	zc_close(c);
	return seen;
}

static void t_hyper_error_before_bucket(void)
{
	pid_t p[2];
	int st[2];

	for (int r = 0; r < 2; r++)
		p[r] = spawn(hyper_rank, NULL, r);
	for (int r = 0; r < 2; r++)
		st[r] = wait_child(p[r], 30000);
	CHECK(st[0] == ORDER_N && st[1] == ORDER_E,
	      "want rank 0 (whose values apply) not refused and rank 1 refused before its "
	      "bucket completed; got %d and %d (%d: none, %d: before, %d: only after)",
	      st[0], st[1], ORDER_N, ORDER_E, ORDER_L);
}

/*
 * A job of "doomed", a zerod of its own: both ranks finish iteration 0, but
 * rank 0 reads nothing until zerod was stopped (ZC_ESHUTDOWN, then the
 * connection drops). Its StepDone(0) was sent before the error: the step
 * future must complete, and the error must still be the job's.
 */
static struct zd doomed;
static int doomed_pipe[2], gone_pipe[2];

static int doomed_rank(void *arg, int rank)
{
	struct zc_config cfg = test_config(&doomed, "doomed", (uint32_t)rank, 2);
	zc_future *b[2] = {0}, *step = NULL;
	zc_client *c = NULL;
	int r;

	(void)arg;
	if (zc_connect(&cfg, &c) < 0 || zc_alloc_buffers(c, &plan2) < 0 || zc_register_plan(c) < 0)
		FAIL("doomed rank %d: could not join", rank);
	if (rank == 1) {
		/* stays in the job (leaving would end it quietly) until zerod
		 * is gone */
		r = iterate(c, 2);
		signal_pipe(doomed_pipe[1]);
		wait_pipe(gone_pipe[0], 20000);
		zc_close(c);
		if (r != 1)
			FAIL("doomed rank 1: iteration 0: %s", zc_strerror_name(r));
		return 0;
	}
	if (zc_bucket_ready(c, 0, &b[0]) < 0 || zc_bucket_ready(c, 1, &b[1]) < 0 ||
	    zc_step_future(c, 0, &step) < 0)
		FAIL("doomed rank 0: iteration 0");
	if (!wait_pipe(gone_pipe[0], 20000))
		FAIL("doomed rank 0: zerod was not stopped");
	r = zc_future_wait(step, test_timeout(10000));
	if (r != 1)
		FAIL("doomed rank 0: step 0, done before zerod stopped, ended with %s: %s",
		     zc_strerror_name(r), zc_future_message(step));
	if (zc_future_poll(b[0]) != 1 || zc_future_poll(b[1]) != 1)
		FAIL("doomed rank 0: bucket futures of iteration 0 not done");
	/* the error came after the StepDone: process what arrived */
	if (zc_dispatch(c) < 0 || (r = zc_last_error(c)) != ZC_ESHUTDOWN)
		FAIL("doomed rank 0: the job's error is %s, want ZC_ESHUTDOWN",
		     zc_strerror_name(r));
	zc_future_free(step);
	zc_future_free(b[0]);
	zc_future_free(b[1]);
	zc_close(c);
	return 0;
}

static void t_step_before_shutdown_error(void)
{
	pid_t p0, p1;

	REQUIRE(zd_start(&doomed, NULL) == 0, "a second zerod");
	REQUIRE(pipe(doomed_pipe) == 0 && pipe(gone_pipe) == 0, "pipe");
	p0 = spawn(doomed_rank, NULL, 0);
	p1 = spawn(doomed_rank, NULL, 1);
	CHECK(wait_pipe(doomed_pipe[0], 20000), "rank 1 did not finish iteration 0");
	CHECK(zd_stop(&doomed, 10000) == 0, "the second zerod did not stop cleanly");
	signal_pipe(gone_pipe[1]);
	signal_pipe(gone_pipe[1]);
	CHECK(wait_child(p1, 20000) == 0, "rank 1 failed");
	CHECK(wait_child(p0, 30000) == 0, "rank 0 saw the error overtake its StepDone");
}

/* ---- the background job trained through all of it ---- */

static void t_background_job_unharmed(void)
{
	bg_job_finish(bg);
	CHECK(zd_alive(&daemon_), "zerod died");
}

static void t_daemon_stops_cleanly(void)
{
	int st = zd_stop(&daemon_, 10000);

	CHECK(st == 0, "zerod exited with %d after SIGTERM", st);
}

static const struct test_case cases[] = {
	{"background_job_starts", t_background_job_starts},
	{"fast_path_in_use", t_fast_path_in_use},
	{"poller_that_never_sleeps_frees_the_ring", t_poller_frees_the_ring},
	{"garbage_head_past_ring_EPROTO", t_head_past_ring},
	{"garbage_torn_slot_EPROTO", t_torn_slot},
	{"garbage_down_tail_EPROTO", t_down_tail},
	{"garbage_bad_bucket_EBUCKET", t_bad_bucket},
	{"attach_only_by_its_trainer", t_attach_checks},
	{"hyper_refusal_read_before_the_next_bucket", t_hyper_error_before_bucket},
	{"step_read_before_the_shutdown_error", t_step_before_shutdown_error},
	{"background_job_unharmed", t_background_job_unharmed},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	const char *env = getenv("ZEROD_FASTPATH");

	ring_off = env && strcmp(env, "0") == 0;
	bg = bg_job_new();
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
