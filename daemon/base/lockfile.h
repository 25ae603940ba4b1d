/*
 * lockfile.h — PATH.lock beside a path that one process at a time holds
 * (flock): the trainers' socket (daemon.c) and the metrics textfile
 * (ops.c), so that two zerods never serve or write one path. Its holder
 * removes it when it lets go.
 */
#ifndef ZEROD_LOCKFILE_H
#define ZEROD_LOCKFILE_H

#include <stddef.h>

/* Take path's lock file (PATH.lock, made mode 0600 if absent): its fd in
 * *ret_fd. -EWOULDBLOCK: another process holds it; another -errno says why
 * in why. A file removed by its holder just before is taken again. */
int lockfile_take(const char *path, int *ret_fd, char *why, size_t len);
/* Remove path's lock file, then let go of fd (< 0: nothing). Removed while
 * held, so a process taking it meanwhile finds a new file (lockfile_take
 * checks that the file it locked is still the path's). */
void lockfile_release(const char *path, int fd);

#endif
