/*
 * test_buffers.c — caller-owned buffers (zc_register_buffers) against a real
 * zerod: memfds the trainer created and mapped itself train, and the
 * daemon's updates land in the trainer's own mapping; zc_alloc_buffers()
 * leaves no name in /dev/shm and nothing is mapped from there, neither in
 * the trainer nor in zerod; a trainer of another user than zerod's trains
 * through the two sockets' group. Memory that is not a sealed memfd of the
 * trainer's own user, large enough, is refused with ZC_EBUFFER naming what
 * is wrong (a file in /tmp, a pipe, a /dev/shm object, an unsealed memfd,
 * one too small, a misaligned offset, overlapping buffers, a write-sealed
 * memfd, another user's memfd), the refused trainer can then pass good
 * buffers and train, and the background job "bg" trains on to the
 * reference parameters through all of it. Run twice: as is and with
 * ZEROD_FASTPATH=0 (the fd socket serves buffers with the ring off).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "testlib.h"
#include "trainer.h"
#include "zctest.h"

static struct zd daemon_;

#define N0    1000
#define N1    3000
#define NUMEL (N0 + N1)
/* zc_plan_buffer_bytes(): each bucket padded to 16 elements (64 bytes) */
#define BYTES     ((size_t)(1008 + 3008) * sizeof(float))
#define OTHER_UID 65534 /* nobody: needs no passwd entry to switch to */

static const struct zc_param_group group = {GROUP_SIZE, .lr = 0.5};
static const struct zc_segment segs[2][1] = {{SEG(0, N0, 0)}, {SEG(0, N1, 0)}};
static const struct zc_bucket buckets[2] = {BUCKET(N0, 1, segs[0]), BUCKET(N1, 1, segs[1])};
static const struct zc_plan plan =
	PLAN(ZC_OPT_SGD, ZC_SHARD_BUCKET, ZC_STEP_INTERLEAVED, 1, &group, 2, buckets);

static size_t page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static size_t round_page(size_t n)
{
	return (n + page() - 1) / page() * page();
}

