/*
 * fastpath.c — libzeroclient's side of the fast path: it owns the ring
 * memory (a memfd sealed against shrinking and growing, mapped here and in
 * zerod), the connection to zerod's <socket>.fd that carried it and now
 * serves as the doorbell both ways, and the client's indices. The protocol
 * and why it keeps the order of the ZeroMQ messages are in common/ring.h and
 * daemon/edge/fastpath.c.
 *
 * The client trusts the daemon, but not blindly its own shared memory: a
 * head or tail out of range is ZC_EPROTO, not a wild read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bufs.h"
#include "fastpath.h"
#include "ring.h"
#include "zeroclient.h"

struct fpc {
	int fd; /* the connection: doorbell both ways */
	struct ring_shared *mem;
	size_t bytes;
	uint32_t up_n, down_n;
	uint32_t up_head, down_tail; /* ours alone */
	uint32_t down_told;          /* the down tail the daemon was last told */
	uint64_t marked;             /* the last MARK pushed up */
	uint64_t zgate;              /* take nothing before this many ZeroMQ messages came */
	bool closed;                 /* the daemon closed the channel */
};

int fpc_fd(const struct fpc *f)
{
	return f->fd;
}

void fpc_free(struct fpc *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	if (f->mem)
		munmap(f->mem, f->bytes);
	free(f);
}

