/*
 * rdzv.h — a job over several nodes: the rendezvous that forms it, the
 * key-value store its gloo group opens through, and the word between its
 * daemons once it runs (rdzv.c, rdzvform.c, rdzvstore.c; the transport
 * below them, which knows nothing of jobs, is net/rdzvnet.h).
 *
 * The zerod of node 0 serves the rendezvous on the host:port its trainers
 * name; every other node's zerod connects to it, proves it knows the job's
 * secret, and sends its plan and its ranks once every local rank registered.
 * When all nodes joined and agree, the host hands out the node numbering and
 * a store prefix fresh for this run; each node then starts its executor
 * (job.c's job_formed). A failure on any node is sent to the host, which
 * relays it to every node, so every rank ends with the same named error.
 *
 * Everything here runs on the loop thread and never blocks, except the store
 * (rdzv_net()'s coll_store), which the executor's start calls from its own
 * thread.
 */
#ifndef ZEROD_RDZV_H
#define ZEROD_RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct core;
struct job;
struct coll_net;

/* What a trainer's Hello says about the job's nodes. */
struct rdzv_spec {
	const char *endpoint; /* host:port */
	uint32_t nnodes;
	bool has_node_rank;
	uint32_t node_rank;
	const void *secret;
	size_t secret_len;
};

/* The daemon's side: listeners, connections, the resolver. 0 or -errno. */
int rdzv_init(struct core *core);
/* After rdzv_init(): certificates from the TLS identity id (net/tls.h's
 * tls_ident_load(), which the daemon runs before its sockets exist),
 * which it owns from now on; without, the jobs' PSKs. 0 or -ENOMEM with
 * why. */
struct tls_ident;
int rdzv_tls_use(struct core *core, struct tls_ident *id, char *why, size_t len);
/* This zerod's certificate's fingerprint, or NULL without a TLS identity. */
const char *rdzv_tls_fingerprint(const struct core *core);
/* After every job is freed. Accepts a daemon without rdzv_init(). */
void rdzv_close_all(struct core *core);
/* The nearest deadline (retries, handshakes, join timeouts), and what is due. */
int64_t rdzv_next_deadline(struct core *core);
void rdzv_tick(struct core *core, int64_t now);

/* A new job names a rendezvous: keep its settings (j->rdzv). ZC_E... with
 * err filled if they cannot serve. */
int rdzv_job_new(struct job *j, const struct rdzv_spec *sp, char *err, size_t errlen);
/* Another rank's Hello: its settings must be the job's. */
int rdzv_check_spec(const struct job *j, uint32_t rank, const struct rdzv_spec *sp, char *err,
		    size_t errlen);
/* Every local rank said Hello: serve the rendezvous (node 0) or reach it. */
void rdzv_local_joined(struct job *j);
/* Every local rank registered the same plan: this node joins. The job stays
 * forming until job_formed() (or fails with a named error). */
void rdzv_local_ready(struct job *j);
/* Where the ranks are, once formed: node_of[world], this node, the count. */
void rdzv_topology(const struct job *j, uint32_t *node_of, uint32_t *ret_node,
		   uint32_t *ret_nnodes);
/* The executor's network settings (valid until rdzv_job_free()). */
const struct coll_net *rdzv_net(struct job *j);
/* j re-plans (statex.c) or re-forms (reform.c): the next executor's group
 * opens under a store prefix of its own, fresh for this run of the
 * executor (every node counts them alike). */
void rdzv_replanned(struct job *j);
/* A local rank of j died and j re-forms at boundary `iteration` (reform.c;
 * undo: that iteration was partly stepped, every node takes it back):
 * every other node hears it, through the host (rdzv.c relays it and
 * reform_remote() applies it there). msg says what happened. */
void rdzv_reform(struct job *j, uint32_t rank, uint64_t iteration, bool undo, const char *msg);
/* j just failed here (job_fail): the other nodes are told. */
void rdzv_job_failed(struct job *j);
/* j's executor failed with `what`: true if the rendezvous fails the job
 * (naming the node that was lost, at once or within a moment), false if
 * the caller should fail it as usual. */
bool rdzv_exec_failed(struct job *j, const char *what);
void rdzv_job_free(struct job *j);

/* For the control socket (ctl.c), on the loop thread. The names ("host:port")
 * of the rendezvous listeners this zerod serves now, at most max, valid
 * until the loop goes on; how many. */
size_t rdzv_serving(const struct core *core, const char **names, size_t max);
/* j's rendezvous endpoint as its trainers name it, NULL for a job of one
 * node; *ret_serving (set when not NULL is returned): this zerod listens on
 * it now. */
const char *rdzv_job_endpoint(const struct job *j, bool *ret_serving);

#endif