/* A memfd of `bytes` with `seals` added (0: none). */
static int make_memfd(size_t bytes, unsigned seals)
{
	int fd = memfd_create("test-buffers", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
	    (seals && fcntl(fd, F_ADD_SEALS, seals) < 0)) {
		printf("# memfd: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static zc_client *connect_c(const char *job, uint32_t rank, uint32_t world)
{
	struct zc_config cfg = test_config(&daemon_, job, rank, world);
	zc_client *c = NULL;
	int r = zc_connect(&cfg, &c);

	EXPECT(r == 0, "zc_connect %s rank %u: %s: %s", job, rank, zc_strerror_name(r),
	       zc_error_message());
	return r == 0 ? c : NULL;
}

/* One iteration: every gradient `g`, written through grad, then the step. */
static int iterate(zc_client *c, float *grad, float g)
{
	zc_future *step = NULL;
	uint64_t it = zc_iteration(c);
	int r;

	for (size_t i = 0; i < BYTES / sizeof(float); i++)
		grad[i] = g;
	for (uint32_t b = 0; b < 2; b++) {
		r = zc_bucket_ready(c, b, NULL);
		if (r < 0)
			return r;
	}
	r = zc_step_future(c, it, &step);
	if (r == 0)
		r = zc_future_wait(step, test_timeout(10000));
	if (r != 1)
		printf("# step %llu: %s: %s\n", (unsigned long long)it, zc_strerror_name(r),
		       r < 0 ? zc_future_message(step) : "timed out");
	zc_future_free(step);
	return r == 1 ? 0 : -1;
}

/* Element e of the plan (bucket 0's, then bucket 1's) in a mapping of a
 * buffer, where the library says each bucket starts. */
static float *elem(zc_client *c, float *base, size_t e)
{
	size_t b = e < N0 ? 0 : 1,
	       at = (size_t)(zc_param_buffer(c, (uint32_t)b) - zc_param_buffer(c, 0));

	return base + at + (b ? e - N0 : e);
}

/* ---- the background job ---- */

static struct bg_job *bg;

static void t_background_job_starts(void)
{
	bg_job_start(bg, &(struct train_spec){
		.socket = daemon_.sock,
		.job = "bg",
		.world = 2,
		.optimizer = ZC_OPT_ADAMW,
		.shard_mode = ZC_SHARD_SLICE,
		.step_mode = ZC_STEP_AT_END,
		.iters = 100000,
		.seed = 11,
		.hyper_iter = 5,
		.sleep_us = 2000,
	});
}

/* ---- memory the trainer owns ---- */

/*
 * Rank 0 passes two memfds (the parameters two pages into theirs), rank 1
 * one memfd holding both; each maps them itself, closes the fds once
 * registered, and reads and writes only through its own mappings. Rank 1's
 * parameters start at 0 and must arrive at rank 0's 1.0; 4 steps of SGD
 * (lr 0.5) on the average of 0.125 and 0.375 end at exactly 0.5.
 */
static int owned_rank(void *arg, int idx)
{
	zc_client *c = connect_c("owned", (uint32_t)idx, 2);
	struct zc_buffers b = ZC_BUFFERS_INIT;
	float *grad = MAP_FAILED, *param = MAP_FAILED;
	int r;

	(void)arg;
	if (!c)
		return 1;
	if (idx == 0) {
		b.grad_fd = make_memfd(BYTES, F_SEAL_SHRINK);
		b.param_fd = make_memfd(2 * page() + BYTES, F_SEAL_SHRINK);
		b.param_offset = 2 * page();
	} else {
		b.grad_fd = b.param_fd =
			make_memfd(2 * round_page(BYTES), F_SEAL_SHRINK | F_SEAL_GROW);
		b.param_offset = round_page(BYTES);
	}
	EXPECT(b.grad_fd >= 0 && b.param_fd >= 0, "memfds");
	if (b.grad_fd >= 0 && b.param_fd >= 0) {
		grad = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, b.grad_fd,
			    (off_t)b.grad_offset);
		param = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, b.param_fd,
			     (off_t)b.param_offset);
	}
	EXPECT(grad != MAP_FAILED && param != MAP_FAILED, "mmap: %s", strerror(errno));
	if (grad == MAP_FAILED || param == MAP_FAILED) {
		zc_close(c);
		return 1;
	}
	for (size_t i = 0; i < BYTES / sizeof(float); i++)
		param[i] = idx == 0 ? 1.0f : 0.0f;
	r = zc_register_buffers(c, &plan, &b);
	EXPECT(r == 0, "zc_register_buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	/* the fds are the caller's to close: the mappings keep the memory */
	close(b.grad_fd);
	if (b.param_fd != b.grad_fd)
		close(b.param_fd);
	if (r == 0) {
		EXPECT(zc_param_buffer(c, 0)[0] == param[0], "the library's view differs");
		r = zc_register_plan(c);
		EXPECT(r == 0, "zc_register_plan: %s: %s", zc_strerror_name(r), zc_error_message());
	}
	if (r == 0) {
		for (size_t i = 0; i < NUMEL && child_bad == 0; i++)
			EXPECT(*elem(c, param, i) == 1.0f,
			       "element %zu = %g after registering: not rank 0's", i,
			       *elem(c, param, i));
		for (int it = 0; it < 4 && r == 0; it++)
			r = iterate(c, grad, idx == 0 ? 0.125f : 0.375f);
		EXPECT(r == 0, "the job did not train");
		for (size_t i = 0; i < NUMEL && child_bad == 0; i++)
			EXPECT(*elem(c, param, i) == 0.5f,
			       "element %zu = %.9g in the trainer's own mapping, want 0.5", i,
			       *elem(c, param, i));
		EXPECT(zc_param_buffer(c, 1)[N1 - 1] == 0.5f, "the library's view: %g",
		       zc_param_buffer(c, 1)[N1 - 1]);
	}
	zc_close(c);
	/* the memory outlives the client: it is the caller's */
	EXPECT(r != 0 || param[N1] == 0.5f, "param[%d] = %g after zc_close", N1, param[N1]);
	munmap(grad, BYTES);
	munmap(param, BYTES);
	return child_bad;
}

static void t_owned_buffers_train(void)
{
	pid_t p[2];

	for (int i = 0; i < 2; i++)
		p[i] = spawn(owned_rank, NULL, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(p[i], 30000) == 0, "rank %d", i);
}

/* ---- bad memory: ZC_EBUFFER, then good memory trains ---- */

enum bad {
	NOT_MEMFD_FILE,
	NOT_MEMFD_PIPE,
	DEV_SHM,
	UNSEALED,
	TOO_SMALL,
	MISALIGNED,
	OVERLAP,
	WRITE_SEALED,
	OTHER_USER
};

static const struct {
	const char *job, *what, *needle;
} bads[] = {
	[NOT_MEMFD_FILE] = {"bad-file", "a file in /tmp", "is not a memfd"},
	[NOT_MEMFD_PIPE] = {"bad-pipe", "a pipe", "is not a memfd"},
	[DEV_SHM] = {"bad-devshm", "a /dev/shm object", "is not sealed against shrinking"},
	[UNSEALED] = {"bad-unsealed", "an unsealed memfd", "is not sealed against shrinking"},
	[TOO_SMALL] = {"bad-small", "a memfd too small", "is too small"},
	[MISALIGNED] = {"bad-offset", "an offset inside a page", "multiple of the page size"},
	[OVERLAP] = {"bad-overlap", "overlapping buffers", "overlap in one memfd"},
	[WRITE_SEALED] = {"bad-wseal", "a write-sealed memfd", "mmap"},
	[OTHER_USER] = {"bad-user", "another user's memfd", "another user's buffer (uid 65534)"},
};

/* A sealed memfd made by uid OTHER_UID (a child that switched to it), passed
 * back over a socketpair: -1 if none. */
static int foreign_memfd(size_t bytes)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cbuf;
	char byte = 0;
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf.buf,
			    .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm;
	int sp[2], fd = -1;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) < 0 || setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
			_exit(1);
		fd = make_memfd(bytes, F_SEAL_SHRINK);
		if (fd < 0)
			_exit(1);
		memset(cbuf.buf, 0, sizeof(cbuf.buf));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		_exit(sendmsg(sp[1], &mh, 0) == 1 ? 0 : 1);
	}
	close(sp[1]);
	if (pid > 0 && recvmsg(sp[0], &mh, MSG_CMSG_CLOEXEC) == 1 && (cm = CMSG_FIRSTHDR(&mh)) &&
	    cm->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	close(sp[0]);
	if (pid > 0)
		wait_child(pid, 10000);
	return fd;
}

