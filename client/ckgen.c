/*
 * ckgen.c — a checkpoint directory's files and generations: reading a file
 * the way a hostile writer of the directory would make it, finding the
 * current generation (ckpt-SEQ, or the single-generation layout of older
 * versions), and beginning, publishing and removing one.
 *
 * Runs on the caller's thread and on the writer thread (ckwriter.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bufs.h"
#include "internal.h"
#include "plan.h"
#include "zeroclient.h"
#include "ckpt.h"

/* ------------------------------------------------------------ reading --- */

/* name in dirfd, read whole (at most max bytes), the way a hostile writer
 * of the directory would make it: never following a link (-ELOOP), never
 * blocking on a FIFO or device (opened O_NONBLOCK, then anything but a
 * regular file refused: -CKPT_ENOTREG with its mode in *ret_mode), its size
 * checked before a byte is read (-EFBIG). */
int ckpt_read_file(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len,
		   mode_t *ret_mode)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), r = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -CKPT_ENOTREG;
	else if ((uint64_t)st.st_size > max)
		r = -EFBIG;
	if (ret_mode)
		*ret_mode = r == -CKPT_ENOTREG ? st.st_mode : 0;
	if (r < 0) {
		close(fd);
		return r;
	}
	buf = malloc((size_t)st.st_size + 1);
	while (buf && got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (!buf)
		return -ENOMEM;
	if (r < 0) {
		free(buf);
		return r;
	}
	buf[got] = '\0';
	*ret = buf;
	*ret_len = got;
	return 0;
}

/* What ckpt_read_file()'s r says of the file, for a person. */
const char *ckpt_read_why(int r, mode_t mode)
{
	if (r == -ELOOP)
		return "a symbolic link: refused (checkpoint files are never followed)";
	if (r != -CKPT_ENOTREG)
		return strerror(-r);
	return S_ISFIFO(mode)	? "a FIFO, not a regular file: refused"
	       : S_ISDIR(mode)	? "a directory, not a regular file: refused"
	       : S_ISSOCK(mode) ? "a socket, not a regular file: refused"
	       : S_ISCHR(mode) || S_ISBLK(mode) ? "a device, not a regular file: refused"
						: "not a regular file: refused";
}

/* ------------------------------------------------------ generations --- */

/* SEQ of a complete generation's name "ckpt-SEQ", or 0 (not one). */
static uint64_t gen_seq(const char *name)
{
	const char *p = name + strlen(CKPT_GEN_PREFIX);
	uint64_t v = 0;

	if (strncmp(name, CKPT_GEN_PREFIX, strlen(CKPT_GEN_PREFIX)) != 0 || !*p ||
	    strlen(p) > 18)
		return 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		v = 10 * v + (uint64_t)(*p - '0');
	}
	return v;
}

/* The newest complete generation in dirfd: its SEQ (0: none) and name. */
static int gen_newest(int dirfd, uint64_t *ret_seq, char *ret_name)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	uint64_t best = 0;
	struct dirent *e;
	DIR *d;

	if (fd < 0)
		return -errno;
	if (!(d = fdopendir(fd))) {
		close(fd);
		return -errno;
	}
	while ((e = readdir(d)))
		if (gen_seq(e->d_name) > best) {
			best = gen_seq(e->d_name);
			/* gen_seq() took at most 18 digits: it fits */
			memcpy(ret_name, e->d_name, strlen(e->d_name) + 1);
		}
	closedir(d);
	*ret_seq = best;
	return 0;
}

/*
 * The checkpoint dir (open at dirfd) holds now: its newest generation
 * ckpt-SEQ, or, where there is none, dir itself (the single-generation
 * layout older versions wrote: MANIFEST and the data files in dir, read as
 * before). ret_fd: that directory; where: its path, for messages. Errors:
 * ZC_ECKPT naming the generation (a symbolic link or not a directory is
 * refused, never followed).
 */
int gen_open_current(int dirfd, const char *dir, int *ret_fd, char *where, size_t len,
		     const char *fn)
{
	char name[CKPT_GEN_NAME];
	uint64_t seq = 0;
	int r = gen_newest(dirfd, &seq, name), fd;

	if (r < 0)
		return client_err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(-r));
	if (!seq) {
		if ((fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0)
			return client_err_set(-errno, "%s: %s: %s", fn, dir, strerror(errno));
		snprintf(where, len, "%s", dir);
		*ret_fd = fd;
		return 0;
	}
	snprintf(where, len, "%s/%s", dir, name);
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return client_err_set(
			ZC_ECKPT, "%s: %s: %s", fn, where,
			errno == ELOOP || errno == ENOTDIR
				? "not a directory (a symbolic link or a file): refused"
				: strerror(errno));
	*ret_fd = fd;
	return 0;
}

