/*
 * fdbufs.h — buffers a trainer passes as memfds over <socket>.fd
 * (common/bufwire.h), held by its session until its RegisterPlan maps them.
 * All on the loop thread.
 */
#ifndef ZEROD_FDBUFS_DAEMON_H
#define ZEROD_FDBUFS_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "bufwire.h"
#include "mem/mem.h"

struct session;

/* fastpath.c: an FDBUFS or FDSTAGE record from s's own process with nfds fds. Checks
 * them as the plan's buffers would be (mem_ops.map) and keeps them in s,
 * replacing buffers it passed before; takes the fds it keeps (sets them to
 * -1 in fds). 0 with *ret_serial, or a code (ZC_EBUFFER for the buffers
 * themselves) with the reason in err. */
int fdbufs_offer(struct session *s, const struct fdbufs_offer *o, int *fds, int nfds,
		 uint64_t *ret_serial, char *err, size_t errlen);

/* session.c: RegisterPlan names the buffers of `serial`: their
 * descriptions (valid until fdbufs_free), or ZC_EBUFFER with the reason. */
int fdbufs_descs(struct session *s, uint64_t serial, struct mem_desc *ret_grad,
		 struct mem_desc *ret_param, char *err, size_t errlen);

/* statex.c: GetState/SetState names the staging of `serial` (an FDSTAGE
 * record): its description (valid until fdbufs_free), or ZC_EBUFFER. */
int fdbufs_staging(struct session *s, uint64_t serial, struct mem_desc *ret, char *err,
		   size_t errlen);

/* Close the fds s holds (its RegisterPlan mapped them, or it is gone).
 * Accepts a session without any. */
void fdbufs_free(struct session *s);

#endif
