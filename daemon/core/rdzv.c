/*
 * rdzv.c — the rendezvous of a job over several nodes, on the loop thread
 * (see rdzv.h): the job's policy over the transport of net/rdzvnet.h, which
 * reports up through the callbacks registered here (net_ops). Owns each
 * job's rendezvous state (rdzv_int.h); the host's side, joins and forming,
 * is rdzvform.c.
 *
 * Roles. The node that serves the rendezvous is node 0: the one whose
 * trainers say node_rank 0, or, when the trainers leave the numbering to
 * the rendezvous, the one that holds rank 0. It listens on the port the
 * trainers name (one listener per port, shared by the jobs it hosts, a
 * connection finds its job by id). Every other node connects and retries,
 * with a growing pause, until the host answers or its join timeout passes.
 *
 * After forming. Each node keeps its connection to the host. A job that
 * fails anywhere is reported to the host, which relays it to every node;
 * a quiet end (a rank left between iterations) carries the iteration it
 * ended before, and a node that is still finishing that iteration ends after
 * it (that policy is the job's: job.c's job_end_remote). The host tells every node when it loses
 * one's connection. A failed collective waits up to RDZV_BLAME_MS for word of a lost node, so every
 * survivor's error names it. Losing the connection to the host alone does
 * not stop a running job: gloo's mesh does not need the rendezvous; only
 * a new run of the job id, which needs it again, fails (at its join timeout).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "common.h"
#include "base/config.h"
#include "core/job.h"
#include "core/sched.h"
#include "base/log.h"
#include "base/loop.h"
#include "core/rdzv.h"
#include "core/reform.h"
#include "core/rdzv_int.h"
#include "core/rdzvstore.h"
#include "net/rdzvnet.h"
#include "net/rdzvwire.h"
#include "net/tls.h"
#include "wire.h"

#define RDZV_RETRY_MIN_MS 50
#define RDZV_RETRY_MAX_MS 1000
#define RDZV_BLAME_MS     1000 /* a failed collective waits this long to learn who went */

_Static_assert(RDZV_MAX_WORLD == ZEROD_MAX_WORLD, "rdzv_int.h's RDZV_MAX_WORLD is stale");

const char *rdzv_node_name(const struct rdzv_job *rj, uint32_t k, char *buf, size_t len)
{
	snprintf(buf, len, "node %u (%s)", k, rj->names ? rj->names[k] : "?");
	return buf;
}

/* How a host names a node that joined: its index if known, its address. */
const char *rdzv_joiner_name(const struct rnet_conn *c, char *buf, size_t len)
{
	const struct rdzv_job *rj = RJ(c);
	char host[RNET_NAME_LEN];

	if (rj && rj->formed) {
		for (uint32_t k = 0; k < rj->nnodes; k++)
			if (rj->node_conn[k] == c)
				return rdzv_node_name(rj, k, buf, len);
	}
	snprintf(host, sizeof(host), "%s", c->peer);
	if (strrchr(host, ':') && host[0] != '[')
		*strrchr(host, ':') = '\0';
	if (JR(c) && JR(c)->has_idx)
		snprintf(buf, len, "node %u (%s)", JR(c)->idx, host);
	else
		snprintf(buf, len, "the node at %s", host);
	return buf;
}

/* -------------------------------------------------------- failures --- */

static void fail_lost(struct rdzv_job *rj, uint32_t k, const char *what)
{
	char name[RNET_NAME_LEN + 16];

	rj->blame_pending = false;
	job_fail(rj->j, ZC_ERANKDEAD, true, "%s was lost: %s",
		 rdzv_node_name(rj, k, name, sizeof(name)), what);
}

/* Node k's connection went: name it if a failed collective waits for that. */
static void node_lost(struct rdzv_job *rj, uint32_t k)
{
	if (!rj->formed || k >= rj->nnodes || rj->lost[k])
		return;
	rj->lost[k] = true;
	if (rj->blame_pending && !job_ended(rj->j))
		fail_lost(rj, k, rj->blame_what);
}