static int ring_create(struct fpc *f, uint32_t nbuckets, int *ret_memfd)
{
	int fd, r;

	ring_sizes(nbuckets, &f->up_n, &f->down_n);
	f->bytes = ring_bytes(f->up_n, f->down_n);
	fd = memfd_create("zerod-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* sealed: the daemon maps it and must never see it shrink (SIGBUS) */
	if (ftruncate(fd, (off_t)f->bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	f->mem = mmap(NULL, f->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f->mem == MAP_FAILED) {
		r = -errno;
		f->mem = NULL;
		close(fd);
		return r;
	}
	/* a child after fork() must never write the parent's session (and
	 * every client call there fails first): it does not even get the ring */
	if (madvise(f->mem, f->bytes, MADV_DONTFORK) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	f->mem->magic = RING_MAGIC;
	f->mem->version = RING_VERSION;
	f->mem->up_slots = f->up_n;
	f->mem->down_slots = f->down_n;
	*ret_memfd = fd;
	return 0;
}

/* Send ATTACH with the memfd and wait for the answer. */
static int ring_attach(struct fpc *f, const char *path, uint64_t token, uint64_t zsent,
		       int memfd, int timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct ring_attach a = {.magic = RING_ATTACH_MAGIC,
				.token = token,
				.zsent = zsent,
				.version = RING_VERSION,
				.up_slots = f->up_n,
				.down_slots = f->down_n};
	struct ring_attach_reply rep;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = {.iov_base = &a, .iov_len = sizeof(a)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf.buf,
			    .msg_controllen = sizeof(cbuf.buf)};
	struct cmsghdr *cm;
	ssize_t n;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path too long");
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	f->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (f->fd < 0 || connect(f->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		snprintf(err, errlen, "connect %s: %s", path, strerror(errno));
		return -errno;
	}
	memset(cbuf.buf, 0, sizeof(cbuf.buf));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
	if (sendmsg(f->fd, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(a)) {
		int r = -errno;
		/* zerod may have refused the connection before reading it */
		n = bufs_answer(f->fd, &rep, sizeof(rep), 0, err, errlen);
		if (n < 0 && n != ZC_ETIMEDOUT)
			return (int)n;
		snprintf(err, errlen, "send ATTACH: %s", strerror(-r));
		return r;
	}
	n = bufs_answer(f->fd, &rep, sizeof(rep), timeout_ms, err, errlen);
	if (n < 0)
		return (int)n;
	if (n != (ssize_t)sizeof(rep) || rep.magic != RING_ATTACH_MAGIC) {
		snprintf(err, errlen, "no answer to ATTACH (%zd bytes)", n);
		return ZC_EPROTO;
	}
	if (rep.status < 0) {
		rep.message[sizeof(rep.message) - 1] = 0;
		snprintf(err, errlen, "zerod refused the ring: %s", rep.message);
		return rep.status;
	}
	f->zgate = rep.zsent;
	return 0;
}

int fpc_attach(const char *path, uint64_t token, uint64_t zsent, uint32_t nbuckets,
	       int timeout_ms, struct fpc **ret, char *err, size_t errlen)
{
	struct fpc *f = calloc(1, sizeof(*f));
	int memfd = -1, r;

	if (!f)
		return -ENOMEM;
	f->fd = -1;
	f->marked = zsent;
	r = ring_create(f, nbuckets, &memfd);
	if (r < 0) {
		snprintf(err, errlen, "cannot create the ring: %s", strerror(-r));
		goto fail;
	}
	r = ring_attach(f, path, token, zsent, memfd, timeout_ms, err, errlen);
	close(memfd); /* the mappings, ours and zerod's, keep it */
	if (r < 0)
		goto fail;
	*ret = f;
	return 0;
fail:
	fpc_free(f);
	return r;
}

static void ring_doorbell(int fd)
{
	/* EAGAIN: doorbells wait unread, the daemon is awake anyway */
	(void)!send(fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

int fpc_push_ready(struct fpc *f, uint64_t zsent, uint64_t iteration, uint32_t bucket)
{
	struct ring_slot *slots = ring_up_slots(f->mem);
	uint32_t tail = atomic_load_explicit(&f->mem->up.tail, memory_order_acquire);
	uint32_t used = f->up_head - tail, need = zsent > f->marked ? 2 : 1;
	uint32_t mask = f->up_n - 1;

	if (used > f->up_n)
		return ZC_EPROTO;
	if (f->up_n - used < need)
		return -EAGAIN;
	if (need == 2) {
		/* the daemon handles our ZeroMQ messages up to zsent first */
		slots[f->up_head & mask] =
			(struct ring_slot){.iteration = zsent, .tag = ring_tag(RING_MARK, f->up_head)};
		f->marked = zsent;
		f->up_head++;
	}
	slots[f->up_head & mask] = (struct ring_slot){
		.iteration = iteration, .bucket = bucket, .tag = ring_tag(RING_READY, f->up_head)};
	f->up_head++;
	atomic_store_explicit(&f->mem->up.head, f->up_head, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&f->mem->up.waiting, memory_order_relaxed) &&
	    atomic_exchange_explicit(&f->mem->up.waiting, 0, memory_order_seq_cst))
		ring_doorbell(f->fd);
	return 0;
}

bool fpc_begin(struct fpc *f, bool drain_doorbell)
{
	enum { N = 64 };
	char buf[N][8];
	struct iovec iov[N];
	struct mmsghdr mm[N];
	int n;

	/* awake: no doorbell needed until fpc_sleep() */
	atomic_store_explicit(&f->mem->down.waiting, 0, memory_order_relaxed);
	/* Only when the caller knows it rang (a doorbell left unread keeps
	 * the fd readable): elsewhere it would be a wasted system call. One
	 * per arming at most, and we arm once per dispatch: one call reads
	 * them all. */
	if (!drain_doorbell || f->closed)
		return !f->closed;
	for (int i = 0; i < N; i++) {
		iov[i] = (struct iovec){.iov_base = buf[i], .iov_len = sizeof(buf[i])};
		mm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[i], .msg_iovlen = 1}};
	}
	n = recvmmsg(f->fd, mm, N, MSG_DONTWAIT, NULL);
	if (n == 0 || (n > 0 && mm[n - 1].msg_len == 0) || (n < 0 && errno != EAGAIN && errno != EINTR))
		f->closed = true; /* zerod stopped, or dropped the ring */
	return !f->closed;
}

/* The slot at our tail, if it may be taken now: 1, 0 (none, or a MARK
 * waiting for its ZeroMQ message), ZC_EPROTO. */
static int peek(struct fpc *f, uint64_t zrecv, struct ring_slot *ret, char *err, size_t errlen)
{
	uint32_t head, kind;
	struct ring_slot sl;

	if (zrecv < f->zgate)
		return 0;
	head = atomic_load_explicit(&f->mem->down.head, memory_order_acquire);
	if (head == f->down_tail)
		return 0;
	if (head - f->down_tail > f->down_n) {
		snprintf(err, errlen, "fast-path ring from zerod: head %" PRIu32 " is past tail %" PRIu32,
			 head, f->down_tail);
		return ZC_EPROTO;
	}
	sl = ring_down_slots(f->mem, f->up_n)[f->down_tail & (f->down_n - 1)];
	kind = sl.tag >> 24;
	if ((sl.tag & RING_SEQ_MASK) != (f->down_tail & RING_SEQ_MASK) ||
	    (kind != RING_BUCKET_DONE && kind != RING_STEP_DONE && kind != RING_MARK)) {
		snprintf(err, errlen, "fast-path ring from zerod: slot %" PRIu32 " holds tag %08" PRIx32,
			 f->down_tail, sl.tag);
		return ZC_EPROTO;
	}
	if (kind == RING_MARK && sl.iteration > zrecv)
		return 0;
	*ret = sl;
	return 1;
}

int fpc_next(struct fpc *f, uint64_t zrecv, struct fpc_event *ret, char *err, size_t errlen)
{
	struct ring_slot sl;
	int r;

	while ((r = peek(f, zrecv, &sl, err, errlen)) == 1) {
		f->down_tail++;
		/* fpc_sleep() tells zerod the tail; a client that never has to
		 * sleep (it polls, or finds each completion there already) must
		 * free the slots too, or zerod finds the ring full: every half
		 * ring */
		if (f->down_tail - f->down_told >= f->down_n / 2) {
			atomic_store_explicit(&f->mem->down.tail, f->down_tail,
					      memory_order_release);
			f->down_told = f->down_tail;
		}
		if (sl.tag >> 24 == RING_MARK)
			continue;
		*ret = (struct fpc_event){.step = sl.tag >> 24 == RING_STEP_DONE,
					  .iteration = sl.iteration,
					  .bucket = sl.bucket};
		return 1;
	}
	return r;
}

bool fpc_sleep(struct fpc *f, uint64_t zrecv)
{
	struct ring_slot sl;
	char err[8];

	/* written only when it moved: the line stays in the daemon's cache */
	if (f->down_told != f->down_tail) {
		atomic_store_explicit(&f->mem->down.tail, f->down_tail, memory_order_release);
		f->down_told = f->down_tail;
	}
	atomic_store_explicit(&f->mem->down.waiting, 1, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	if (peek(f, zrecv, &sl, err, sizeof(err)) == 0)
		return false;
	/* it came while we were looking away: take it, awake */
	atomic_store_explicit(&f->mem->down.waiting, 0, memory_order_relaxed);
	return true;
}
