/*
 * bufs.h — passing buffers to zerod as memfds (internal; bufs.c). The
 * caller (client.c) does not hold the client's mutex around bufs_send().
 */
#ifndef ZEROCLIENT_BUFS_H
#define ZEROCLIENT_BUFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A memfd for zc_alloc_buffers(): the gradients at 0 and the parameters
 * at *ret_param_offset (a page multiple), `bytes` each, zero-filled and
 * sealed against shrinking and growing. 0, or -errno. */
int bufs_memfd(uint64_t bytes, uint64_t *ret_param_offset, int *ret_fd);

/* Pass fds[0..nfds) (1: one memfd for both; 2: grad, param) to zerod's fd
 * socket `path` for the session of `token` and wait up to timeout_ms for
 * its answer: 0 with *ret_serial (what RegisterPlan names them by), or a
 * code (ZC_EBUFFER: zerod refused the memory) with the reason in err. */
int bufs_send(const char *path, uint64_t token, const int *fds, int nfds, uint64_t bytes,
	      uint64_t grad_offset, uint64_t param_offset, int timeout_ms, uint64_t *ret_serial,
	      char *err, size_t errlen);

/* A staging memfd of `bytes` for a state round (zero-filled, sparse: only
 * what is written takes pages), sealed as above. 0, or -errno. */
int bufs_staging(uint64_t bytes, int *ret_fd);

/* Pass the staging fd to zerod (FDSTAGE) as bufs_send() passes buffers:
 * 0 with *ret_serial (what StateStaging.fd_serial names it by), or a code
 * with the reason in err. */
int bufs_send_staging(const char *path, uint64_t token, int fd, uint64_t bytes, int timeout_ms,
		      uint64_t *ret_serial, char *err, size_t errlen);

/* Wait up to timeout_ms for zerod's answer on fd (a connection to its fd
 * socket that sent its record, or failed to) and read it into rep (size
 * bytes): the bytes read, for the caller to check; or a code with why in
 * err: ZC_ETIMEDOUT, -errno, or what zerod refused the connection with
 * (FDREFUSED, which may come before the record was read). */
ssize_t bufs_answer(int fd, void *rep, size_t size, int timeout_ms, char *err, size_t errlen);

#endif
