/*
 * internal.h — what libzeroclient's files share and nothing outside sees: the
 * calling thread's error reason, and reading the caller's zc_config.
 */
#ifndef ZEROCLIENT_INTERNAL_H
#define ZEROCLIENT_INTERNAL_H

#include <stdbool.h>

#include "zeroclient.h"

/* Record the reason for code in this thread's zc_error_message() (NULL fmt:
 * zc_strerror(code)) and return code. */
int client_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read a caller's zc_config of any size (zeroclient.h, "ABI") into *out:
 * 0, or -EINVAL / -E2BIG with the reason recorded. */
int structs_config_from_zc(const struct zc_config *src, struct zc_config *out);

/* Read a caller's zc_buffers the same way (for zc_register_buffers). */
int structs_buffers_from_zc(const struct zc_buffers *src, struct zc_buffers *out);

/* Checkpoints (ckpt.c) see a registered client through this: valid until
 * the next call on c that changes its plan. */
struct plan;
struct ckpt_view {
	const struct plan *plan;
	const char *job_id;
	uint32_t rank, world, nnodes;
	bool one_node;      /* every rank of the job on this node */
	uint32_t local_rank; /* 0: its node's stager of a checkpoint over nodes */
	const char *dir;     /* zc_checkpoint()'s, set by ckpt.c */
	uint64_t iteration; /* the next one this rank hands buckets of */
	int timeout_ms;     /* the client's register_timeout_ms */
	struct ckpt_writer **writer; /* c's checkpoint writer (ckpt.c), NULL: none */
};
/* 0, or ZC_ESTATE (no plan, a re-plan half done, mid-iteration) with the
 * reason recorded (fn names the caller). */
int client_ckpt_view(zc_client *c, const char *fn, struct ckpt_view *ret);
/* share.c: keep fd (the shared parameter memfd this rank created) open
 * until zc_close(), which closes it; c owns it from here. */
void client_keep_share_fd(zc_client *c, int fd);
/* share.c: whether c registered a plan of host buffers (a call that gives
 * buffers is then a re-plan). */
bool client_registered_host(zc_client *c);
/* share.c: zc_alloc_buffers()'s re-plan with the parameters in the job's
 * shared memfd param_fd (at 0; dup'ed, the caller keeps its fd), filled
 * from the registered buffers only when copy (the rank that created it):
 * 0, or an error recorded. */
int client_replan_shared(zc_client *c, const struct zc_plan *zp, int param_fd, bool copy);
/* The job goes on at `iteration` (Resume): 0, or an error recorded. */
int client_resume(zc_client *c, uint64_t iteration, const char *fn);
/* A checkpoint's staging (ckpt.c keeps it from one checkpoint to the next):
 * a memfd of `bytes` (bufs_staging), mapped at base, in the state round's
 * staging layout (docs/STATE.md; region 0 the parameters). */
struct ckpt_stage {
	int fd;
	float *base;
	uint64_t bytes;
};
struct zc_segment_state;
/* zc_checkpoint()'s export on one node, fp32 plans (CheckpointState), every
 * local rank: after the last step, zerod copies every piece's state into
 * stg (the rank that writes; NULL on the others, which take part and get
 * nothing) while this thread copies its parameters into region 0. Then
 * ss[n] (bucket and segment set) get their present keys, step, and tensor
 * pointers into stg. 0, or an error recorded. */
/* Over several nodes (ret_own not NULL, ss unused): stg gets only this
 * node's pieces, and *ret_own the ranges zerod filled (StateOk), each with
 * its bucket, keys and step; free with ckpt_owned_free(). */
struct ckpt_owned {
	size_t count;
	uint64_t *slot, *n; /* [count]: state layout slot, numel */
	uint32_t *bucket, *present;
	double *step;
	uint32_t node, nnodes;
	uint64_t run; /* StateOk.run: this run of the job over its nodes */
};
void ckpt_owned_free(struct ckpt_owned *o);
int client_ckpt_export(zc_client *c, const struct ckpt_stage *stg, struct zc_segment_state *ss,
		       uint32_t n, struct ckpt_owned *ret_own, const char *fn);
/* c's checkpoint writer slot in *ret, whatever c's plan state
 * (zc_checkpoint_wait): 0, or -EINVAL / ZC_EFORKED recorded. */
int client_ckpt_writer(zc_client *c, const char *fn, struct ckpt_writer ***ret);
/* Wait for c's checkpoint write in flight, if any, and free the writer
 * (zc_close). */
void ckpt_writer_close(struct ckpt_writer **w);
/* Wait for the write in flight, if any, its outcome kept for
 * ckpt_report_take() (zc_close, before the Goodbye). NULL-safe. */
void ckpt_writer_drain(struct ckpt_writer *w);

/* How a checkpoint ended, for zerod (CheckpointDone, docs/CHECKPOINT.md
 * "Outcomes"): made by the writer thread when its write ends (or by
 * zc_checkpoint() when it fails before writing), sent by the client's own
 * thread on its next call that runs (client_ckpt_report). */
struct ckpt_report {
	uint64_t iteration;
	bool ok;
	char dir[4097];
	char path[4160]; /* ok: the generation made current ("" if not known here) */
	char error[512]; /* !ok */
};
/* Whether an outcome waits to be sent (one atomic load: the iteration's
 * hot path asks). NULL-safe. */
bool ckpt_report_ready(struct ckpt_writer *w);
/* The outcome waiting, once: true with it in *ret. NULL-safe. */
bool ckpt_report_take(struct ckpt_writer *w, struct ckpt_report *ret);
/* Send the outcome waiting in c's writer, if any, as a CheckpointDone
 * (best effort: a lost connection is said by the caller's own call; no
 * error recorded). _locked: c->mu held. */
void client_ckpt_report(zc_client *c);
void client_ckpt_report_locked(zc_client *c);
/* Send rep as c's CheckpointDone now (c->mu not held; as above). */
void client_ckpt_report_now(zc_client *c, const struct ckpt_report *rep);

#endif