void rdzv_job_failed(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;
	uint64_t iter = j->iter;
	char msg[400], name[RNET_NAME_LEN + 16];

	rj->blame_pending = false;
	if (j->end_remote)
		return; /* the host relays it; a node that was told has nothing to add */
	if (!rj->hosting) {
		if (rj->up && rj->up->st == CS_OPEN)
			rnet_send_fail(rj->up, j->err, j->errmsg, iter, j->quiet_end);
		return;
	}
	if (rj->formed)
		rdzv_node_name(rj, rj->node, name, sizeof(name));
	else
		snprintf(name, sizeof(name), "node 0 (the rendezvous)");
	snprintf(msg, sizeof(msg), "on %s: %s", name, j->errmsg);
	for (struct rnet_conn *c = rnet_conns(rj->rd->net); c; c = c->next)
		if (RJ(c) == rj && c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN && c->st == CS_OPEN)
			rnet_send_fail(c, j->err, msg, iter, j->quiet_end);
}

bool rdzv_exec_failed(struct job *j, const char *what)
{
	struct rdzv_job *rj = j->rdzv;

	if (!rj->formed)
		return false;
	for (uint32_t k = 0; k < rj->nnodes; k++)
		if (rj->lost[k]) {
			fail_lost(rj, k, what);
			return true;
		}
	rj->blame_pending = true;
	rj->blame_deadline = now_ms() + RDZV_BLAME_MS;
	snprintf(rj->blame_what, sizeof(rj->blame_what), "%s", what);
	return true;
}

/* Whether c speaks for a node of rj: one of the formed job's nodes, or,
 * before it formed, a connection that sent its Join. */
static bool is_member(const struct rdzv_job *rj, const struct rnet_conn *c)
{
	if (!rj->formed)
		return JR(c) != NULL;
	for (uint32_t k = 0; k < rj->nnodes; k++)
		if (rj->node_conn[k] == c)
			return true;
	return false;
}

/* The host: a node's job failed there. Every other node hears it now,
 * then it applies here. Only a node of the job may say so (for its own
 * ranks: a Fail names no other): a connection that proved the secret but
 * never joined is closed, and the job goes on. */
static void on_node_fail(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = RJ(c);
	const Zerod__V1__RdzvFail *f = m->fail;
	uint64_t iter = f->has_iteration ? f->iteration : UINT64_MAX;
	int code = wire_error_from_pb(f->code);
	char msg[400], name[RNET_NAME_LEN + 16];

	if (job_ended(rj->j))
		return;
	if (!is_member(rj, c)) {
		log_warning("job %s: rendezvous: a Fail from %s, which is not a node of the job, "
			    "refused; the job goes on",
			    rj->j->id, c->peer);
		rnet_gone(c, "a Fail from a connection that is not a node of the job");
		return;
	}
	snprintf(msg, sizeof(msg), "on %s: %s", rdzv_joiner_name(c, name, sizeof(name)),
		 f->message);
	for (struct rnet_conn *o = rnet_conns(rj->rd->net); o; o = o->next)
		if (o != c && RJ(o) == rj && o->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
		    o->st == CS_OPEN)
			rnet_send_fail(o, code, msg, iter, f->quiet);
	job_end_remote(rj->j, code, f->quiet, iter, msg);
}

/* A node: the host says the job failed (or refuses this node). */
static void on_host_fail(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = RJ(c);
	const Zerod__V1__RdzvFail *f = m->fail;
	int code = wire_error_from_pb(f->code);

	if (code == ZC_ESTATE && !rj->formed) {
		/* not serving the job yet, or another secret (a refusal says
		 * nothing more before the secret is proven): ask again later */
		snprintf(rj->refusal, sizeof(rj->refusal), "%s", f->message);
		rnet_gone(c, f->message);
		return;
	}
	job_end_remote(rj->j, code, f->quiet, f->has_iteration ? f->iteration : UINT64_MAX,
		       f->message);
}

void rdzv_reform(struct job *j, uint32_t rank, uint64_t iteration, bool undo, const char *msg)
{
	struct rdzv_job *rj = j->rdzv;
	char text[400], name[RNET_NAME_LEN + 16];

	if (!rj->hosting) {
		if (rj->up && rj->up->st == CS_OPEN)
			rnet_send_reform(rj->up, rank, iteration, undo, msg);
		return;
	}
	snprintf(text, sizeof(text), "on %s: %s", rdzv_node_name(rj, rj->node, name, sizeof(name)),
		 msg);
	for (struct rnet_conn *c = rnet_conns(rj->rd->net); c; c = c->next)
		if (RJ(c) == rj && c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN && c->st == CS_OPEN)
			rnet_send_reform(c, rank, iteration, undo, text);
}

/* The host: a rank of a node died and the job re-forms. Only a node of the
 * formed job may say so, and only of its own ranks (anything else is
 * refused, and the job goes on); every other node hears it, then it
 * applies here. */
