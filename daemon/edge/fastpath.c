/*
 * fastpath.c — the fast path: per-client shared rings and doorbells for
 * BucketReady (client -> daemon) and BucketDone / StepDone (daemon ->
 * client). It owns the listening socket <socket>.fd, the connections on it,
 * and each session's ring mapping. ZeroMQ keeps everything else and stays
 * the fallback: a session without a ring is served exactly as before.
 *
 * The socket also takes a trainer's gradient and parameter buffers (memfds,
 * daemon/edge/fdbufs.c) on connections of their own, so it is served even when
 * the rings are off (ZEROD_FASTPATH=0): then a ring is refused, and ZeroMQ
 * carries the hot path.
 *
 * Setting up. HelloOk offers a 64-bit random token and the socket's path. The
 * client creates a memfd sealed against shrinking (so its pages cannot
 * vanish under us: no SIGBUS), lays out common/ring.h in it, connects to the
 * socket (SOCK_SEQPACKET) and sends ATTACH with the memfd in SCM_RIGHTS. The
 * connection must come from the process and user that said Hello
 * (SO_PEERCRED against the session's), carry its token, and arrive before it
 * registers its plan; the memfd must be a sealed regular file of exactly the
 * size the ring sizes imply. The answer goes back on the same connection,
 * which then stays open as the session's doorbell, both ways: one 1-byte
 * packet rings the other side.
 *
 * Connections that sent nothing yet are bounded (PENDING_*): per process,
 * per user (SO_PEERCRED), in all, and in time. One past its share is told
 * why (FDREFUSED, common/bufwire.h) and closed, so a member of the
 * socket's group holding connections open blocks its own user at worst.
 *
 * Why a socket and not eventfds: O_NONBLOCK of an eventfd belongs to its open
 * file description, which SCM_RIGHTS shares, so a client could turn the
 * daemon's copy blocking and stop the loop thread in a read or write. Each
 * end of a socket is its own description, and MSG_DONTWAIT is per call.
 *
 * Hot path. The doorbell wakes the loop; it takes every slot the client
 * published (at most two rings' worth per wake-up; more waits for a kick,
 * a daemon-private eventfd), hands each READY to sched_bucket_ready(), then
 * sets `waiting` and looks once more before it sleeps. Completions are
 * written into the down ring, and after the batch of completions
 * (fastpath_flush) the client's doorbell rings, once, and only if its
 * `waiting` says it may sleep. A busy pipeline makes no system call.
 *
 * Order. Errors, PlanOk and the rest still go over ZeroMQ, and the two
 * channels must not overtake each other where futures could tell: a fatal
 * Error after a StepDone must not fail that step's future, a SetHyper must
 * be applied before the BucketReady that follows it. Both sides count the
 * ZeroMQ messages of the session (Hello and HelloOk are 1). Before the
 * first slot a side pushes after its k-th ZeroMQ message, it pushes MARK(k);
 * a consumer passes MARK(k) only once it has received message k, and before
 * handling message k it first takes every slot in front of the first MARK
 * >= k. Those slots were published before message k was sent, so they are
 * all there. So each side sees one sequence, in the order it was sent. A
 * side that stops using its ring (ours when the client broke it) sends on
 * ZeroMQ only from then, which keeps that order too. A trainer that exits
 * has its ring read before it is dropped, as its last ZeroMQ messages are.
 *
 * Trust. The client can write any byte of the shared memory at any time.
 * The daemon keeps its own indices and ring sizes, reads each head and tail
 * once, checks it against the ring size, copies each slot before checking
 * it, and bounds the work per wake-up. A client that breaks its ring gets
 * ZC_EPROTO naming what it wrote, fatal to its own job; nothing else sees it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/sched.h"
#include "edge/edge.h"
#include "edge/fastpath.h"
#include "edge/fdbufs.h"
#include "base/log.h"
#include "base/loop.h"
#include "ring.h"
#include "wire.h"

/* Connections that sent nothing yet, at once: in all, of one user, of one
 * process. A trainer has one at a time and sends its record right after it
 * connects, so one that waits this long is not a trainer at work. A user
 * past its share is refused; when all are taken, the oldest of the user
 * holding the most goes, so other users' trainers always get in. */
#define PENDING_MAX        64
#define PENDING_PER_UID    16
#define PENDING_PER_PID    4
#define PENDING_TIMEOUT_MS 2000
#define DOORBELLS_PER_WAKE 64