/* The bad memory of kind k in *b (fds it opened in fds[0..1], -1 if none). */
static void make_bad(enum bad k, struct zc_buffers *b, int fds[2])
{
	char path[256];
	int pfd[2];

	fds[0] = fds[1] = -1;
	switch (k) {
	case NOT_MEMFD_FILE:
		snprintf(path, sizeof(path), "%s/zerod-bufs-XXXXXX", test_tmpdir());
		fds[0] = mkstemp(path);
		if (fds[0] >= 0) {
			unlink(path);
			(void)!ftruncate(fds[0], 2 * (off_t)round_page(BYTES));
		}
		break;
	case NOT_MEMFD_PIPE:
		if (pipe2(pfd, O_CLOEXEC) == 0) {
			fds[0] = pfd[0];
			fds[1] = pfd[1];
		}
		break;
	case DEV_SHM:
		snprintf(path, sizeof(path), "/zerod-test-bufs-%d", (int)getpid());
		fds[0] = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		shm_unlink(path);
		if (fds[0] >= 0)
			(void)!ftruncate(fds[0], 2 * (off_t)round_page(BYTES));
		break;
	case UNSEALED:
		fds[0] = make_memfd(2 * round_page(BYTES), 0);
		break;
	case TOO_SMALL:
		fds[0] = make_memfd(round_page(BYTES) + BYTES / 2, F_SEAL_SHRINK);
		break;
	case MISALIGNED:
	case OVERLAP:
		fds[0] = make_memfd(4 * round_page(BYTES), F_SEAL_SHRINK);
		break;
	case WRITE_SEALED:
		fds[0] = make_memfd(2 * round_page(BYTES), F_SEAL_SHRINK | F_SEAL_WRITE);
		break;
	case OTHER_USER:
		fds[0] = foreign_memfd(2 * round_page(BYTES));
		break;
	}
	b->grad_fd = b->param_fd = fds[0];
	b->grad_offset = 0;
	b->param_offset = round_page(BYTES);
	if (k == MISALIGNED)
		b->param_offset += 100;
	if (k == OVERLAP)
		b->param_offset = page();
}