static void on_node_reform(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = RJ(c);
	const Zerod__V1__RdzvReform *f = m->reform;
	char msg[400], name[RNET_NAME_LEN + 16];
	uint32_t k = 0;

	if (job_ended(rj->j))
		return;
	while (rj->formed && k < rj->nnodes && rj->node_conn[k] != c)
		k++;
	if (!rj->formed || k == rj->nnodes || f->rank >= rj->j->world ||
	    rj->node_of[f->rank] != k) {
		log_warning("job %s: rendezvous: a Reform of rank %u from %s, which is not a node "
			    "of the job holding that rank, refused; the job goes on",
			    rj->j->id, f->rank, c->peer);
		rnet_gone(c, "a Reform from a connection that is not the node of its rank");
		return;
	}
	snprintf(msg, sizeof(msg), "on %s: %s", rdzv_node_name(rj, k, name, sizeof(name)),
		 f->message);
	for (struct rnet_conn *o = rnet_conns(rj->rd->net); o; o = o->next)
		if (o != c && RJ(o) == rj && o->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN &&
		    o->st == CS_OPEN)
			rnet_send_reform(o, f->rank, f->iteration, f->undo, msg);
	reform_remote(rj->j, f->rank, f->iteration, f->undo, msg);
}

/* A node: the host says a rank of another node died. */
static void on_host_reform(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = RJ(c);
	const Zerod__V1__RdzvReform *f = m->reform;

	if (!rj->formed || f->rank >= rj->j->world || rj->node_of[f->rank] == rj->node)
		return; /* not of a formed job, or of our own rank: we said it */
	reform_remote(rj->j, f->rank, f->iteration, f->undo, f->message);
}

static void on_node_lost(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	struct rdzv_job *rj = RJ(c);
	char name[RNET_NAME_LEN + 16];

	if (!rj->formed || m->node_lost->node >= rj->nnodes)
		return;
	log_notice("job %s: the rendezvous lost %s", rj->j->id,
		   rdzv_node_name(rj, m->node_lost->node, name, sizeof(name)));
	node_lost(rj, m->node_lost->node);
}

/* ------------------------------------------------------- forming --- */

/* The executor's network: a store client of the rendezvous, this node's
 * address (the one its connection to the host leaves from). */
int rdzv_setup_net(struct rdzv_job *rj, const struct sockaddr *store_at, socklen_t len)
{
	struct core *core = rj->rd->core;
	const struct tls_ident *tls = rnet_tls(rj->rd->net);
	int r = rdzv_store_new(store_at, len, rj->j->id, rj->secret, rj->secret_len, tls,
			       core->cfg->stall_timeout_ms, &rj->store);

	if (r < 0)
		return r;
	rj->store_ops = rdzv_store_ops(rj->store);
	rj->net = (struct coll_net){
		.nnodes = rj->nnodes,
		.node = rj->node,
		.node_of = rj->node_of,
		.host = rj->bind_addr,
		.prefix = rj->prefix,
		.store = &rj->store_ops,
		.timeout_ms = (uint32_t)core->cfg->stall_timeout_ms,
		.tls = tls,
		.ktls = core->cfg->tls_ktls,
	};
	return 0;
}

int rdzv_alloc_formed(struct rdzv_job *rj)
{
	uint32_t w = rj->j->world, n = rj->nnodes;

	rj->node_of = calloc(w, sizeof(*rj->node_of));
	rj->names = calloc(n, sizeof(*rj->names));
	rj->lost = calloc(n, sizeof(*rj->lost));
	rj->node_conn = calloc(n, sizeof(*rj->node_conn));
	return rj->node_of && rj->names && rj->lost && rj->node_conn ? 0 : -ENOMEM;
}

/* The host's first local plan (the ranks agreed on it). */
const struct plan *rdzv_local_plan(const struct rdzv_job *rj)
{
	const struct job *j = rj->j;

	for (uint32_t r = 0; r < j->world; r++)
		if (j->plans[r])
			return j->plans[r];
	return NULL;
}

uint32_t rdzv_world(const struct rdzv_job *rj)
{
	return rj->j->world;
}

const struct plan *rdzv_plan(const struct rdzv_job *rj, uint32_t rank)
{
	return rj->j->plans[rank];
}

bool rdzv_rank_here(const struct rdzv_job *rj, uint32_t rank)
{
	return rj->j->ranks[rank] || rj->j->plans[rank];
}

int rdzv_join_timeout_ms(const struct rdzv_job *rj)
{
	return rj->j->core->cfg->join_timeout_ms;
}