struct fastpath_listener {
	struct edge *e;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int fd;      /* listening */
	int kick_fd; /* eventfd: some ring has slots left over */
	bool kick_pending;
	bool rings; /* rings are taken (not ZEROD_FASTPATH=0); buffers always are */
	struct fp_conn *pending;
	unsigned npending;
	struct fastpath *owed; /* rings pushed to since the last flush */
	/* The tokens of the last sessions that ended, with why: a trainer
	 * whose job failed just before it offered its buffers or its ring is
	 * told the job's error, not that no session has its token. */
	struct retired {
		uint64_t token;
		int code;
		char why[236]; /* as long as the replies' message */
	} retired[16];
	unsigned nretired; /* written so far (the table wraps) */
	uint64_t refused;  /* connections refused (FDREFUSED) so far */
	int64_t refused_log_ms;
};

/* A connection on <socket>.fd: pending until it attaches, then the
 * session's doorbell. */
struct fp_conn {
	struct fp_conn *next; /* pending list */
	struct fastpath_listener *l;
	int fd;
	struct ucred cred;
	int64_t accepted_ms;
	struct fastpath *fp; /* once attached */
};

struct fastpath {
	struct session *s;
	uint64_t token;
	uint64_t zsent;  /* ZeroMQ messages sent to s */
	uint64_t zrecv;  /* ZeroMQ messages received from s */
	uint64_t zgate;  /* up slots wait until zrecv reaches it (the client's count at attach) */
	uint64_t marked; /* the last MARK pushed on down */
	struct fp_conn *conn;
	struct ring_shared *mem; /* NULL until attached, and once broken */
	size_t bytes;
	uint32_t up_n, down_n;       /* our copies */
	uint32_t up_tail, down_head; /* ours alone */
	bool kicked;                 /* slots left over: drain on the next kick */
	bool owed;                   /* pushed to: look at its `waiting` at the flush */
	struct fastpath *owed_next;
};

enum drain_result { DRAIN_EMPTY, DRAIN_BLOCKED, DRAIN_BUDGET, DRAIN_BROKEN };

_Static_assert(sizeof(struct fdbufs_reply) == sizeof(struct ring_attach_reply) &&
		       offsetof(struct fdbufs_reply, status) ==
			       offsetof(struct ring_attach_reply, status) &&
		       offsetof(struct fdbufs_reply, message) ==
			       offsetof(struct ring_attach_reply, message),
	       "FDREFUSED answers both kinds of connection");

/* ---------------------------------------------------------- helpers --- */

static void conn_close(struct fp_conn *c)
{
	struct fastpath_listener *l = c->l;

	for (struct fp_conn **pp = &l->pending; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			l->npending--;
			break;
		}
	if (c->fp)
		c->fp->conn = NULL;
	loop_remove_fd(l->e->core->loop, c->fd);
	close(c->fd);
	free(c);
}

static void owed_unlink(struct fastpath *fp)
{
	struct fastpath_listener *l = fp->s->e->fpl;

	for (struct fastpath **pp = &l->owed; fp->owed && *pp; pp = &(*pp)->owed_next)
		if (*pp == fp) {
			*pp = fp->owed_next;
			break;
		}
	fp->owed = false;
	fp->owed_next = NULL;
}

/* Stop using the ring: from now on s is served over ZeroMQ alone. */
static void fp_detach(struct fastpath *fp)
{
	owed_unlink(fp);
	if (fp->conn)
		conn_close(fp->conn);
	if (fp->mem)
		munmap(fp->mem, fp->bytes);
	fp->mem = NULL;
	fp->kicked = false;
}