static int bad_child(void *arg, int idx)
{
	enum bad k = (enum bad)idx;
	zc_client *c = connect_c(bads[k].job, 0, 1);
	struct zc_buffers b = ZC_BUFFERS_INIT;
	int fds[2], r;

	(void)arg;
	if (!c)
		return 1;
	make_bad(k, &b, fds);
	EXPECT(fds[0] >= 0, "could not make %s", bads[k].what);
	r = zc_register_buffers(c, &plan, &b);
	printf("# %s -> %s: %s\n", bads[k].what, zc_strerror_name(r), zc_error_message());
	EXPECT(r == ZC_EBUFFER, "%s: %s, want ZC_EBUFFER", bads[k].what, zc_strerror_name(r));
	EXPECT(strstr(zc_error_message(), bads[k].needle), "the reason does not say \"%s\"",
	       bads[k].needle);
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	/* refused, nothing taken: good memory now trains */
	r = zc_alloc_buffers(c, &plan);
	EXPECT(r == 0, "zc_alloc_buffers after the refusal: %s: %s", zc_strerror_name(r),
	       zc_error_message());
	if (r == 0)
		r = zc_register_plan(c);
	EXPECT(r == 0, "zc_register_plan after the refusal: %s: %s", zc_strerror_name(r),
	       zc_error_message());
	if (r == 0)
		EXPECT(iterate(c, zc_grad_buffer(c, 0), 1.0f) == 0,
		       "no iteration after the refusal");
	zc_close(c);
	return child_bad;
}

static void run_bad(enum bad k)
{
	CHECK(wait_child(spawn(bad_child, NULL, (int)k), 30000) == 0, "%s", bads[k].what);
}

static void t_bad_file(void)
{
	run_bad(NOT_MEMFD_FILE);
}
static void t_bad_pipe(void)
{
	run_bad(NOT_MEMFD_PIPE);
}
static void t_bad_devshm(void)
{
	run_bad(DEV_SHM);
}
static void t_bad_unsealed(void)
{
	run_bad(UNSEALED);
}
static void t_bad_small(void)
{
	run_bad(TOO_SMALL);
}
static void t_bad_offset(void)
{
	run_bad(MISALIGNED);
}
static void t_bad_overlap(void)
{
	run_bad(OVERLAP);
}
static void t_bad_write_sealed(void)
{
	run_bad(WRITE_SEALED);
}

static void t_bad_other_user(void)
{
	if (geteuid() != 0)
		SKIP("not root: cannot make a memfd of another user (tests/unit/test_mem.c checks "
		     "the "
		     "uid check with another owner)");
	run_bad(OTHER_USER);
}

/* ---- the struct and the call ---- */

static int args_child(void *arg, int idx)
{
	zc_client *c = connect_c("args", 0, 1);
	struct zc_buffers b = ZC_BUFFERS_INIT, zero;
	int fd = make_memfd(2 * round_page(BYTES), F_SEAL_SHRINK), r;

	(void)arg, (void)idx;
	if (!c)
		return 1;
	memset(&zero, 0, sizeof(zero));
	{
		uint64_t bytes = 0;
		EXPECT(zc_plan_buffer_bytes(&plan, &bytes) == 0 && bytes == BYTES,
		       "zc_plan_buffer_bytes: %llu, want %zu", (unsigned long long)bytes, BYTES);
	}
	EXPECT(zc_register_buffers(c, &plan, NULL) == -EINVAL, "NULL buffers");
	EXPECT(zc_register_buffers(c, NULL, &b) == -EINVAL, "NULL plan");
	EXPECT(zc_register_buffers(NULL, &plan, &b) == -EINVAL, "NULL client");
	EXPECT(zc_register_buffers(c, &plan, &zero) == -EINVAL, "size 0: %s", zc_error_message());
	EXPECT(zc_register_buffers(c, &plan, &b) == -EBADF, "fd -1: %s", zc_error_message());
	b.grad_fd = b.param_fd = fd;
	b.param_offset = round_page(BYTES);
	b.reserved = 1;
	EXPECT(zc_register_buffers(c, &plan, &b) == -E2BIG, "reserved set: %s", zc_error_message());
	b.reserved = 0;
	{
		/* a newer caller's struct, setting a field this library lacks */
		struct {
			struct zc_buffers b;
			uint64_t newer;
		} big = {b, 1};
		big.b.size = sizeof(big);
		EXPECT(zc_register_buffers(c, &plan, &big.b) == -E2BIG, "a newer struct: %s",
		       zc_error_message());
		big.newer = 0;
		big.b.size = 4096 + 8;
		EXPECT(zc_register_buffers(c, &plan, &big.b) == -E2BIG, "size over 4096");
	}
	r = zc_register_buffers(c, &plan, &b);
	EXPECT(r == 0, "good buffers: %s: %s", zc_strerror_name(r), zc_error_message());
	EXPECT(zc_register_buffers(c, &plan, &b) == ZC_ESTATE, "twice: %s", zc_error_message());
	EXPECT(zc_alloc_buffers(c, &plan) == ZC_ESTATE, "alloc after: %s", zc_error_message());
	close(fd);
	EXPECT(zc_buffers_init(&zero, sizeof(zero)) == 0 && zero.size == sizeof(zero) &&
		       zero.grad_fd == -1 && zero.param_fd == -1,
	       "zc_buffers_init");
	zc_close(c);
	return child_bad;
}