bool rdzv_ended(const struct rdzv_job *rj)
{
	return job_ended(rj->j);
}

void rdzv_fail(struct rdzv_job *rj, int code, const char *fmt, ...)
{
	char msg[sizeof(rj->j->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	job_fail(rj->j, code, true, "%s", msg);
}

void rdzv_formed(struct rdzv_job *rj)
{
	job_formed(rj->j);
}

/* ------------------------------------------------- the host's side --- */

/* A PSK handshake on ls: the job this zerod hosts there whose PSK has
 * that identity. */
static const struct rnet_scope *net_psk(void *ctx, const struct rnet_listener *ls,
					const uint8_t id[32])
{
	struct core *core = ctx;

	for (struct job *j = core->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (rj && rj->hosting && rj->lst == ls && !job_ended(j) &&
		    tls_equal(rj->sc.psk_id, id, sizeof(rj->sc.psk_id)))
			return &rj->sc;
	}
	return NULL;
}

/* A Hello on ls names job id: the job this zerod hosts there, or NULL and
 * why (for the log: the peer hears the one refusal of every unproven
 * peer). */
static struct rnet_scope *net_hello(void *ctx, const struct rnet_listener *ls, const char *id,
				    int *ret_code, char *msg, size_t len)
{
	struct core *core = ctx;
	struct rdzv_job *ended = NULL;

	for (struct job *j = core->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || !rj->hosting || rj->lst != ls || strcmp(j->id, id) != 0)
			continue;
		if (!job_ended(j))
			return &rj->sc;
		ended = rj;
	}
	if (!ended) {
		snprintf(msg, len, "the zerod at %s does not serve job %s (yet, or any more)",
			 rnet_listener_name(ls), id);
		*ret_code = ZC_ESTATE;
		return NULL;
	}
	snprintf(msg, len, "job %s failed on node 0: %s: %.160s", id,
		 zc_strerror_name(ended->j->err), ended->j->errmsg);
	*ret_code = ZC_EJOBFAILED;
	return NULL;
}

/* Serve the port of rj's endpoint, or join the listener already there
 * (unless another job of that id hosts on it). */
static int start_hosting(struct rdzv_job *rj, char *err, size_t errlen)
{
	struct rnet_listener *ls;
	int r = rnet_listen(rj->rd->net, &rj->addr, rj->addrlen, rj->endpoint, &ls, err, errlen);

	if (r < 0)
		return r;
	for (struct job *o = rj->rd->core->jobs; o; o = o->next)
		if (o != rj->j && o->rdzv && o->rdzv->lst == ls && !job_ended(o) &&
		    strcmp(o->id, rj->j->id) == 0) {
			snprintf(err, errlen,
				 "another user's job %s serves its rendezvous on %s already",
				 rj->j->id, rnet_listener_name(ls));
			rnet_listener_put(ls);
			return ZC_EDUPRANK;
		}
	rj->lst = ls;
	return 0;
}

/* -------------------------------------------------- a node's side --- */

static void schedule_retry(struct rdzv_job *rj, const char *why)
{
	snprintf(rj->last_err, sizeof(rj->last_err), "%s", why);
	rj->retry_ms = rj->retry_ms ? MIN(rj->retry_ms * 2, RDZV_RETRY_MAX_MS) : RDZV_RETRY_MIN_MS;
	rj->retry_at = now_ms() + rj->retry_ms;
	rj->join_sent = false;
}

static void send_join(struct rdzv_job *rj)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvJoin jn = ZEROD__V1__RDZV_JOIN__INIT;
	Zerod__V1__Plan pb = ZEROD__V1__PLAN__INIT;
	struct job *j = rj->j;
	uint32_t ranks[j->world], n = 0;

	for (uint32_t r = 0; r < j->world; r++)
		if (j->plans[r])
			ranks[n++] = r;
	if (plan_to_pb(rdzv_local_plan(rj), &pb) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory joining the rendezvous");
		return;
	}
	jn.world_size = j->world;
	jn.nnodes = rj->nnodes;
	jn.has_node_rank = rj->has_node_rank;
	jn.node_rank = rj->node_rank;
	jn.n_ranks = n;
	jn.ranks = ranks;
	jn.plan = &pb;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN;
	env.join = &jn;
	rnet_send(rj->up, &env);
	plan_pb_free(&pb);
	rj->join_sent = true;
	log_info("job %s: joined the rendezvous at %s with %u ranks", j->id, rj->endpoint, n);
}

