/*
 * bufs.c — libzeroclient's side of passing buffers as memfds: the memfd
 * zc_alloc_buffers() makes, a state round's staging memfd, and the FDBUFS
 * (FDSTAGE) exchange (common/bufwire.h) on a
 * connection of its own to zerod's <socket>.fd. The checks of the memory
 * are zerod's (daemon/edge/fdbufs.c): it is the one that must trust it, and its
 * reasons come back here word for word, as are those of a connection zerod
 * serves none of (FDREFUSED: too many of this user wait there).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bufs.h"
#include "bufwire.h"
#include "zeroclient.h"

int bufs_memfd(uint64_t bytes, uint64_t *ret_param_offset, int *ret_fd)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t span = (bytes + page - 1) / page * page;
	int fd, r;

	if (bytes == 0 || span < bytes || span > (uint64_t)INT64_MAX / 2)
		return -EOVERFLOW;
	fd = memfd_create("zerod-buffers", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* zero-filled; sealed, so zerod may trust its pages to stay */
	if (ftruncate(fd, (off_t)(2 * span)) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_param_offset = span;
	*ret_fd = fd;
	return 0;
}

int bufs_staging(uint64_t bytes, int *ret_fd)
{
	int fd, r;

	if (bytes == 0 || bytes > (uint64_t)INT64_MAX)
		return -EOVERFLOW;
	fd = memfd_create("zerod-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

static int send_rec(const char *path, uint64_t magic, uint64_t token, const int *fds, int nfds,
		    uint64_t bytes, uint64_t grad_offset, uint64_t param_offset, int timeout_ms,
		    uint64_t *ret_serial, char *err, size_t errlen);

ssize_t bufs_answer(int fd, void *rep, size_t size, int timeout_ms, char *err, size_t errlen)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	struct fdbufs_reply refused;
	ssize_t n;

	if (poll(&pfd, 1, timeout_ms) != 1) {
		snprintf(err, errlen, "zerod did not answer within %d ms", timeout_ms);
		return ZC_ETIMEDOUT;
	}
	n = recv(fd, rep, size, MSG_DONTWAIT);
	/* zerod closed with our record unread: the reset comes first, then
	 * what it sent before it closed */
	if (n < 0 && errno == ECONNRESET)
		n = recv(fd, rep, size, MSG_DONTWAIT);
	if (n < 0) {
		n = -errno;
		snprintf(err, errlen, "reading zerod's answer: %s", strerror(errno));
		return n;
	}
	if ((size_t)n != sizeof(refused) || size < sizeof(refused))
		return n;
	memcpy(&refused, rep, sizeof(refused));
	if (refused.magic != FDREFUSED_MAGIC)
		return n;
	refused.message[sizeof(refused.message) - 1] = 0;
	snprintf(err, errlen, "zerod refused the connection: %s", refused.message);
	return refused.status < 0 ? refused.status : ZC_EPROTO;
}

int bufs_send(const char *path, uint64_t token, const int *fds, int nfds, uint64_t bytes,
	      uint64_t grad_offset, uint64_t param_offset, int timeout_ms, uint64_t *ret_serial,
	      char *err, size_t errlen)
{
	return send_rec(path, FDBUFS_MAGIC, token, fds, nfds, bytes, grad_offset, param_offset,
			timeout_ms, ret_serial, err, errlen);
}

int bufs_send_staging(const char *path, uint64_t token, int fd, uint64_t bytes, int timeout_ms,
		      uint64_t *ret_serial, char *err, size_t errlen)
{
	return send_rec(path, FDSTAGE_MAGIC, token, &fd, 1, bytes, 0, 0, timeout_ms, ret_serial,
			err, errlen);
}

static int send_rec(const char *path, uint64_t magic, uint64_t token, const int *fds, int nfds,
		    uint64_t bytes, uint64_t grad_offset, uint64_t param_offset, int timeout_ms,
		    uint64_t *ret_serial, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct fdbufs_offer o = {.magic = magic,
				 .token = token,
				 .version = FDBUFS_VERSION,
				 .nfds = (uint32_t)nfds,
				 .bytes = bytes,
				 .grad_offset = grad_offset,
				 .param_offset = param_offset};
	struct fdbufs_reply rep;
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
	ssize_t n;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path too long");
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	/* non-blocking: a full backlog is an error here, not a wait */
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		snprintf(err, errlen, "connect %s: %s%s", path, strerror(-r),
			 r == -EACCES ? " (it is zerod's group's: see zeroclient.h, \"Running "
					"zerod as another user\")"
				      : "");
		goto out;
	}
	memset(cbuf.buf, 0, sizeof(cbuf.buf));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(o)) {
		r = -errno;
		/* zerod may have refused the connection before reading it */
		n = bufs_answer(fd, &rep, sizeof(rep), 0, err, errlen);
		if (n < 0 && n != ZC_ETIMEDOUT) {
			r = (int)n;
			goto out;
		}
		snprintf(err, errlen, "sending the buffers to %s: %s", path, strerror(-r));
		goto out;
	}
	n = bufs_answer(fd, &rep, sizeof(rep), timeout_ms, err, errlen);
	if (n < 0) {
		r = (int)n;
		goto out;
	}
	if (n != (ssize_t)sizeof(rep) || rep.magic != FDBUFS_MAGIC) {
		r = ZC_EPROTO;
		snprintf(err, errlen, "no answer for the buffers (%zd bytes): an older zerod?", n);
		goto out;
	}
	r = rep.status;
	if (r < 0) {
		rep.message[sizeof(rep.message) - 1] = 0;
		snprintf(err, errlen, "zerod refused the %s: %s",
			 magic == FDSTAGE_MAGIC ? "staging" : "buffers", rep.message);
		goto out;
	}
	*ret_serial = rep.serial;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	return r;
}