static void t_args(void)
{
	CHECK(wait_child(spawn(args_child, NULL, 0), 30000) == 0, "zc_register_buffers' arguments");
}

/* ---- RegisterPlan over the wire ---- */

/* A RegisterPlan naming buffers never passed (an unknown serial), or naming
 * none, or both kinds: refused with a reason, the session stays usable. */
static int raw_child(void *arg, int idx)
{
	Zerod__V1__FdBuffers fds = ZEROD__V1__FD_BUFFERS__INIT;
	struct raw_reg g;
	struct raw r;

	(void)arg, (void)idx;
	if (raw_open(&r, daemon_.sock, 0) < 0 || raw_reg_init(&g, "bufs") < 0)
		return 1;
	raw_hello(&r, "raw-bufs");
	fds.serial = 12345;
	g.rp.shm = NULL;
	g.rp.fds = &fds;
	raw_send(&r, &g.env);
	raw_expect_error(&r, ZC_EBUFFER, "no buffers 12345 were passed", "unknown serial");
	g.rp.fds = NULL;
	raw_send(&r, &g.env);
	raw_expect_error(&r, ZC_EPROTO, "shm or fds", "no buffers named");
	g.rp.shm = &g.shm;
	g.rp.fds = &fds;
	raw_send(&r, &g.env);
	raw_expect_error(&r, ZC_EPROTO, "shm or fds", "both kinds named");
	/* an older client's shm names still register */
	g.rp.fds = NULL;
	raw_send(&r, &g.env);
	raw_expect_body(&r, ZEROD__V1__ENVELOPE__BODY_PLAN_OK, "shm buffers");
	raw_goodbye(&r);
	raw_reg_free(&g);
	raw_close(&r);
	return child_bad;
}

static void t_raw_register(void)
{
	CHECK(wait_child(spawn(raw_child, NULL, 0), 30000) == 0, "RegisterPlan's buffers");
}

/* ---- no name in /dev/shm ---- */

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

static int noname_child(void *arg, int idx)
{
	const char *job = arg;
	zc_client *c = connect_c(job, (uint32_t)idx, 2);
	int r;

	if (!c)
		return 1;
	r = zc_alloc_buffers(c, &plan);
	EXPECT(r == 0, "zc_alloc_buffers: %s", zc_error_message());
	if (r == 0)
		r = zc_register_plan(c);
	EXPECT(r == 0, "zc_register_plan: %s", zc_error_message());
	if (r == 0) {
		EXPECT(maps_lines(getpid(), "/dev/shm/") == 0, "the trainer maps from /dev/shm");
		EXPECT(maps_lines(getpid(), "memfd:zerod-buffers") >= 1,
		       "the trainer maps no memfd:zerod-buffers");
		EXPECT(maps_lines(daemon_.pid, "/dev/shm/zerod.") == 0, "zerod maps from /dev/shm");
		EXPECT(maps_lines(daemon_.pid, "memfd:zerod-buffers") >= 2,
		       "zerod maps no memfd:zerod-buffers of this job");
		for (int it = 0; it < 3 && r == 0; it++)
			r = iterate(c, zc_grad_buffer(c, 0), 1.0f);
		EXPECT(r == 0, "the job did not train");
	}
	zc_close(c);
	return child_bad;
}

/* Names in /dev/shm holding needle (the job's id: the names an older
 * libzeroclient made held it), printed. Other runs on this machine may add
 * names of their own meanwhile, so only the job's are counted. */