static void connect_up(struct rdzv_job *rj)
{
	struct rnet_conn *c;
	char why[160];
	int r = rnet_connect(rj->rd->net, &rj->sc, &rj->addr, rj->addrlen, rj->endpoint, &c, why,
			     sizeof(why));

	if (c)
		rj->up = c;
	if (r < 0)
		schedule_retry(rj, why);
}

static void on_formed(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	const Zerod__V1__RdzvFormed *f = m->formed;
	struct rdzv_job *rj = RJ(c);
	struct job *j = rj->j;
	bool bad;

	if (job_ended(j))
		return; /* it failed here meanwhile, and the host was told */
	bad = f->node >= rj->nnodes || f->n_node_of != j->world || f->n_names != rj->nnodes ||
	      !f->prefix[0] || strlen(f->prefix) >= sizeof(rj->prefix) || rj->formed ||
	      !rj->join_sent;

	if (!bad && rdzv_alloc_formed(rj) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory forming the job");
		return;
	}
	for (uint32_t r = 0; r < j->world && !bad; r++) {
		bool here = j->plans[r] != NULL;
		bad = f->node_of[r] >= rj->nnodes || here != (f->node_of[r] == f->node);
		rj->node_of[r] = f->node_of[r];
	}
	if (bad) {
		job_fail(j, ZC_EPROTO, true, "the rendezvous at %s formed the job wrongly",
			 rj->endpoint);
		return;
	}
	for (uint32_t k = 0; k < rj->nnodes; k++)
		snprintf(rj->names[k], RNET_NAME_LEN, "%s", f->names[k]);
	snprintf(rj->prefix, sizeof(rj->prefix), "%s", f->prefix);
	rj->node = f->node;
	rj->host_node = 0; /* the host is node 0, by its trainers' word or by holding rank 0 */
	rnet_local_name(c->fd, rj->bind_addr, sizeof(rj->bind_addr));
	if (rdzv_setup_net(rj, (struct sockaddr *)&rj->addr, rj->addrlen) < 0) {
		job_fail(j, ZC_ELIMIT, true, "out of memory forming the job");
		return;
	}
	rj->formed = true;
	log_info("job %s: formed: this is node %u of %u (rendezvous %s)", j->id, rj->node,
		 rj->nnodes, rj->endpoint);
	job_formed(j);
}

/* ------------------------------------------------ connection events --- */

/* c is gone (closed, broken, refused the node): what that means for its
 * job. The transport marked it dead and frees it. */
static void net_gone(void *ctx, struct rnet_conn *c, const char *why)
{
	struct rdzv_job *rj = RJ(c);
	char name[RNET_NAME_LEN + 16];

	(void)ctx;
	if (!c->server && rj->up == c) {
		rj->up = NULL;
		c->sc = NULL;
		if (job_ended(rj->j))
			return;
		if (!rj->formed) {
			/* a TLS handshake that failed, or a connection broken before
			 * the Welcome, is the host's refusal (under a PSK the only
			 * one it gives; of a certificate, TLS 1.3 tells the client
			 * after its handshake): named at the join timeout */
			if (c->st == CS_TLS || c->st == CS_HELLO)
				snprintf(rj->refusal, sizeof(rj->refusal), "%s", why);
			schedule_retry(rj, why);
			return;
		}
		log_notice("job %s: lost the rendezvous at %s (%s); the job goes on until it "
			   "needs it",
			   rj->j->id, rj->endpoint, why);
		node_lost(rj, rj->host_node);
		return;
	}
	if (c->server && c->kind == ZEROD__V1__RDZV_KIND__RDZV_JOIN && JR(c) && !job_ended(rj->j)) {
		if (!rj->formed) {
			log_notice("job %s: rendezvous: %s left before the job formed (%s)",
				   rj->j->id, c->peer, why);
			c->sc = NULL;
			return;
		}
		for (uint32_t k = 0; k < rj->nnodes; k++) {
			Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
			Zerod__V1__RdzvNodeLost nl = ZEROD__V1__RDZV_NODE_LOST__INIT;
			if (rj->node_conn[k] != c)
				continue;
			log_notice("job %s: rendezvous: lost %s (%s)", rj->j->id,
				   rdzv_node_name(rj, k, name, sizeof(name)), why);
			rj->node_conn[k] = NULL;
			nl.node = k;
			env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST;
			env.node_lost = &nl;
			for (uint32_t q = 0; q < rj->nnodes; q++)
				if (rj->node_conn[q])
					rnet_send(rj->node_conn[q], &env);
			node_lost(rj, k);
		}
	}
	c->sc = NULL;
}

