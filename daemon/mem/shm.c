/*
 * shm.c — host buffers, mapped here once per plan, of two kinds:
 *  - MEM_FD: a memfd the trainer created and passed with SCM_RIGHTS
 *    (daemon/edge/fdbufs.c). It has no name, so nothing is left anywhere when
 *    either side dies. It must be a memfd sealed against shrinking (a
 *    shrunk file would SIGBUS the daemon), the trainer's own (st_uid), and
 *    hold the buffer from its offset.
 *  - MEM_SHM: a named POSIX shm object (mode 0600). The daemon unlinks the
 *    name right after mapping. Buffers of a trainer that dies before
 *    registering are found by their name (common.h's shm_name_prefix) and
 *    removed. Who still sends one: no current client. libzeroclient sends
 *    memfds since zc_register_buffers() took them (RegisterPlan's
 *    FdBuffers; a state round's StateStaging by fd_serial, shm_name "").
 *    What does: a trainer linked to a libzeroclient older than that (it
 *    speaks protocol 1 too, so its Hello is taken), and the raw protocol
 *    tests (tests/integration/raw.c and its users, test_state's named
 *    staging, the fuzzers). The kept gradient map of core/job.c
 *    (grad_keep, grad_map, by job and rank: a registration refused for its
 *    parameter buffer can name the gradient object again after its name was
 *    unlinked) serves this kind only; test_hostile's
 *    refused_registration_retryable covers it.
 * Only quick syscalls, on the loop thread: mmap of a file maps, it faults
 * nothing in.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "base/log.h"
#include "mem/mem.h"
#include "zeroclient.h"

#define SHM_DIR "/dev/shm" /* where glibc's shm_open keeps the objects */

struct mem_map {
	void *base;
	size_t len;
};

static bool shm_name_ok(const char *n)
{
	size_t len;

	if (!n || n[0] != '/')
		return false;
	len = strlen(n);
	return len > 1 && len < 240 && !strchr(n + 1, '/');
}

static int map_new(void *base, size_t len, struct mem_map **ret)
{
	struct mem_map *m = calloc(1, sizeof(*m));

	if (!m) {
		munmap(base, len);
		return -ENOMEM;
	}
	m->base = base;
	m->len = len;
	*ret = m;
	return 0;
}

/* What fd is, as /proc names it ("pipe:[123]", "/tmp/x (deleted)",
 * "socket:[9]"): readlink there asks no file system, so it cannot block. */
static const char *fd_what(int fd, char *buf, size_t len)
{
	char path[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, len - 1);
	if (n < 0)
		snprintf(buf, len, "fd %d", fd);
	else
		buf[n] = 0;
	return buf;
}

static int fd_map(const struct mem_desc *desc, uint64_t bytes, struct mem_map **ret, char *err,
		  size_t errlen)
{
	long page = sysconf(_SC_PAGESIZE);
	char name[128];
	struct stat st;
	void *base;
	int seals;

	if (desc->bytes != bytes) {
		snprintf(err, errlen,
			 "the buffers hold %" PRIu64 " bytes each, the plan needs %" PRIu64,
			 desc->bytes, bytes);
		return ZC_EBUFFER;
	}
	/* F_GET_SEALS first: it fails at once for anything but a memfd (or
	 * another shmem file), where fstat() of a file on a hung FUSE mount
	 * would block the loop. */
	seals = fcntl(desc->fd, F_GET_SEALS);
	if (seals < 0) {
		snprintf(err, errlen, "%s is not a memfd (memfd_create with MFD_ALLOW_SEALING)",
			 fd_what(desc->fd, name, sizeof(name)));
		return ZC_EBUFFER;
	}
	if (!(seals & F_SEAL_SHRINK)) {
		snprintf(err, errlen,
			 "%s is not sealed against shrinking (fcntl F_ADD_SEALS F_SEAL_SHRINK): "
			 "zerod could not trust its pages to stay",
			 fd_what(desc->fd, name, sizeof(name)));
		return ZC_EBUFFER;
	}
	if (fstat(desc->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is not a regular memfd",
			 fd_what(desc->fd, name, sizeof(name)));
		return ZC_EBUFFER;
	}
	/* Only the trainer's own memory: a memfd belongs to whoever made it,
	 * and one passed on by another user is not this trainer's to give. */
	if (desc->owner == (uid_t)-1 || st.st_uid != desc->owner) {
		snprintf(err, errlen,
			 "%s is another user's buffer (uid %u), not the trainer's (uid %u)",
			 fd_what(desc->fd, name, sizeof(name)), (unsigned)st.st_uid,
			 (unsigned)desc->owner);
		return ZC_EBUFFER;
	}
	if (page <= 0 || desc->offset % (uint64_t)page) {
		snprintf(err, errlen, "offset %" PRIu64 " is not a multiple of the page size (%ld)",
			 desc->offset, page);
		return ZC_EBUFFER;
	}
	if (bytes == 0 || bytes > SIZE_MAX || desc->offset > (uint64_t)st.st_size ||
	    (uint64_t)st.st_size - desc->offset < bytes) {
		snprintf(err, errlen,
			 "%s is too small: %jd bytes, the buffer needs %" PRIu64
			 " from offset %" PRIu64,
			 fd_what(desc->fd, name, sizeof(name)), (intmax_t)st.st_size, bytes,
			 desc->offset);
		return ZC_EBUFFER;
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, desc->fd, (off_t)desc->offset);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "%s: mmap: %s (F_SEAL_WRITE, or not opened read-write?)",
			 fd_what(desc->fd, name, sizeof(name)), strerror(errno));
		return ZC_EBUFFER;
	}
	return map_new(base, bytes, ret);
}

