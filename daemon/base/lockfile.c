/*
 * lockfile.c — PATH.lock, held with flock by one process at a time and
 * removed by it when it lets go (lockfile.h). Owns nothing past the fd it
 * hands out. The calls are quick syscalls on local files, fine on the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/lockfile.h"

#define LOCK_TRIES 10

int lockfile_take(const char *path, int *ret_fd, char *why, size_t len)
{
	char lock[4200];
	struct stat held, at;
	int fd, r;

	if ((size_t)snprintf(lock, sizeof(lock), "%s.lock", path) >= sizeof(lock)) {
		snprintf(why, len, "%s: path too long", path);
		return -ENAMETOOLONG;
	}
	for (int tries = 0; tries < LOCK_TRIES; tries++) {
		fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
		if (fd < 0) {
			r = -errno;
			snprintf(why, len, "lock file %s: %s", lock, strerror(-r));
			return r;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			r = -errno;
			close(fd);
			snprintf(why, len, "lock file %s: %s", lock,
				 r == -EWOULDBLOCK ? "another process holds it" : strerror(-r));
			return r;
		}
		/* its holder removed it between our open and our flock: a lock
		 * on a file nobody else will open */
		if (fstat(fd, &held) == 0 && lstat(lock, &at) == 0 && held.st_dev == at.st_dev &&
		    held.st_ino == at.st_ino) {
			*ret_fd = fd;
			return 0;
		}
		close(fd);
	}
	snprintf(why, len, "lock file %s: replaced again and again while taking it", lock);
	return -EBUSY;
}

void lockfile_release(const char *path, int fd)
{
	char lock[4200];

	if (fd < 0)
		return;
	if ((size_t)snprintf(lock, sizeof(lock), "%s.lock", path) < sizeof(lock))
		unlink(lock);
	close(fd);
}
