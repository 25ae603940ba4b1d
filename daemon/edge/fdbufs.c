/*
 * fdbufs.c — a trainer's gradient and parameter buffers, passed as memfds.
 *
 * The trainer owns the memory: it created the memfd(s), sized, sealed and
 * mapped them, and sends them with SCM_RIGHTS on a connection of its own to
 * <socket>.fd (fastpath.c accepts it and checks the peer is the process and
 * user that said Hello). Here the fds are checked at once, exactly as the
 * plan's mapping will check them (mem_ops.map: a memfd, sealed against
 * shrinking, the trainer's own, large enough), so zc_register_buffers()
 * hears what is wrong; then the session keeps them until its RegisterPlan
 * names them by serial and job.c maps them. Nothing has a name, so nothing
 * is left behind when either side dies: closing the fds and the mappings
 * is all.
 *
 * The same holds later for a registered session: a re-plan's new buffers
 * (FDBUFS, named by the new RegisterPlan) and a state round's staging
 * (FDSTAGE: one memfd, named by GetState/SetState's StateStaging.fd_serial;
 * statex.c), each offered just before the message that names it.
 *
 * Owns: each session's fds (struct fdbufs), one set per session.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/config.h"
#include "core/hooks.h"
#include "core/job.h"
#include "core/rdzv.h"
#include "core/sched.h"
#include "edge/edge.h"
#include "edge/fdbufs.h"
#include "zeroclient.h"

struct fdbufs {
	uint64_t serial;
	bool staging; /* FDSTAGE: fd[0] at offset[0], bytes long */
	int fd[2];    /* grad, param (the same fd twice: one memfd) */
	bool one;     /* fd[1] is fd[0] */
	uint64_t offset[2];
	uint64_t bytes;
};

static uint64_t serials; /* loop thread only */

void fdbufs_free(struct session *s)
{
	struct fdbufs *b = s->bufs;

	if (!b)
		return;
	close(b->fd[0]);
	if (!b->one)
		close(b->fd[1]);
	free(b);
	s->bufs = NULL;
}

static void desc_of(const struct session *s, const struct fdbufs *b, int which,
		    struct mem_desc *ret)
{
	*ret = (struct mem_desc){.kind = MEM_FD,
				 .fd = b->fd[which],
				 .offset = b->offset[which],
				 .bytes = b->bytes,
				 .owner = s->m.uid};
}

/* Ranges of one file must not overlap: the daemon would average into the
 * parameters it steps. Only called once both passed the map check (both
 * memfds, so fstat cannot block). */
static bool overlap(const struct fdbufs *b)
{
	struct stat a, c;

	if (!b->one && (fstat(b->fd[0], &a) < 0 || fstat(b->fd[1], &c) < 0 ||
			a.st_dev != c.st_dev || a.st_ino != c.st_ino))
		return false;
	return b->offset[0] < b->offset[1] + b->bytes && b->offset[1] < b->offset[0] + b->bytes;
}

int fdbufs_offer(struct session *s, const struct fdbufs_offer *o, int *fds, int nfds,
		 uint64_t *ret_serial, char *err, size_t errlen)
{
	static const char *const what[2] = {"gradients", "parameters"};
	struct job *j = s->m.job;
	struct fdbufs b = {.staging = o->magic == FDSTAGE_MAGIC};
	bool registered = j && j->state == JOB_ACTIVE; /* every rank of it registered */
	char why[200];
	int r;

	if (j && job_ended(j)) {
		/* its job failed meanwhile (a rendezvous that refused this
		 * node, a rank that died): that is the reason, not the state */
		snprintf(err, errlen, "job %s failed: %s", j->id, j->errmsg);
		return j->err ? j->err : ZC_EJOBFAILED;
	}
	if (o->version != FDBUFS_VERSION) {
		snprintf(err, errlen, "FDBUFS version %" PRIu32 ", zerod speaks %d", o->version,
			 FDBUFS_VERSION);
		return ZC_EVERSION;
	}
	if (nfds < 1 || nfds > 2 || o->nfds != (uint32_t)nfds) {
		snprintf(err, errlen, "FDBUFS says %" PRIu32 " fds and carries %d (1 or 2)",
			 o->nfds, nfds);
		return ZC_EPROTO;
	}
	if (b.staging && (nfds != 1 || !registered)) {
		snprintf(err, errlen, "%s",
			 nfds != 1 ? "a state staging is one memfd"
				   : "a state staging comes once the plan is registered");
		return nfds != 1 ? ZC_EPROTO : ZC_ESTATE;
	}
	/* a plan's buffers: before it is registered, or a re-plan's */
	if (!b.staging && !registered && (!j || !job_awaits_plan(j, s->m.rank))) {
		snprintf(err, errlen,
			 "buffers come before the plan is registered, or for a re-plan of a "
			 "running job");
		return ZC_ESTATE;
	}
	b.fd[0] = fds[0];
	b.fd[1] = fds[nfds - 1];
	b.one = nfds == 1;
	b.offset[0] = o->grad_offset;
	b.offset[1] = o->param_offset;
	b.bytes = o->bytes;
	/* the plan's mapping, tried now: the same checks, the same words */
	for (int i = 0; i < (b.staging ? 1 : 2); i++) {
		struct mem_map *m = NULL;
		struct mem_desc e;

		desc_of(s, &b, i, &e);
		r = s->e->core->mem->map(&e, b.bytes, &m, why, sizeof(why));
		s->e->core->mem->unmap(m);
		if (r < 0) {
			snprintf(err, errlen, "%s: %s", b.staging ? "the state staging" : what[i],
				 why);
			return r;
		}
	}
	if (!b.staging && overlap(&b)) {
		snprintf(err, errlen,
			 "the gradients (offset %" PRIu64 ") and the parameters (offset %" PRIu64
			 ") overlap in one memfd: each takes %" PRIu64 " bytes",
			 b.offset[0], b.offset[1], b.bytes);
		return ZC_EBUFFER;
	}
	fdbufs_free(s);
	s->bufs = malloc(sizeof(*s->bufs));
	if (!s->bufs) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	b.serial = ++serials;
	*s->bufs = b;
	for (int i = 0; i < nfds; i++)
		fds[i] = -1; /* ours now */
	*ret_serial = b.serial;
	return 0;
}

int fdbufs_descs(struct session *s, uint64_t serial, struct mem_desc *ret_grad,
		 struct mem_desc *ret_param, char *err, size_t errlen)
{
	if (!s->bufs || s->bufs->serial != serial || s->bufs->staging) {
		snprintf(err, errlen,
			 "no buffers %" PRIu64 " were passed on this session (pass them over "
			 "<socket>.fd first: zc_register_buffers)",
			 serial);
		return ZC_EBUFFER;
	}
	desc_of(s, s->bufs, 0, ret_grad);
	desc_of(s, s->bufs, 1, ret_param);
	return 0;
}

int fdbufs_staging(struct session *s, uint64_t serial, struct mem_desc *ret, char *err,
		   size_t errlen)
{
	if (!s->bufs || s->bufs->serial != serial || !s->bufs->staging) {
		snprintf(err, errlen,
			 "no state staging %" PRIu64 " was passed on this session (over "
			 "<socket>.fd, FDSTAGE)",
			 serial);
		return ZC_EBUFFER;
	}
	desc_of(s, s->bufs, 0, ret);
	return 0;
}