/* The directory a checkpoint of `iteration` (this run of the job: run, 0
 * on one node) is written into before it becomes a generation. */
static void gen_tmp_name(char *out, uint64_t iteration, uint64_t run)
{
	snprintf(out, CKPT_GEN_NAME, CKPT_TMP_PREFIX "%" PRIu64 "-%016" PRIx64, iteration, run);
}

/* Remove dirfd's entry name: a file, or a directory of files (what a
 * generation is). Best effort: what stays is removed by the next one. */
static void gen_remove(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *e;
	DIR *d;

	if (fd < 0) {
		unlinkat(dirfd, name, 0);
		return;
	}
	if (!(d = fdopendir(fd))) {
		close(fd);
		return;
	}
	/* the manifest first: a generation cut short by a kill reads as
	 * unfinished, never as one with files missing */
	unlinkat(fd, CKPT_MANIFEST, 0);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			unlinkat(fd, e->d_name, 0);
	closedir(d);
	unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* The checkpoint in tmp (a directory in dirfd, every file in it durable)
 * made the current generation: renamed to ckpt-SEQ, SEQ one above the
 * newest, in one step that never replaces one, and dirfd fsynced. Then the
 * older ones go: generations below SEQ, directories of checkpoints not
 * finished (of iterations up to this one: a later one may be being written
 * by a node's stager, over several nodes), and the single-generation
 * layout's files. 0 or -errno (the checkpoint is durable and current only
 * on 0). */
int gen_publish(int dirfd, const char *tmp, uint64_t iteration, char *ret_name)
{
	char name[CKPT_GEN_NAME];
	uint64_t seq = 0;
	struct dirent *e;
	DIR *d;
	int r, fd;

	for (int tries = 0;; tries++) {
		if ((r = gen_newest(dirfd, &seq, name)) < 0)
			return r;
		snprintf(name, sizeof(name), CKPT_GEN_PREFIX "%08" PRIu64, seq + 1);
		if (renameat2(dirfd, tmp, dirfd, name, RENAME_NOREPLACE) == 0)
			break;
		if (errno != EEXIST || tries == 8)
			return -errno;
	}
	if (fsync(dirfd) < 0)
		return -errno;
	memcpy(ret_name, name, sizeof(name));
	seq++;
	if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return 0;
	if (!(d = fdopendir(fd))) {
		close(fd);
		return 0;
	}
	/* the old layout's manifest before its data: never a manifest naming
	 * files half removed */
	unlinkat(dirfd, CKPT_MANIFEST, 0);
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		uint64_t it = 0;
		if (gen_seq(n) && gen_seq(n) < seq)
			gen_remove(dirfd, n);
		else if (strncmp(n, CKPT_TMP_PREFIX, strlen(CKPT_TMP_PREFIX)) == 0 &&
			 sscanf(n + strlen(CKPT_TMP_PREFIX), "%" SCNu64, &it) == 1 &&
			 it <= iteration)
			gen_remove(dirfd, n);
		else if (strcmp(n, CKPT_DATA) == 0 ||
			 (strncmp(n, "node-", 5) == 0 &&
			  (strstr(n, ".zck") || strstr(n, ".sum"))) ||
			 (n[0] == '.' && strstr(n, ".tmp.")))
			unlinkat(dirfd, n, 0);
	}
	closedir(d);
	return 0;
}

/* The directory to write a checkpoint of iteration (run) into, in dirfd,
 * made if missing (several nodes' stagers make it alike); fresh: whatever
 * one of the same name holds (a write a kill cut short) is removed first
 * (one writer only: one node). 0 with its fd, or -errno. */
int gen_begin(int dirfd, uint64_t iteration, uint64_t run, bool fresh, char *ret_tmp, int *ret_fd)
{
	gen_tmp_name(ret_tmp, iteration, run);
	if (fresh)
		gen_remove(dirfd, ret_tmp);
	if (mkdirat(dirfd, ret_tmp, 0755) < 0 && errno != EEXIST)
		return -errno;
	*ret_fd = openat(dirfd, ret_tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return *ret_fd < 0 ? -errno : 0;
}
