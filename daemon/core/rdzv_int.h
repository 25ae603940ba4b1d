/*
 * rdzv_int.h — what rdzv.c (a job's rendezvous: its nodes' side, the
 * failure relay, the transport's callbacks) and rdzvform.c (the host's
 * side: joins and forming) share: the job's rendezvous state. Loop thread
 * only. Nothing outside core/rdzv*.c includes it.
 */
#ifndef ZEROD_RDZV_INT_H
#define ZEROD_RDZV_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "coll/coll.h"
#include "common.h"
#include "net/rdzvnet.h"

/* core-t.h's ZEROD_MAX_WORLD, for rdzvform.c (rdzv.c checks they agree) */
#define RDZV_MAX_WORLD 4096u

struct core;
struct job;
struct plan;

/* The daemon's side: the transport (net/rdzvnet.h) it owns. */
struct rdzv_daemon {
	struct core *core;
	struct rnet *net;
};

/* The host: what a node joined with (a connection's priv, once it joined). */
struct joiner {
	uint32_t world, nnodes;
	bool has_idx;
	uint32_t idx;
	uint32_t *ranks;
	uint32_t nranks;
	struct plan *plan;
};

struct rdzv_job {
	struct job *j;
	struct rdzv_daemon *rd;
	struct rnet_scope sc; /* what its connections prove, and node 0's store */
	char endpoint[RDZV_ENDPOINT_MAX + 1];
	char host[RDZV_ENDPOINT_MAX + 1], port[8];
	uint32_t nnodes;
	bool has_node_rank;
	uint32_t node_rank;
	uint8_t secret[RDZV_SECRET_MAX];
	size_t secret_len;

	struct rnet_resolve *res;
	bool resolved;
	struct sockaddr_storage addr; /* the rendezvous */
	socklen_t addrlen;
	bool hosting;
	struct rnet_listener *lst;
	bool local_ready;
	int64_t ready_ms;

	/* a node: its connection to the host */
	struct rnet_conn *up;
	int64_t retry_at;
	int retry_ms;
	bool join_sent;
	char last_err[160];
	char refusal[256]; /* the rendezvous' last refusal: named at the join timeout */

	/* formed */
	bool formed;
	uint32_t node, host_node;
	uint32_t *node_of;            /* [world] */
	char (*names)[RNET_NAME_LEN]; /* [nnodes] */
	bool *lost;                   /* [nnodes] */
	struct rnet_conn **node_conn; /* host: [nnodes] */
	char prefix[ZEROD_JOB_ID_MAX + 24];
	unsigned run;                           /* re-plans so far */
	char run_prefix[ZEROD_JOB_ID_MAX + 40]; /* the executor's keys since */
	char bind_addr[RNET_NAME_LEN];
	struct rdzv_store *store;
	struct coll_store store_ops;
	struct coll_net net;

	/* failures */
	bool blame_pending;
	int64_t blame_deadline;
	char blame_what[256];
};

/* The job a connection belongs to (NULL: none, or none any more). */
#define RJ(c) ((struct rdzv_job *)((c)->sc ? (c)->sc->owner : NULL))
/* What a node joined with (NULL: it has not). */
#define JR(c) ((struct joiner *)(c)->priv)

/* rdzv.c */
const char *rdzv_node_name(const struct rdzv_job *rj, uint32_t k, char *buf, size_t len);
const char *rdzv_joiner_name(const struct rnet_conn *c, char *buf, size_t len);
int rdzv_alloc_formed(struct rdzv_job *rj);
int rdzv_setup_net(struct rdzv_job *rj, const struct sockaddr *store_at, socklen_t len);
/* The first local plan (the ranks agreed on it). */
const struct plan *rdzv_local_plan(const struct rdzv_job *rj);
/* The job, as the host's side (rdzvform.c) reaches it: through these, so
 * that it needs no struct job (core-t.h). */
uint32_t rdzv_world(const struct rdzv_job *rj);
/* The plan rank registered here, NULL if none did. */
const struct plan *rdzv_plan(const struct rdzv_job *rj, uint32_t rank);
/* rank said Hello or registered here. */
bool rdzv_rank_here(const struct rdzv_job *rj, uint32_t rank);
int rdzv_join_timeout_ms(const struct rdzv_job *rj);
bool rdzv_ended(const struct rdzv_job *rj);
/* job_fail(), loud: every node hears it. */
__attribute__((format(printf, 3, 4))) void rdzv_fail(struct rdzv_job *rj, int code, const char *fmt,
						     ...);
/* job_formed(): start the executor. */
void rdzv_formed(struct rdzv_job *rj);

/* rdzvform.c: the host's side. */
void rdzv_on_join(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m);
void rdzv_joiner_free(struct joiner *jr);
/* Form once every node joined and this node is ready. */
void rdzv_maybe_form(struct rdzv_job *rj);
/* Why the job cannot form, once its join timeout passed. */
void rdzv_fail_missing(struct rdzv_job *rj);

#endif