/* ---------------------------------------------------- the resolver --- */

/* The rendezvous's address (net/resolve.c, called back on the loop thread):
 * serve it, or reach it. */
static void resolved(void *arg, int err, const char *why, const struct sockaddr_storage *addr,
		     socklen_t addrlen)
{
	struct rdzv_job *rj = arg;
	char msg[256];
	int r;

	rj->res = NULL;
	if (job_ended(rj->j))
		return;
	if (err) {
		job_fail(rj->j, ZC_ECONNECT, true, "rendezvous %s: %s", rj->endpoint, why);
		return;
	}
	rj->addr = *addr;
	rj->addrlen = addrlen;
	rj->resolved = true;
	if (!rj->hosting) {
		connect_up(rj);
		return;
	}
	r = start_hosting(rj, msg, sizeof(msg));
	if (r < 0) {
		job_fail(rj->j, r, true, "%s", msg);
		return;
	}
	rdzv_maybe_form(rj);
}

static void start_resolve(struct rdzv_job *rj)
{
	int r = rnet_resolve(rj->rd->net, rj->host, rj->port, resolved, rj, &rj->res);

	if (r == -ENOMEM)
		job_fail(rj->j, ZC_ELIMIT, true, "out of memory");
	else if (r < 0)
		job_fail(rj->j, ZC_ELIMIT, true, "cannot start a thread to resolve %s",
			 rj->endpoint);
}

/* ----------------------------------------------- the transport's table --- */

/* A node's connection to the host passed its handshake. */
static void net_open(void *ctx, struct rnet_conn *c)
{
	struct rdzv_job *rj = RJ(c);

	(void)ctx;
	rj->retry_ms = 0;
	if (rj->local_ready && !rj->join_sent)
		send_join(rj);
}

static void net_refused(void *ctx, struct rnet_conn *c, int code, const char *msg)
{
	(void)ctx;
	job_fail(RJ(c)->j, code, true, "%s", msg);
}

static void net_message(void *ctx, struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	(void)ctx;
	switch (m->body_case) {
	case ZEROD__V1__RDZV_ENVELOPE__BODY_JOIN:
		rdzv_on_join(c, m);
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_FAIL:
		if (c->server)
			on_node_fail(c, m);
		else
			on_host_fail(c, m);
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED:
		on_formed(c, m);
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_NODE_LOST:
		on_node_lost(c, m);
		break;
	case ZEROD__V1__RDZV_ENVELOPE__BODY_REFORM:
		if (c->server)
			on_node_reform(c, m);
		else
			on_host_reform(c, m);
		break;
	default:
		break; /* the transport's table routes nothing else here */
	}
}

static void net_freed(void *ctx, struct rnet_conn *c)
{
	struct rdzv_job *rj = RJ(c);

	(void)ctx;
	if (rj) {
		if (rj->up == c)
			rj->up = NULL;
		for (uint32_t k = 0; rj->node_conn && k < rj->nnodes; k++)
			if (rj->node_conn[k] == c)
				rj->node_conn[k] = NULL;
	}
	rdzv_joiner_free(JR(c));
	c->priv = NULL;
}

static const struct rnet_ops net_ops = {
	.psk = net_psk,
	.hello = net_hello,
	.message = net_message,
	.open = net_open,
	.refused = net_refused,
	.gone = net_gone,
	.freed = net_freed,
};

/* ------------------------------------------------------- the jobs --- */