/* The client broke its ring: a named error, fatal to its own job. */
static int fp_break(struct fastpath *fp, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int fp_break(struct fastpath *fp, const char *fmt, ...)
{
	struct session *s = fp->s;
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fp_detach(fp);
	job_fail(s->m.job, ZC_EPROTO, true, "rank %u broke its fast-path ring: %s", s->m.rank, msg);
	return DRAIN_BROKEN;
}

static void fp_kick(struct fastpath *fp)
{
	struct fastpath_listener *l = fp->s->e->fpl;
	uint64_t one = 1;

	fp->kicked = true;
	if (!l->kick_pending)
		(void)!write(l->kick_fd, &one, sizeof(one));
	l->kick_pending = true;
}

/* Ring the client's doorbell. EAGAIN: doorbells wait unread, it wakes
 * anyway; EPIPE: it closed the channel, its Goodbye or its pidfd follows. */
static void fp_ring(struct fastpath *fp)
{
	if (fp->conn)
		(void)!send(fp->conn->fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* ------------------------------------------------------------ up ring --- */

/*
 * Take the client's slots: READY to sched_bucket_ready(), MARK(k) once
 * message k has come (k <= zrecv). Stops when the ring is empty, at a MARK
 * that must wait, or when *budget slots were taken.
 */
static enum drain_result fp_take(struct fastpath *fp, uint64_t zrecv, uint32_t *budget)
{
	struct session *s = fp->s;
	struct ring_slot *slots;
	enum drain_result res = DRAIN_EMPTY;
	uint32_t head, avail;

	if (!fp->mem)
		return DRAIN_BROKEN;
	if (zrecv < fp->zgate)
		return DRAIN_BLOCKED;
	slots = ring_up_slots(fp->mem);
	head = atomic_load_explicit(&fp->mem->up.head, memory_order_acquire);
	avail = head - fp->up_tail;
	if (avail > fp->up_n)
		return fp_break(fp,
				"its head %" PRIu32 " is %" PRIu32 " slots past the tail %" PRIu32
				"; the ring holds %" PRIu32,
				head, avail, fp->up_tail, fp->up_n);
	for (; avail > 0; avail--) {
		uint32_t idx = fp->up_tail;
		/* one copy, checked once: the client may be writing it now */
		struct ring_slot sl = *(volatile struct ring_slot *)&slots[idx & (fp->up_n - 1)];
		uint32_t kind = sl.tag >> 24;

		if ((sl.tag & RING_SEQ_MASK) != (idx & RING_SEQ_MASK) ||
		    (kind != RING_READY && kind != RING_MARK))
			return fp_break(fp,
					"slot %" PRIu32 " holds tag %08" PRIx32
					", not a READY or MARK written for it (a torn head?)",
					idx, sl.tag);
		if (*budget == 0) {
			res = DRAIN_BUDGET;
			break;
		}
		if (kind == RING_MARK && sl.iteration > zrecv) {
			res = DRAIN_BLOCKED;
			break;
		}
		fp->up_tail = idx + 1;
		(*budget)--;
		if (kind == RING_READY)
			sched_bucket_ready(s->m.job, &s->m, sl.iteration, sl.bucket, NULL, 0);
	}
	atomic_store_explicit(&fp->mem->up.tail, fp->up_tail, memory_order_release);
	return res;
}

/* Everything the client published, then sleep: set `waiting` and look once
 * more (a push between our last look and the flag would ring nobody). */
static void fp_drain(struct fastpath *fp)
{
	uint32_t budget = 2 * fp->up_n;

	if (!fp->mem)
		return;
	atomic_store_explicit(&fp->mem->up.waiting, 0, memory_order_relaxed);
	for (;;) {
		enum drain_result r = fp_take(fp, fp->zrecv, &budget);
		uint32_t head;

		if (r == DRAIN_BROKEN)
			return;
		if (r == DRAIN_BUDGET) {
			fp_kick(fp);
			return;
		}
		if (r == DRAIN_BLOCKED)
			return; /* the ZeroMQ message it waits for kicks it on */
		atomic_store_explicit(&fp->mem->up.waiting, 1, memory_order_seq_cst);
		atomic_thread_fence(memory_order_seq_cst);
		head = atomic_load_explicit(&fp->mem->up.head, memory_order_acquire);
		if (head == fp->up_tail)
			return;
		atomic_store_explicit(&fp->mem->up.waiting, 0, memory_order_relaxed);
	}
}

static void on_doorbell(struct fastpath *fp)
{
	struct edge *e = fp->s->e;
	char buf[DOORBELLS_PER_WAKE][8];
	struct iovec iov[DOORBELLS_PER_WAKE];
	struct mmsghdr mm[DOORBELLS_PER_WAKE];
	int n;

	/* every doorbell waiting, in one system call (more wait for the
	 * next wake-up) */
	for (int i = 0; i < DOORBELLS_PER_WAKE; i++) {
		iov[i] = (struct iovec){.iov_base = buf[i], .iov_len = sizeof(buf[i])};
		mm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[i], .msg_iovlen = 1}};
	}
	n = recvmmsg(fp->conn->fd, mm, DOORBELLS_PER_WAKE, MSG_DONTWAIT, NULL);
	if (n < 0 && errno != EAGAIN && errno != EINTR)
		n = 0;
	for (int i = 0; i < n; i++) {
		if (mm[i].msg_len == 0) {
			/* it closed the channel (exiting: Goodbye or its pidfd
			 * ends the session); no ring without doorbells */
			fp_detach(fp);
			return;
		}
		if (mm[i].msg_len != 1 || (mm[i].msg_hdr.msg_flags & MSG_TRUNC)) {
			fp_break(fp, "a %u-byte message on its doorbell, which carries 1-byte ones",
				 mm[i].msg_len);
			session_reap(e);
			return;
		}
	}
	if (n == 0) {
		fp_detach(fp); /* end of file, or the connection failed */
		return;
	}
	fp_drain(fp);
	session_reap(e);
}

static void on_kick(struct loop *loop, void *userdata)
{
	struct fastpath_listener *l = userdata;
	uint64_t n;

	(void)loop;
	(void)!read(l->kick_fd, &n, sizeof(n));
	l->kick_pending = false;
	for (struct session *s = l->e->sessions; s; s = s->next)
		if (s->fp && s->fp->kicked) {
			s->fp->kicked = false;
			fp_drain(s->fp);
		}
	session_reap(l->e);
}

/* ---------------------------------------------------------- down ring --- */

/* Push one completion (after MARK(zsent) if a ZeroMQ message went out since
 * the last slot). -EAGAIN: full; DRAIN_BROKEN's -EPROTO: the client broke it. */
static int fp_push(struct fastpath *fp, enum ring_kind kind, uint64_t it, uint32_t bucket)
{
	struct ring_slot *slots = ring_down_slots(fp->mem, fp->up_n);
	uint32_t tail = atomic_load_explicit(&fp->mem->down.tail, memory_order_acquire);
	uint32_t used = fp->down_head - tail, need = fp->zsent > fp->marked ? 2 : 1;
	uint32_t mask = fp->down_n - 1;

	if (used > fp->down_n) {
		fp_break(fp,
			 "its tail %" PRIu32 " is not within the %" PRIu32
			 " slots before our head %" PRIu32,
			 tail, fp->down_n, fp->down_head);
		return -EPROTO;
	}
	if (fp->down_n - used < need)
		return -EAGAIN;
	if (need == 2) {
		slots[fp->down_head & mask] = (struct ring_slot){
			.iteration = fp->zsent, .tag = ring_tag(RING_MARK, fp->down_head)};
		fp->marked = fp->zsent;
		fp->down_head++;
	}
	slots[fp->down_head & mask] = (struct ring_slot){
		.iteration = it, .bucket = bucket, .tag = ring_tag(kind, fp->down_head)};
	fp->down_head++;
	atomic_store_explicit(&fp->mem->down.head, fp->down_head, memory_order_release);
	if (!fp->owed) {
		struct fastpath_listener *l = fp->s->e->fpl;
		fp->owed = true;
		fp->owed_next = l->owed;
		l->owed = fp;
	}
	return 0;
}

/* The doorbells owed since the last flush, one per client at most: a
 * BucketDone and the StepDone right behind it wake the client once. */
void fastpath_flush(struct edge *e)
{
	struct fastpath_listener *l = e->fpl;

	if (!l)
		return;
	atomic_thread_fence(memory_order_seq_cst); /* our heads, then their flags */
	while (l->owed) {
		struct fastpath *fp = l->owed;
		l->owed = fp->owed_next;
		fp->owed = false;
		fp->owed_next = NULL;
		if (atomic_load_explicit(&fp->mem->down.waiting, memory_order_relaxed) &&
		    atomic_exchange_explicit(&fp->mem->down.waiting, 0, memory_order_seq_cst))
			fp_ring(fp);
	}
}

/* true if the ring took it (or s is done for: broken ring, full ring) */
static bool fp_send(struct session *s, enum ring_kind kind, uint64_t it, uint32_t bucket)
{
	struct fastpath *fp = s->fp;
	int r;

	if (!fp || !fp->mem)
		return false;
	r = fp_push(fp, kind, it, bucket);
	if (r == -EAGAIN && !s->send_failed) {
		/* as a full ZeroMQ queue: it does not read, and a completion
		 * it never gets would hang it */
		log_warning("job %s rank %u: its fast-path ring is full (%" PRIu32
			    " slots): it does not read",
			    s->m.job->id, s->m.rank, fp->down_n);
		s->send_failed = -EAGAIN;
	}
	return true;
}

void fastpath_bucket_done(struct session *s, uint64_t iteration, uint32_t bucket)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__BucketDone bd = ZEROD__V1__BUCKET_DONE__INIT;

	if (fp_send(s, RING_BUCKET_DONE, iteration, bucket))
		return;
	bd.iteration = iteration;
	bd.bucket = bucket;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_BUCKET_DONE;
	env.bucket_done = &bd;
	session_send(s, &env);
}