static int shm_names(const char *needle)
{
	DIR *dir = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;

	while (dir && (e = readdir(dir)))
		if (strstr(e->d_name, needle)) {
			printf("# in /dev/shm: %s\n", e->d_name);
			n++;
		}
	if (dir)
		closedir(dir);
	return n;
}

static void t_no_name_in_dev_shm(void)
{
	static char job[64];
	pid_t p[2];

	snprintf(job, sizeof(job), "noname-%d", (int)getpid());
	CHECK(shm_names(job) == 0, "before the run");
	for (int i = 0; i < 2; i++)
		p[i] = spawn(noname_child, job, i);
	for (int i = 0; i < 2; i++)
		CHECK(wait_child(p[i], 30000) == 0, "rank %d", i);
	CHECK(shm_names(job) == 0, "a name of the job is in /dev/shm after its run");
}

/* ---- zerod as another user than the trainers ---- */

static int other_user_child(void *arg, int idx)
{
	zc_client *c;
	int r;

	(void)arg, (void)idx;
	if (setgroups(0, NULL) < 0 || setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0) {
		printf("# cannot become uid %d: %s\n", OTHER_UID, strerror(errno));
		return 1;
	}
	if (!(c = connect_c("other-user", 0, 1)))
		return 1;
	r = zc_alloc_buffers(c, &plan);
	EXPECT(r == 0, "zc_alloc_buffers as uid %d: %s: %s", OTHER_UID, zc_strerror_name(r),
	       zc_error_message());
	if (r == 0) {
		for (size_t i = 0; i < BYTES / sizeof(float); i++)
			zc_param_buffer(c, 0)[i] = 2.0f;
		r = zc_register_plan(c);
		EXPECT(r == 0, "zc_register_plan: %s", zc_error_message());
	}
	if (r == 0) {
		for (int it = 0; it < 2 && r == 0; it++)
			r = iterate(c, zc_grad_buffer(c, 0), 1.0f);
		EXPECT(r == 0, "the job did not train");
		/* two steps of lr 0.5 on gradient 1 */
		EXPECT(zc_param_buffer(c, 1)[7] == 1.0f, "param = %g, want 1",
		       zc_param_buffer(c, 1)[7]);
	}
	zc_close(c);
	return child_bad;
}

static void share_sockets(bool share)
{
	char fdsock[sizeof(daemon_.sock) + 4];

	snprintf(fdsock, sizeof(fdsock), "%s.fd", daemon_.sock);
	CHECK(chmod(daemon_.dir, share ? 0711 : 0700) == 0, "chmod %s", daemon_.dir);
	CHECK(chown(daemon_.sock, 0, share ? OTHER_UID : 0) == 0, "chown %s", daemon_.sock);
	CHECK(chown(fdsock, 0, share ? OTHER_UID : 0) == 0, "chown %s", fdsock);
}

static void t_trainer_of_another_user(void)
{
	if (geteuid() != 0)
		SKIP("not root: cannot run a trainer as another user than zerod");
	share_sockets(true);
	CHECK(wait_child(spawn(other_user_child, NULL, 0), 30000) == 0,
	      "a trainer of uid %d did not train with zerod as uid 0", OTHER_UID);
	share_sockets(false);
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
	{"caller_owned_memfds_train", t_owned_buffers_train},
	{"file_in_tmp_EBUFFER", t_bad_file},
	{"pipe_EBUFFER", t_bad_pipe},
	{"dev_shm_object_EBUFFER", t_bad_devshm},
	{"unsealed_memfd_EBUFFER", t_bad_unsealed},
	{"memfd_too_small_EBUFFER", t_bad_small},
	{"misaligned_offset_EBUFFER", t_bad_offset},
	{"overlapping_buffers_EBUFFER", t_bad_overlap},
	{"write_sealed_memfd_EBUFFER", t_bad_write_sealed},
	{"another_users_memfd_EBUFFER", t_bad_other_user},
	{"register_buffers_arguments", t_args},
	{"register_plan_names_its_buffers", t_raw_register},
	{"no_name_in_dev_shm", t_no_name_in_dev_shm},
	{"trainer_of_another_user_trains", t_trainer_of_another_user},
	{"background_job_unharmed", t_background_job_unharmed},
	{"daemon_stops_cleanly", t_daemon_stops_cleanly},
};

int main(int argc, char **argv)
{
	bg = bg_job_new();
	return zd_test_main(&daemon_, NULL, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