static int shm_map(const struct mem_desc *desc, uint64_t bytes, struct mem_map **ret, char *err,
		   size_t errlen)
{
	struct stat st;
	void *base;
	int fd, r;

	if (desc->kind == MEM_FD)
		return fd_map(desc, bytes, ret, err, errlen);
	if (desc->kind != MEM_SHM) {
		snprintf(err, errlen, "not a shared memory buffer");
		return ZC_EMAP;
	}
	if (!shm_name_ok(desc->shm_name)) {
		snprintf(err, errlen, "bad shared memory name");
		return ZC_EMAP;
	}
	if (desc->bytes != bytes) {
		snprintf(err, errlen, "%s: client says %" PRIu64 " bytes, the plan needs %" PRIu64,
			 desc->shm_name, desc->bytes, bytes);
		return ZC_ESIZE;
	}
	fd = shm_open(desc->shm_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
	if (fd < 0) {
		r = errno;
		snprintf(err, errlen, "%s: %s", desc->shm_name, strerror(r));
		return ZC_EMAP;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a shared memory object", desc->shm_name);
		close(fd);
		return ZC_EMAP;
	}
	/* Only the caller's own objects: never another user's memory. */
	if (desc->owner == (uid_t)-1 || st.st_uid != desc->owner) {
		snprintf(err, errlen, "%s belongs to uid %u, not to the trainer (uid %u)",
			 desc->shm_name, (unsigned)st.st_uid, (unsigned)desc->owner);
		close(fd);
		return ZC_EMAP;
	}
	if ((uint64_t)st.st_size != bytes) {
		snprintf(err, errlen, "%s holds %jd bytes, the plan needs %" PRIu64, desc->shm_name,
			 (intmax_t)st.st_size, bytes);
		close(fd);
		return ZC_ESIZE;
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r = errno;
	close(fd);
	if (base == MAP_FAILED) {
		snprintf(err, errlen, "%s: mmap: %s", desc->shm_name, strerror(r));
		return ZC_EMAP;
	}
	r = map_new(base, bytes, ret);
	if (r == 0)
		shm_unlink(desc->shm_name);
	return r;
}

static void *shm_ptr(struct mem_map *m)
{
	return m->base;
}

static void shm_unmap(struct mem_map *m)
{
	if (!m)
		return;
	munmap(m->base, m->len);
	free(m);
}

/* What follows the prefix in libzeroclient's names: 8 hex digits, then
 * ".grad" or ".param". Anything else belongs to someone else (job ids may
 * hold dots, so the prefix alone could match another job's names). */
static bool shm_suffix_ok(const char *s)
{
	for (int i = 0; i < 8; i++)
		if (!isxdigit((unsigned char)s[i]))
			return false;
	return strcmp(s + 8, ".grad") == 0 || strcmp(s + 8, ".param") == 0;
}

static void shm_reclaim(const char *job, uint32_t rank, pid_t own_pid, uid_t owner)
{
	char prefix[ZEROD_JOB_ID_MAX + 48];
	struct dirent *e;
	struct stat st;
	size_t n;
	DIR *dir;

	if (own_pid <= 0 || owner == (uid_t)-1 || !(dir = opendir(SHM_DIR)))
		return;
	/* Directory entries have no leading '/'. */
	n = (size_t)shm_name_prefix(prefix, sizeof(prefix), job, rank, (int)own_pid) - 1;
	while ((e = readdir(dir))) {
		if (strncmp(e->d_name, prefix + 1, n) != 0 || !shm_suffix_ok(e->d_name + n))
			continue;
		if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode) || st.st_uid != owner)
			continue;
		if (unlinkat(dirfd(dir), e->d_name, 0) == 0)
			log_info("job %s rank %u: removed /%s, left by its exited trainer", job,
				 rank, e->d_name);
	}
	closedir(dir);
}

const struct mem_ops mem_shm_ops = {
	.name = "memfd", /* or, from older clients, named shm: what trainers pass */
	.blocking = false,
	.map = shm_map,
	.ptr = shm_ptr,
	.unmap = shm_unmap,
	.reclaim = shm_reclaim,
};