void fastpath_step_done(struct session *s, uint64_t iteration)
{
	Zerod__V1__Envelope env = ZEROD__V1__ENVELOPE__INIT;
	Zerod__V1__StepDone sd = ZEROD__V1__STEP_DONE__INIT;

	if (fp_send(s, RING_STEP_DONE, iteration, 0))
		return;
	sd.iteration = iteration;
	env.body_case = ZEROD__V1__ENVELOPE__BODY_STEP_DONE;
	env.step_done = &sd;
	session_send(s, &env);
}

/* ------------------------------------------------------- the session --- */

void fastpath_offer(struct session *s, Zerod__V1__HelloOk *ok)
{
	struct fastpath_listener *l = s->e->fpl;
	struct fastpath *fp;

	if (!l || s->fp)
		return;
	fp = calloc(1, sizeof(*fp));
	if (!fp)
		return; /* ZeroMQ alone serves it */
	while (fp->token == 0)
		if (getrandom(&fp->token, sizeof(fp->token), 0) != sizeof(fp->token)) {
			free(fp);
			return;
		}
	fp->s = s;
	fp->zrecv = 1; /* its Hello */
	s->fp = fp;
	ok->fastpath_socket = l->path;
	ok->has_fastpath_token = 1;
	ok->fastpath_token = fp->token;
}