int rdzv_job_new(struct job *j, const struct rdzv_spec *sp, char *err, size_t errlen)
{
	struct rdzv_job *rj;

	if (!j->core->rdzv) {
		snprintf(err, errlen, "this zerod cannot serve jobs over several nodes");
		return ZC_ENOTSUP;
	}
	if (sp->secret_len == 0 || sp->secret_len > RDZV_SECRET_MAX) {
		snprintf(err, errlen, "a job over several nodes needs a secret of 1..%d bytes",
			 RDZV_SECRET_MAX);
		return ZC_EPROTO;
	}
	rj = calloc(1, sizeof(*rj));
	if (!rj) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (!rdzv_split_endpoint(sp->endpoint, rj->host, sizeof(rj->host), rj->port,
				 sizeof(rj->port))) {
		snprintf(err, errlen, "rendezvous \"%.64s\": want host:port", sp->endpoint);
		free(rj);
		return ZC_EPROTO;
	}
	/* a zerod running as root must not squat a privileged port for anyone */
	if (atoi(rj->port) < 1024 && j->uid != 0) {
		snprintf(err, errlen, "rendezvous port %s: ports below 1024 only for root's jobs",
			 rj->port);
		free(rj);
		return ZC_EPROTO;
	}
	rj->j = j;
	rj->rd = j->core->rdzv;
	snprintf(rj->endpoint, sizeof(rj->endpoint), "%s", sp->endpoint);
	rj->nnodes = sp->nnodes;
	rj->has_node_rank = sp->has_node_rank;
	rj->node_rank = sp->node_rank;
	memcpy(rj->secret, sp->secret, sp->secret_len);
	rj->secret_len = sp->secret_len;
	rj->sc = (struct rnet_scope){.id = j->id,
				     .secret = rj->secret,
				     .secret_len = rj->secret_len,
				     .endpoint = rj->endpoint,
				     .prefix = rj->prefix,
				     .owner = rj};
	rnet_scope_keys(&rj->sc);
	j->rdzv = rj;
	return 0;
}

int rdzv_check_spec(const struct job *j, uint32_t rank, const struct rdzv_spec *sp, char *err,
		    size_t errlen)
{
	const struct rdzv_job *rj = j->rdzv;
	const char *field = NULL;

	if (!rj != !sp)
		field = "rendezvous (ZEROD_RDZV)";
	else if (!rj)
		return 0;
	else if (strcmp(rj->endpoint, sp->endpoint) != 0)
		field = "rendezvous (ZEROD_RDZV)";
	else if (rj->nnodes != sp->nnodes)
		field = "node count (ZEROD_NNODES)";
	else if (rj->has_node_rank != sp->has_node_rank || rj->node_rank != sp->node_rank)
		field = "node rank (ZEROD_NODE_RANK)";
	else if (rj->secret_len != sp->secret_len ||
		 !tls_equal(rj->secret, sp->secret, sp->secret_len))
		field = "secret (ZEROD_JOB_SECRET)";
	if (!field)
		return 0;
	snprintf(err, errlen, "job %s: rank %u names another %s than the ranks before it", j->id,
		 rank, field);
	return ZC_EWORLD;
}

void rdzv_local_joined(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	rj->hosting = rj->has_node_rank ? rj->node_rank == 0 : j->ranks[0] != NULL;
	log_info("job %s: %s the rendezvous at %s (%u nodes)", j->id,
		 rj->hosting ? "serving" : "joining", rj->endpoint, rj->nnodes);
	start_resolve(rj);
}

void rdzv_local_ready(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	rj->local_ready = true;
	rj->ready_ms = now_ms();
	if (rj->hosting)
		rdzv_maybe_form(rj);
	else if (rj->up && rj->up->st == CS_OPEN && !rj->join_sent)
		send_join(rj);
}

void rdzv_topology(const struct job *j, uint32_t *node_of, uint32_t *ret_node, uint32_t *ret_nnodes)
{
	const struct rdzv_job *rj = j->rdzv;

	memcpy(node_of, rj->node_of, j->world * sizeof(*node_of));
	*ret_node = rj->node;
	*ret_nnodes = rj->nnodes;
}

const struct coll_net *rdzv_net(struct job *j)
{
	return &j->rdzv->net;
}

void rdzv_replanned(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	/* under the job's prefix (node 0's store takes nothing else), and the
	 * same on every node: each counts the job's re-plans alike */
	rj->run++;
	rdzv_store_resume(rj->store);
	snprintf(rj->run_prefix, sizeof(rj->run_prefix), "%sp%u/", rj->prefix, rj->run);
	rj->net.prefix = rj->run_prefix;
}

void rdzv_job_free(struct job *j)
{
	struct rdzv_job *rj = j->rdzv;

	if (!rj)
		return;
	rnet_resolve_cancel(rj->res);
	for (struct rnet_conn *c = rnet_conns(rj->rd->net), *next; c; c = next) {
		next = c->next;
		if (RJ(c) == rj)
			rnet_conn_free(c);
	}
	rnet_listener_put(rj->lst);
	rdzv_store_free(rj->store);
	rnet_kv_clear(&rj->sc);
	free(rj->node_of);
	free(rj->names);
	free(rj->lost);
	free(rj->node_conn);
	tls_wipe(rj->secret, sizeof(rj->secret));
	tls_wipe(rj->sc.psk_key, sizeof(rj->sc.psk_key));
	free(rj);
	j->rdzv = NULL;
}

