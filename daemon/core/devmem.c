/*
 * devmem.c — per-device optimizer state of CUDA jobs, for
 * --max-device-memory (see devmem.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mem/cudabufs.h"
#include "base/config.h"
#include "core/core-t.h"
#include "core/devmem.h"
#include "plan/state.h"

int devmem_of(const struct state *s, struct cudabufs *const *bufs, bool keep, bool journal,
	      struct devmem_use **ret, uint32_t *ret_n)
{
	unsigned narr = !!(s->arrays & PLAN_STATE_M) + !!(s->arrays & PLAN_STATE_V) +
			!!(s->arrays & PLAN_STATE_VMAX);
	struct devmem_use *u = NULL;
	uint32_t n = 0;

	for (uint32_t k = 0; k < s->npieces; k++) {
		const struct optim_piece *pc = &s->pieces[k];
		const uint8_t *id = bufs[pc->owner]->param.cuda.uuid;
		uint64_t b = (pc->n * narr + (pc->dtype != ZC_DTYPE_F32 || keep ? pc->n : 0)) *
			     sizeof(float);
		uint32_t i = 0;

		while (i < n && memcmp(u[i].uuid, id, MEM_CUDA_UUID_BYTES) != 0)
			i++;
		if (i == n) {
			struct devmem_use *nu = realloc(u, (n + 1) * sizeof(*u));
			if (!nu) {
				free(u);
				return -ENOMEM;
			}
			u = nu;
			memcpy(u[n].uuid, id, MEM_CUDA_UUID_BYTES);
			u[n++].bytes = 0;
		}
		u[i].bytes += journal ? 2 * b : b; /* the journal mirrors it */
	}
	*ret = u;
	*ret_n = n;
	return 0;
}

/* What the other jobs that hold state hold on device uuid. */
static uint64_t held_on(const struct core *core, const struct job *j, const uint8_t *uuid)
{
	uint64_t held = 0;

	for (const struct job *o = core->jobs; o; o = o->next) {
		if (o == j || !o->memory) /* o->memory: 0 once its executor freed the state */
			continue;
		for (uint32_t i = 0; i < o->ndevmem; i++)
			if (memcmp(o->devmem[i].uuid, uuid, MEM_CUDA_UUID_BYTES) == 0)
				held += o->devmem[i].bytes;
	}
	return held;
}

int devmem_check(const struct core *core, const struct job *j, char *why, size_t len)
{
	uint64_t max = core->cfg->max_device_memory;

	if (!max)
		return 0;
	for (uint32_t i = 0; i < j->ndevmem; i++) {
		const struct devmem_use *u = &j->devmem[i];
		uint64_t held = held_on(core, j, u->uuid);
		char need[16], left[16], lim[16], dev[48];

		if (held <= max && u->bytes <= max - held)
			continue;
		snprintf(why, len,
			 "the job needs %s of optimizer state on %s, zerod has %s of its "
			 "--max-device-memory %s left there",
			 fmt_bytes(need, u->bytes), mem_uuid_str(u->uuid, dev),
			 fmt_bytes(left, held < max ? max - held : 0), fmt_bytes(lim, max));
		return ZC_ELIMIT;
	}
	return 0;
}