void fastpath_sent(struct session *s)
{
	if (s->fp)
		s->fp->zsent++;
}

void fastpath_received(struct session *s)
{
	struct fastpath *fp = s->fp;
	uint32_t budget;

	if (!fp)
		return;
	/* The slots the client published before it sent this message come
	 * first; those after the next mark wait until it is handled. */
	budget = 2 * fp->up_n;
	if (fp->mem) {
		enum drain_result r = fp_take(fp, fp->zrecv, &budget);
		if (r == DRAIN_BLOCKED || r == DRAIN_BUDGET)
			fp_kick(fp);
	}
	fp->zrecv++;
}

void fastpath_take_last(struct session *s)
{
	if (s->fp)
		fp_drain(s->fp);
}

void fastpath_retire(struct session *s, int code, const char *why)
{
	struct fastpath_listener *l = s->e->fpl;
	struct retired *r;

	if (!s->fp || !l)
		return;
	r = &l->retired[l->nretired++ % ARRAY_SIZE(l->retired)];
	r->token = s->fp->token;
	r->code = code;
	snprintf(r->why, sizeof(r->why), "%s", why);
}

void fastpath_free(struct session *s)
{
	if (!s->fp)
		return;
	fp_detach(s->fp);
	free(s->fp);
	s->fp = NULL;
}

/* ----------------------------------------------------------- attach --- */

static struct session *find_token(struct edge *e, uint64_t token)
{
	for (struct session *s = e->sessions; s; s = s->next)
		if (s->fp && s->fp->token == token)
			return s;
	return NULL;
}

/* Why no session has `token`: the code and reason its session ended with,
 * if it ended lately, else -EPERM (a token zerod never gave). */
static int no_token(const struct fastpath_listener *l, uint64_t token, char *err, size_t errlen)
{
	for (unsigned k = 0; k < ARRAY_SIZE(l->retired) && k < l->nretired; k++)
		if (l->retired[k].token == token) {
			snprintf(err, errlen, "%s", l->retired[k].why);
			return l->retired[k].code;
		}
	snprintf(err, errlen, "no session has this token");
	return -EPERM;
}

/* ATTACH from connection c (n bytes, recvmsg flags, received fds): map the
 * ring into the token's session. 0, or a code with the reason in err. */
