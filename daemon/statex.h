/*
 * statex.h — optimizer state export/import rounds of a running job, and
 * re-planning (statex.c). Loop thread only.
 */
#ifndef ZEROD_STATEX_H
#define ZEROD_STATEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zerod.pb-c.h"

struct job;
struct session;

/* Rank `rank` (on this node, session s) asks to export (set false) or import
 * its state through staging stg; list: the segments it gives (import). */
void statex_request(struct job *j, struct session *s, uint32_t rank, bool set,
		    const Zerod__V1__StateStaging *stg, Zerod__V1__SegmentState *const *list,
		    size_t n);

/* The executor finished the round (EXEC_STATE_DONE): StateOk to each rank. */
void statex_done(struct job *j);

/* Drop the round, unmapping the staging: after the executor stopped, or
 * when nothing was queued. Accepts a job without one. */
void statex_free(struct job *j);

#endif