/* ------------------------------------------------------- deadlines --- */

static int64_t job_deadline(const struct rdzv_job *rj, bool *ret_joined)
{
	const struct core *core = rj->rd->core;
	bool joined = !rj->hosting && rj->join_sent && rj->up && rj->up->st == CS_OPEN;

	*ret_joined = joined;
	if (!rj->local_ready || rj->formed || job_ended(rj->j))
		return LOOP_NEVER;
	/* a node that joined leaves the verdict to the host, which relays
	 * it; its own clock only guards against a host that went silent */
	if (joined)
		return rj->ready_ms + 2 * (int64_t)core->cfg->join_timeout_ms + 5000;
	return rj->ready_ms + core->cfg->join_timeout_ms;
}

int64_t rdzv_next_deadline(struct core *core)
{
	struct rdzv_daemon *rd = core->rdzv;
	int64_t next = LOOP_NEVER;
	bool joined;

	if (!rd)
		return next;
	next = rnet_next_deadline(rd->net);
	if (next == 0)
		return 0;
	for (struct job *j = core->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || job_ended(j))
			continue;
		next = MIN(next, job_deadline(rj, &joined));
		if (rj->blame_pending)
			next = MIN(next, rj->blame_deadline);
		if (!rj->hosting && rj->resolved && !rj->up && !rj->formed)
			next = MIN(next, rj->retry_at);
	}
	return next;
}

void rdzv_tick(struct core *core, int64_t now)
{
	struct rdzv_daemon *rd = core->rdzv;
	bool joined;

	if (!rd)
		return;
	for (struct job *j = core->jobs; j; j = j->next) {
		struct rdzv_job *rj = j->rdzv;
		if (!rj || job_ended(j))
			continue;
		if (rj->blame_pending && now >= rj->blame_deadline) {
			rj->blame_pending = false;
			job_fail(j, ZC_EINTERNAL, true, "%s (no node was reported lost)",
				 rj->blame_what);
			continue;
		}
		if (now >= job_deadline(rj, &joined)) {
			if (rj->hosting)
				rdzv_fail_missing(rj);
			else if (joined)
				job_fail(j, ZC_ETIMEDOUT, true,
					 "the rendezvous at %s (node 0) has not formed the job in "
					 "%d ms",
					 rj->endpoint, (int)(now - rj->ready_ms));
			else
				job_fail(j, ZC_ETIMEDOUT, true,
					 "node 0 did not let this node join within %d ms: %s%s"
					 "the rendezvous at %s: %s",
					 core->cfg->join_timeout_ms, rj->refusal,
					 rj->refusal[0] ? "; last try: " : "", rj->endpoint,
					 rj->last_err[0] ? rj->last_err : "no answer");
			continue;
		}
		if (!rj->hosting && rj->resolved && !rj->up && !rj->formed && now >= rj->retry_at)
			connect_up(rj);
	}
	rnet_tick(rd->net, now);
}

/* ------------------------------------------------------- the daemon --- */

int rdzv_init(struct core *core)
{
	struct rdzv_daemon *rd = calloc(1, sizeof(*rd));
	int r;

	if (!rd)
		return -ENOMEM;
	rd->core = core;
	r = rnet_new(core->loop, &core->cfg->hello_timeout_ms, &net_ops, core, &rd->net);
	if (r < 0) {
		free(rd);
		return r;
	}
	core->rdzv = rd;
	return 0;
}

void rdzv_close_all(struct core *core)
{
	struct rdzv_daemon *rd = core->rdzv;

	if (!rd)
		return;
	rnet_free(rd->net);
	free(rd);
	core->rdzv = NULL;
}

/* ------------------------------------------- for the control socket --- */

size_t rdzv_serving(const struct core *core, const char **names, size_t max)
{
	return rnet_serving(core->rdzv ? core->rdzv->net : NULL, names, max);
}

const char *rdzv_job_endpoint(const struct job *j, bool *ret_serving)
{
	if (!j->rdzv)
		return NULL;
	*ret_serving = j->rdzv->hosting && j->rdzv->lst;
	return j->rdzv->endpoint;
}

int rdzv_tls_use(struct core *core, struct tls_ident *id, char *why, size_t len)
{
	return rnet_tls_use(core->rdzv->net, id, why, len);
}

const char *rdzv_tls_fingerprint(const struct core *core)
{
	const struct tls_ident *id = core->rdzv ? rnet_tls(core->rdzv->net) : NULL;

	return id ? tls_ident_fingerprint(id) : NULL;
}