static int attach(struct fp_conn *c, const struct ring_attach *a, ssize_t n, int flags,
		  const int *fds, int nfds, char *err, size_t errlen)
{
	struct session *s;
	struct fastpath *fp;
	struct ring_shared *mem;
	struct stat st;
	size_t bytes;
	int seals;

	if (n != (ssize_t)sizeof(*a) || (flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    a->magic != RING_ATTACH_MAGIC) {
		snprintf(err, errlen, "not an ATTACH record (%zd bytes)", n);
		return ZC_EPROTO;
	}
	if (a->version != RING_VERSION) {
		snprintf(err, errlen, "ring version %" PRIu32 ", zerod speaks %u", a->version,
			 RING_VERSION);
		return ZC_EVERSION;
	}
	if (nfds != 1) {
		snprintf(err, errlen, "ATTACH carries %d fds, want 1 (the ring's memfd)", nfds);
		return ZC_EPROTO;
	}
	s = find_token(c->l->e, a->token);
	if (!s)
		return no_token(c->l, a->token, err, errlen);
	fp = s->fp;
	/* the process that said Hello, and no other */
	if (c->cred.pid != s->m.pid || c->cred.uid != s->m.uid) {
		snprintf(err, errlen,
			 "the connection is pid %d uid %u, the session pid %d uid %u: not the "
			 "trainer that said Hello",
			 (int)c->cred.pid, (unsigned)c->cred.uid, (int)s->m.pid,
			 (unsigned)s->m.uid);
		return -EPERM;
	}
	if (!c->l->rings) {
		snprintf(err, errlen, "this zerod runs without the fast path (ZEROD_FASTPATH=0)");
		return ZC_ENOTSUP;
	}
	if (fp->mem || fp->conn) {
		snprintf(err, errlen, "the session has a ring already");
		return ZC_ESTATE;
	}
	if (!job_awaits_plan(s->m.job, s->m.rank)) {
		snprintf(err, errlen, "attach the ring before registering the plan");
		return ZC_ESTATE;
	}
	if (!ring_slots_valid(a->up_slots) || !ring_slots_valid(a->down_slots)) {
		snprintf(err, errlen,
			 "ring sizes %" PRIu32 "/%" PRIu32 ": need powers of two in %u..%u",
			 a->up_slots, a->down_slots, RING_MIN_SLOTS, RING_MAX_SLOTS);
		return ZC_EPROTO;
	}
	/* Without the seal the client could shrink it, and our next read of
	 * the ring would be a SIGBUS. Only a memfd can carry seals, and this
	 * is asked first: fstat() of a file on a hung FUSE mount would block
	 * the loop, F_GET_SEALS of anything but a memfd fails at once. */
	seals = fcntl(fds[0], F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		snprintf(err, errlen, "the ring's memory must be a memfd sealed against shrinking");
		return ZC_EPROTO;
	}
	bytes = ring_bytes(a->up_slots, a->down_slots);
	if (fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != bytes) {
		snprintf(err, errlen, "the ring's memory is not a regular file of %zu bytes",
			 bytes);
		return ZC_EPROTO;
	}
	mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (mem == MAP_FAILED) {
		snprintf(err, errlen, "cannot map the ring: %s", strerror(errno));
		return -errno;
	}
	if (mem->magic != RING_MAGIC || mem->up_slots != a->up_slots ||
	    mem->down_slots != a->down_slots) {
		munmap(mem, bytes);
		snprintf(err, errlen, "the ring's header does not match the ATTACH record");
		return ZC_EPROTO;
	}
	fp->mem = mem;
	fp->bytes = bytes;
	fp->up_n = a->up_slots;
	fp->down_n = a->down_slots;
	fp->up_tail = fp->down_head = 0;
	fp->zgate = a->zsent;
	fp->marked = fp->zsent;
	atomic_store(&mem->up.tail, 0);
	atomic_store(&mem->down.head, 0);
	atomic_store(&mem->up.waiting, 1); /* the first push rings */
	fp->conn = c;
	c->fp = fp;
	return 0;
}

static void pending_unlink(struct fp_conn *c)
{
	struct fastpath_listener *l = c->l;

	for (struct fp_conn **pp = &l->pending; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			l->npending--;
			break;
		}
	c->next = NULL;
}

/* FDBUFS from connection c: the token's session takes the buffers, if it is
 * the process that said Hello. The answer ends the connection. */
static void buffers(struct fp_conn *c, const struct fdbufs_offer *o, ssize_t n, int flags,
		    int *fds, int nfds)
{
	struct fdbufs_reply rep = {.magic = FDBUFS_MAGIC};
	struct session *s = NULL;

	if (n != (ssize_t)sizeof(*o) || (flags & (MSG_TRUNC | MSG_CTRUNC))) {
		rep.status = ZC_EPROTO;
		snprintf(rep.message, sizeof(rep.message), "not an FDBUFS record (%zd bytes)", n);
	} else if (!(s = find_token(c->l->e, o->token))) {
		rep.status = no_token(c->l, o->token, rep.message, sizeof(rep.message));
	} else if (c->cred.pid != s->m.pid || c->cred.uid != s->m.uid) {
		rep.status = -EPERM;
		snprintf(rep.message, sizeof(rep.message),
			 "the connection is pid %d uid %u, the session pid %d uid %u: not the "
			 "trainer that said Hello",
			 (int)c->cred.pid, (unsigned)c->cred.uid, (int)s->m.pid,
			 (unsigned)s->m.uid);
	} else {
		rep.status = fdbufs_offer(s, o, fds, nfds, &rep.serial, rep.message,
					  sizeof(rep.message));
	}
	if (rep.status < 0)
		log_info("buffers: refused those of pid %d: %s: %s", (int)c->cred.pid,
			 zc_strerror_name(rep.status), rep.message);
	(void)!send(c->fd, &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
	conn_close(c);
}

static void on_pending(struct fp_conn *c)
{
	union {
		uint64_t magic;
		struct ring_attach ring;
		struct fdbufs_offer bufs;
	} rec;
	struct ring_attach a;
	struct ring_attach_reply rep = {.magic = RING_ATTACH_MAGIC};
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = {.iov_base = &rec, .iov_len = sizeof(rec)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf)};
	int fds[4], nfds = 0, r;
	ssize_t n;

	memset(&rec, 0, sizeof(rec));
	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t k;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (nfds < (int)ARRAY_SIZE(fds))
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	if (n <= 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		conn_close(c);
		return;
	}
	if (rec.magic == FDBUFS_MAGIC || rec.magic == FDSTAGE_MAGIC) {
		buffers(c, &rec.bufs, n, mh.msg_flags, fds, nfds); /* takes what it keeps */
		for (int i = 0; i < nfds; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		return;
	}
	a = rec.ring;
	r = attach(c, &a, n, mh.msg_flags, fds, nfds, rep.message, sizeof(rep.message));
	for (int i = 0; i < nfds; i++)
		close(fds[i]); /* mapped, if it was any good */
	if (r < 0) {
		rep.status = r;
		log_info("fast path: refused a ring from pid %d: %s: %s", (int)c->cred.pid,
			 zc_strerror_name(r), rep.message);
		(void)!send(c->fd, &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
		conn_close(c);
		return;
	}
	pending_unlink(c);
	rep.zsent = c->fp->zsent;
	/* a fresh connection has room for one small answer */
	if (send(c->fd, &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(rep)) {
		fp_detach(c->fp);
		return;
	}
	log_info("job %s rank %u: fast path attached (%" PRIu32 " + %" PRIu32 " slots)",
		 c->fp->s->m.job->id, c->fp->s->m.rank, c->fp->up_n, c->fp->down_n);
}

static void on_conn(struct loop *loop, void *userdata)
{
	struct fp_conn *c = userdata;

	(void)loop;
	if (c->fp)
		on_doorbell(c->fp);
	else
		on_pending(c);
}

/* Tell the connection on fd why it is not served (FDREFUSED) and close it.
 * What it sent is read first: closing with it unread would reset the
 * connection, and the client would read that before our answer. */
static void refuse(struct fastpath_listener *l, int fd, const struct ucred *cred, int code,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void refuse(struct fastpath_listener *l, int fd, const struct ucred *cred, int code,
		   const char *fmt, ...)
{
	struct fdbufs_reply rep = {.magic = FDREFUSED_MAGIC, .status = code};
	char cbuf[CMSG_SPACE(4 * sizeof(int))], junk[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rep.message, sizeof(rep.message), fmt, ap);
	va_end(ap);
	for (int i = 0; i < 4; i++) {
		struct iovec iov = {.iov_base = junk, .iov_len = sizeof(junk)};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = cbuf,
				    .msg_controllen = sizeof(cbuf)};
		if (recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0)
			break;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
				for (size_t k = 0; k < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				     k++) {
					int rfd;
					memcpy(&rfd, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
					close(rfd);
				}
	}
	(void)!send(fd, &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
	l->refused++;
	if (now_ms() - l->refused_log_ms >= 1000) {
		l->refused_log_ms = now_ms();
		log_warning("fast path: refused a connection of pid %d uid %u: %s: %s (%llu "
			    "refused so far)",
			    (int)cred->pid, (unsigned)cred->uid, zc_strerror_name(code),
			    rep.message, (unsigned long long)l->refused);
	}
}

static void pending_refuse(struct fp_conn *c, int code, const char *why)
{
	refuse(c->l, c->fd, &c->cred, code, "%s", why);
	conn_close(c);
}

/* The pending connection to give up for a new one when all are taken: the
 * oldest of the user holding the most. */
static struct fp_conn *pending_victim(struct fastpath_listener *l)
{
	struct fp_conn *victim = NULL;
	unsigned most = 0;

	for (struct fp_conn *c = l->pending; c; c = c->next) {
		unsigned n = 0;
		for (struct fp_conn *o = l->pending; o; o = o->next)
			n += o->cred.uid == c->cred.uid;
		/* the list is newest first: a later one of as many is older */
		if (n >= most) {
			most = n;
			victim = c;
		}
	}
	return victim;
}

/* A new connection from cred: 0 if it may wait among the pending, else a
 * code with why (the user's or the process's share is taken). */
static int pending_admit(struct fastpath_listener *l, const struct ucred *cred, char *why,
			 size_t len)
{
	unsigned by_uid = 0, by_pid = 0;

	for (struct fp_conn *c = l->pending; c; c = c->next) {
		by_uid += c->cred.uid == cred->uid;
		by_pid += c->cred.pid == cred->pid;
	}
	if (by_pid >= PENDING_PER_PID) {
		snprintf(why, len,
			 "process %d holds %u connections to this socket that sent nothing yet "
			 "(at most %d): refused",
			 (int)cred->pid, by_pid, PENDING_PER_PID);
		return ZC_ELIMIT;
	}
	if (by_uid >= PENDING_PER_UID) {
		snprintf(why, len,
			 "uid %u holds %u connections to this socket that sent nothing yet "
			 "(at most %d per user; some process of that user holds them open): "
			 "refused",
			 (unsigned)cred->uid, by_uid, PENDING_PER_UID);
		return ZC_ELIMIT;
	}
	if (l->npending >= PENDING_MAX) {
		struct fp_conn *v = pending_victim(l);
		char vwhy[200];
		snprintf(vwhy, sizeof(vwhy),
			 "%d connections to this socket wait, uid %u holds the most: its oldest "
			 "gave way to a new one",
			 PENDING_MAX, (unsigned)v->cred.uid);
		pending_refuse(v, ZC_ELIMIT, vwhy);
	}
	return 0;
}

static void on_accept(struct loop *loop, void *userdata)
{
	struct fastpath_listener *l = userdata;

	(void)loop;
	for (int i = 0; i < 16; i++) {
		socklen_t len = sizeof(struct ucred);
		struct ucred cred;
		struct fp_conn *c;
		char why[200];
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		int r;

		if (fd < 0)
			return;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			close(fd);
			continue;
		}
		r = pending_admit(l, &cred, why, sizeof(why));
		c = r == 0 ? calloc(1, sizeof(*c)) : NULL;
		if (!c) {
			refuse(l, fd, &cred, r ? r : -ENOMEM, "%s", r ? why : "out of memory");
			close(fd);
			continue;
		}
		c->l = l;
		c->fd = fd;
		c->cred = cred;
		c->accepted_ms = now_ms();
		if (loop_add_fd(l->e->core->loop, fd, on_conn, c) < 0) {
			close(fd);
			free(c);
			continue;
		}
		c->next = l->pending;
		l->pending = c;
		l->npending++;
	}
}

void fastpath_tick(struct edge *e, int64_t now)
{
	struct fastpath_listener *l = e->fpl;

	if (!l)
		return;
	for (struct fp_conn *c = l->pending, *next; c; c = next) {
		char byte;

		next = c->next;
		/* one whose record waits (a loop slowed down, under valgrind)
		 * is served by on_conn() next, not timed out */
		if (now - c->accepted_ms >= PENDING_TIMEOUT_MS &&
		    recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) {
			char why[64];
			snprintf(why, sizeof(why),
				 "sent nothing within %d ms of connecting: closed",
				 PENDING_TIMEOUT_MS);
			pending_refuse(c, ZC_ETIMEDOUT, why);
		}
	}
}

int64_t fastpath_next_deadline(struct edge *e)
{
	int64_t next = LOOP_NEVER;

	if (e->fpl)
		for (struct fp_conn *c = e->fpl->pending; c; c = c->next)
			next = MIN(next, c->accepted_ms + PENDING_TIMEOUT_MS);
	return next;
}

/* ---------------------------------------------------------- listener --- */

static void listener_free(struct fastpath_listener *l)
{
	while (l->pending)
		conn_close(l->pending);
	if (l->fd >= 0) {
		loop_remove_fd(l->e->core->loop, l->fd);
		close(l->fd);
		unlink(l->path);
	}
	if (l->kick_fd >= 0) {
		loop_remove_fd(l->e->core->loop, l->kick_fd);
		close(l->kick_fd);
	}
	free(l);
}

static int listener_open(struct fastpath_listener *l, const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	mode_t old_mask;
	int r;

	if ((size_t)snprintf(l->path, sizeof(l->path), "%s.fd", sock) >= sizeof(l->path)) {
		l->path[0] = 0;
		return -ENAMETOOLONG;
	}
	/* the ZeroMQ socket beside it was claimed already, so a socket here
	 * is a dead daemon's; anything else is not ours to remove */
	if (lstat(l->path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			l->path[0] = 0;
			return -EEXIST;
		}
		unlink(l->path);
	}
	strcpy(sa.sun_path, l->path);
	l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->fd < 0)
		return -errno;
	old_mask = umask(0117); /* 0660, as the ZeroMQ socket */
	r = bind(l->fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old_mask);
	if (r < 0) {
		r = -errno;
		close(l->fd);
		l->fd = -1;
		return r;
	}
	if (listen(l->fd, 128) < 0)
		return -errno;
	l->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->kick_fd < 0)
		return -errno;
	r = loop_add_fd(l->e->core->loop, l->fd, on_accept, l);
	if (r < 0)
		return r;
	return loop_add_fd(l->e->core->loop, l->kick_fd, on_kick, l);
}

int fastpath_listen(struct edge *e, char *why, size_t whylen)
{
	const char *env = getenv("ZEROD_FASTPATH");
	struct fastpath_listener *l;
	int r;

	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->e = e;
	l->fd = l->kick_fd = -1;
	l->rings = !(env && strcmp(env, "0") == 0);
	if (!l->rings)
		log_info("fast path off (ZEROD_FASTPATH=0): ZeroMQ carries everything");
	r = listener_open(l, e->cfg->socket_path);
	if (r < 0) {
		snprintf(why, whylen, "cannot serve %s.fd, where trainers pass their buffers: %s",
			 e->cfg->socket_path, strerror(-r));
		listener_free(l);
		return r;
	}
	e->fpl = l;
	return 0;
}

void fastpath_unlisten(struct edge *e)
{
	if (e->fpl)
		listener_free(e->fpl);
	e->fpl = NULL;
}
