/*
 * share.c — zc_alloc_buffers_shared(): the local ranks of a job share one
 * parameter buffer (ZC_BUFFERS_SHARED_PARAMS) without passing fds to each
 * other. The first rank creates the memfd and keeps it open (its client
 * owns it until zc_close()); what the others need is a pair of numbers
 * (its pid and its fd number there), which any channel carries (a torch
 * store, MPI, a file, an environment variable). They open the memfd through
 * /proc/PID/fd/N: a new open file of the same memfd, as the daemon's check
 * requires (one file, sharedp.c). That open needs what the kernel asks of
 * a read of another process's fds (ptrace read access: the same user, the
 * creator dumpable), which yama's ptrace_scope does not restrict (it limits
 * attaching only). On a registered client the same call re-plans
 * (zc_alloc_buffers()'s re-plan) into a new shared buffer: the creator
 * copies the parameters into it, the others only map it.
 *
 * Owns: nothing past a call: the creator's memfd goes to its client.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "zeroclient.h"

/* A memfd of bytes (rounded up to a page), zero-filled and sealed as
 * bufs_memfd() seals: zerod may trust its pages to stay. */
static int sealed_memfd(const char *name, uint64_t bytes, int *ret_fd)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), span = (bytes + page - 1) / page * page;
	int fd, r;

	if (span < bytes || span > (uint64_t)INT64_MAX)
		return -EOVERFLOW;
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)span) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

/* The creator's memfd, opened through /proc: 0 and the fd in *ret_fd, or
 * an error with the reason recorded. */
static int open_peer(const struct zc_shared_params *from, uint64_t bytes, int *ret_fd,
		     const char *fn)
{
	char path[64];
	struct stat st;
	int fd, seals, r;

	if (from->pid <= 0 || from->fd < 0)
		return client_err_set(-EINVAL, "%s: from names pid %d, fd %d: not a handle", fn,
				      (int)from->pid, (int)from->fd);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)from->pid, (int)from->fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return client_err_set(
			r, "%s: %s: %s (%s)", fn, path, strerror(-r),
			r == -ENOENT ? "the creating rank exited or closed its client"
			: r == -EACCES || r == -EPERM
				? "another user's process, or one not dumpable"
				: "the creating rank's parameter buffer cannot be opened");
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		r = client_err_set(-EINVAL, "%s: %s is not %s", fn, path,
				   seals < 0 ? "a memfd" : "sealed against shrinking");
		goto fail;
	}
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < bytes) {
		r = client_err_set(-EINVAL,
				   "%s: %s holds %lld bytes, the plan's parameters %" PRIu64
				   " (another plan's buffer?)",
				   fn, path, (long long)st.st_size, bytes);
		goto fail;
	}
	*ret_fd = fd;
	return 0;
fail:
	close(fd);
	return r;
}

int zc_alloc_buffers_shared(zc_client *c, const struct zc_plan *plan,
			    const struct zc_shared_params *from, struct zc_shared_params *ret)
{
	static const char fn[] = "zc_alloc_buffers_shared";
	struct zc_buffers b = ZC_BUFFERS_INIT;
	uint64_t bytes = 0;
	int gfd = -1, pfd = -1, r;
	bool replan;

	if (!c || !plan || !ret)
		return client_err_set(-EINVAL, "%s: c, plan and ret are required", fn);
	if (from && from->size != sizeof(*from))
		return client_err_set(-EINVAL, "%s: from->size is %u, not %zu", fn, from->size,
				      sizeof(*from));
	if ((r = zc_plan_buffer_bytes(plan, &bytes)) < 0)
		return r;
	replan = client_registered_host(c);
	if (from)
		r = open_peer(from, bytes, &pfd, fn);
	else if ((r = sealed_memfd("zerod-shared-params", bytes, &pfd)) < 0)
		client_err_set(r, "%s: a memfd of %" PRIu64 " bytes: %s", fn, bytes,
			       zc_strerror(r));
	if (r < 0)
		goto out;
	if (replan) {
		/* the creator fills the new buffer from the registered one; the
		 * others find it filled (they open it once the creator's call
		 * returned) */
		r = client_replan_shared(c, plan, pfd, !from);
		goto done;
	}
	if ((r = sealed_memfd("zerod-grads", bytes, &gfd)) < 0) {
		client_err_set(r, "%s: a memfd of %" PRIu64 " bytes: %s", fn, bytes,
			       zc_strerror(r));
		goto out;
	}
	b.grad_fd = gfd;
	b.param_fd = pfd;
	b.flags = ZC_BUFFERS_SHARED_PARAMS;
	r = zc_register_buffers(c, plan, &b);
done:
	if (r < 0)
		goto out;
	if (from) {
		*ret = *from;
	} else {
		*ret = (struct zc_shared_params)ZC_SHARED_PARAMS_INIT;
		ret->pid = (int32_t)getpid();
		ret->fd = pfd;
		client_keep_share_fd(c, pfd);
		pfd = -1;
	}
out:
	if (gfd >= 0)
		close(gfd);
	if (pfd >= 0)
		close(pfd);
	return r;
}
