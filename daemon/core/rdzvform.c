/*
 * rdzvform.c — the host's side of a job's rendezvous (rdzv.h): the nodes
 * that join, and forming the job once all did, on the loop thread. It owns
 * what a node joined with (struct joiner, its connection's priv); the rest
 * of the job's rendezvous state is rdzv.c's (rdzv_int.h), and the job is
 * reached only through rdzv_int.h's accessors.
 *
 * Forming. A node joins with its world size, node count, node index (if its
 * trainers gave one), its ranks and its plan. Once every node joined, the
 * host checks, in this order: node count, world size, node indices (given
 * ones unique and in range; the others fill the free indices in the order of
 * their lowest rank), the plans (plan_diff: the first differing field), and
 * that every rank is on exactly one node. A failed check fails the job on
 * every node with the same message; else every node gets the numbering, the
 * nodes' addresses (for messages) and a store prefix fresh for this run
 * ("<job>/<random>/"), and starts its executor.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/rdzv_int.h"
#include "net/tls.h"
#include "plan.h"
#include "wire.h"

void rdzv_joiner_free(struct joiner *jr)
{
	if (!jr)
		return;
	free(jr->ranks);
	plan_free(jr->plan);
	free(jr);
}

/* What one node brings to the table, the host's own included. */
struct member {
	struct rnet_conn *c; /* NULL: the host */
	char name[RNET_NAME_LEN + 16];
	uint32_t world, nnodes;
	bool has_idx;
	uint32_t idx;
	const uint32_t *ranks;
	uint32_t nranks;
	const struct plan *plan;
	uint32_t lowest;
	uint32_t node; /* assigned */
};

static int by_lowest(const void *a, const void *b)
{
	const struct member *x = *(const struct member *const *)a;
	const struct member *y = *(const struct member *const *)b;

	return x->lowest < y->lowest ? -1 : x->lowest > y->lowest;
}

/* Number the nodes: given indices first, the rest in order of their lowest
 * rank. 0, or a code with msg saying which nodes clash. */
static int assign_nodes(struct rdzv_job *rj, struct member *mb, uint32_t n, char *msg, size_t len)
{
	struct member *taken[n], *rest[n];
	uint32_t nrest = 0, next = 0;

	memset(taken, 0, sizeof(taken));
	for (uint32_t k = 0; k < n; k++) {
		struct member *m = &mb[k];
		if (!m->has_idx) {
			rest[nrest++] = m;
			continue;
		}
		if (taken[m->idx]) {
			snprintf(msg, len, "node %u is claimed by %s and by %s", m->idx,
				 taken[m->idx]->name, m->name);
			return ZC_EWORLD;
		}
		taken[m->idx] = m;
	}
	/* the host is node 0: by its trainers' word, or because it holds rank 0 */
	if (!mb[0].has_idx && taken[0]) {
		snprintf(msg, len,
			 "node 0 is claimed by %s, but %s serves the rendezvous (it holds rank 0)",
			 taken[0]->name, mb[0].name);
		return ZC_EWORLD;
	}
	qsort(rest, nrest, sizeof(rest[0]), by_lowest);
	for (uint32_t i = 0; i < nrest; i++) {
		while (taken[next])
			next++;
		taken[next] = rest[i];
	}
	for (uint32_t k = 0; k < n; k++)
		taken[k]->node = k;
	(void)rj;
	return 0;
}

/* Every rank on exactly one node: 0, or a code with msg. */
static int check_ranks(struct rdzv_job *rj, struct member *mb, uint32_t n, char *msg, size_t len)
{
	uint32_t w = rdzv_world(rj), missing = 0;
	size_t at;

	for (uint32_t r = 0; r < w; r++)
		rj->node_of[r] = UINT32_MAX;
	for (uint32_t k = 0; k < n; k++)
		for (uint32_t i = 0; i < mb[k].nranks; i++) {
			uint32_t r = mb[k].ranks[i], prev = rj->node_of[r];
			if (prev != UINT32_MAX) {
				for (uint32_t q = 0; q < n; q++)
					if (mb[q].node == prev)
						snprintf(msg, len, "rank %u is on %s and on %s", r,
							 mb[q].name, mb[k].name);
				return ZC_EDUPRANK;
			}
			rj->node_of[r] = mb[k].node;
		}
	at = (size_t)snprintf(msg, len, "no node has rank");
	for (uint32_t r = 0; r < w; r++)
		if (rj->node_of[r] == UINT32_MAX && at + 16 < len)
			at += (size_t)snprintf(msg + at, len - at, "%s %u", missing++ ? "," : "",
					       r);
	return missing ? ZC_EWORLD : 0;
}

static void send_formed(struct rdzv_job *rj, struct rnet_conn *c, uint32_t node)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__RdzvFormed f = ZEROD__V1__RDZV_FORMED__INIT;
	char *names[rj->nnodes];

	for (uint32_t k = 0; k < rj->nnodes; k++)
		names[k] = rj->names[k];
	f.node = node;
	f.n_node_of = rdzv_world(rj);
	f.node_of = rj->node_of;
	f.prefix = rj->prefix;
	f.n_names = rj->nnodes;
	f.names = names;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_FORMED;
	env.formed = &f;
	rnet_send(c, &env);
}

/* What every node brings, the host's own (mb[0], its ranks in mine) first;
 * here: the host's address, the one its joiners reached. */
static void gather(struct rdzv_job *rj, struct member *mb, uint32_t *mine, char *here,
		   size_t herelen)
{
	uint32_t k = 1, nmine = 0;

	for (uint32_t r = 0; r < rdzv_world(rj); r++)
		if (rdzv_plan(rj, r))
			mine[nmine++] = r;
	here[0] = '\0';
	for (struct rnet_conn *c = rnet_conns(rj->rd->net); c; c = c->next) {
		if (RJ(c) != rj || !JR(c) || c->dead)
			continue;
		if (!here[0])
			rnet_local_name(c->fd, here, herelen);
		mb[k] = (struct member){.c = c,
					.world = JR(c)->world,
					.nnodes = JR(c)->nnodes,
					.has_idx = JR(c)->has_idx,
					.idx = JR(c)->idx,
					.ranks = JR(c)->ranks,
					.nranks = JR(c)->nranks,
					.plan = JR(c)->plan,
					.lowest = JR(c)->ranks[0]};
		rdzv_joiner_name(c, mb[k].name, sizeof(mb[k].name));
		for (uint32_t i = 0; i < JR(c)->nranks; i++)
			mb[k].lowest = MIN(mb[k].lowest, JR(c)->ranks[i]);
		k++;
	}
	mb[0] = (struct member){.world = rdzv_world(rj),
				.nnodes = rj->nnodes,
				.has_idx = rj->has_node_rank,
				.idx = rj->node_rank,
				.ranks = mine,
				.nranks = nmine,
				.plan = rdzv_local_plan(rj),
				.lowest = mine[0]};
	snprintf(mb[0].name, sizeof(mb[0].name), "node %u (%s)",
		 rj->has_node_rank ? rj->node_rank : 0, here);
}

/* The checks, in order, numbering the nodes and naming them on the way:
 * 0, or a code with msg. */
static int check_members(struct rdzv_job *rj, struct member *mb, const char *here, char *msg,
			 size_t len)
{
	uint32_t n = rj->nnodes, k;
	char field[192];
	int code = 0;

	for (k = 1; k < n && !code; k++) {
		if (mb[k].nnodes != n) {
			snprintf(msg, len, "%s and %s differ at nnodes: %u vs %u", mb[0].name,
				 mb[k].name, n, mb[k].nnodes);
			code = ZC_EWORLD;
		} else if (mb[k].world != rdzv_world(rj)) {
			snprintf(msg, len, "%s and %s differ at world_size: %u vs %u", mb[0].name,
				 mb[k].name, rdzv_world(rj), mb[k].world);
			code = ZC_EWORLD;
		}
	}
	if (!code)
		code = assign_nodes(rj, mb, n, msg, len);
	for (k = 0; k < n && !code; k++) {
		snprintf(rj->names[mb[k].node], RNET_NAME_LEN, "%s", k ? mb[k].c->peer : here);
		if (k && strrchr(rj->names[mb[k].node], ':') && rj->names[mb[k].node][0] != '[')
			*strrchr(rj->names[mb[k].node], ':') = '\0';
	}
	for (k = 0; k < n && !code; k++)
		snprintf(mb[k].name, sizeof(mb[k].name), "node %u (%s)", mb[k].node,
			 rj->names[mb[k].node]);
	for (k = 1; k < n && !code; k++)
		if (plan_diff(mb[0].plan, mb[k].plan, field, sizeof(field))) {
			snprintf(msg, len, "plans differ between %s and %s at %s", mb[0].name,
				 mb[k].name, field);
			code = ZC_EPLANMISMATCH;
		}
	if (!code)
		code = check_ranks(rj, mb, n, msg, len);
	return code;
}

/* The host: every node joined; check and form, or fail on every node. */
static void form(struct rdzv_job *rj)
{
	uint32_t n = rj->nnodes, *mine = calloc(rdzv_world(rj), sizeof(*mine));
	struct member *mb = calloc(n, sizeof(*mb));
	char msg[400], here[RNET_NAME_LEN];
	const struct sockaddr *store_at;
	socklen_t store_len;
	uint8_t rnd[8];
	int code = 0;

	if (!mine || !mb || rdzv_alloc_formed(rj) < 0) {
		snprintf(msg, sizeof(msg), "out of memory forming the job");
		code = ZC_ELIMIT;
		goto out;
	}
	gather(rj, mb, mine, here, sizeof(here));
	code = check_members(rj, mb, here, msg, sizeof(msg));
	if (code)
		goto out;
	tls_random(rnd, sizeof(rnd));
	snprintf(rj->prefix, sizeof(rj->prefix), "%s/%02x%02x%02x%02x%02x%02x%02x%02x/", rj->sc.id,
		 rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	rj->node = mb[0].node;
	rj->host_node = mb[0].node;
	snprintf(rj->bind_addr, sizeof(rj->bind_addr), "%s", here);
	for (uint32_t k = 1; k < n; k++) {
		rj->node_conn[mb[k].node] = mb[k].c;
		send_formed(rj, mb[k].c, mb[k].node);
	}
	store_at = rnet_listener_addr(rj->lst, &store_len);
	if (rdzv_setup_net(rj, store_at, store_len) < 0) {
		snprintf(msg, sizeof(msg), "out of memory forming the job");
		code = ZC_ELIMIT;
		goto out;
	}
	rj->formed = true;
	rj->sc.store_open = true;
	log_info("job %s: formed over %u nodes (rendezvous %s, store prefix %s)", rj->sc.id, n,
		 rnet_listener_name(rj->lst), rj->prefix);
out:
	free(mine);
	free(mb);
	if (code)
		rdzv_fail(rj, code, "%s", msg); /* every node hears it */
	else
		rdzv_formed(rj);
}

void rdzv_maybe_form(struct rdzv_job *rj)
{
	uint32_t joined = 0;

	if (!rj->hosting || !rj->lst || rj->formed || !rj->local_ready || rdzv_ended(rj))
		return;
	for (struct rnet_conn *c = rnet_conns(rj->rd->net); c; c = c->next)
		joined += RJ(c) == rj && JR(c) && !c->dead;
	if (joined == rj->nnodes - 1)
		form(rj);
}

/* The host: why the job cannot form, once its join timeout passed. */
void rdzv_fail_missing(struct rdzv_job *rj)
{
	uint32_t n = rj->nnodes, joined = 1, nmissing = 0;
	bool named = rj->has_node_rank, *has_idx = calloc(n, sizeof(bool));
	bool *has_rank = calloc(rdzv_world(rj), sizeof(bool));
	char nodes[160] = "", ranks[160] = "";
	size_t at = 0;

	if (!has_idx || !has_rank) {
		free(has_idx);
		free(has_rank);
		rdzv_fail(rj, ZC_ETIMEDOUT, "not every node joined within %d ms",
			  rdzv_join_timeout_ms(rj));
		return;
	}
	if (rj->has_node_rank)
		has_idx[rj->node_rank] = true;
	for (uint32_t r = 0; r < rdzv_world(rj); r++)
		has_rank[r] = rdzv_plan(rj, r) != NULL;
	for (struct rnet_conn *c = rnet_conns(rj->rd->net); c; c = c->next) {
		if (RJ(c) != rj || !JR(c))
			continue;
		joined++;
		named = named && JR(c)->has_idx;
		if (JR(c)->has_idx && JR(c)->idx < n)
			has_idx[JR(c)->idx] = true;
		for (uint32_t i = 0; i < JR(c)->nranks; i++)
			if (JR(c)->ranks[i] < rdzv_world(rj))
				has_rank[JR(c)->ranks[i]] = true;
	}
	for (uint32_t k = 0; named && k < n && at + 12 < sizeof(nodes); k++)
		if (!has_idx[k])
			at += (size_t)snprintf(nodes + at, sizeof(nodes) - at, "%s%u",
					       nmissing++ ? ", " : "", k);
	at = 0;
	for (uint32_t r = 0, m = 0; r < rdzv_world(rj) && at + 12 < sizeof(ranks); r++)
		if (!has_rank[r])
			at += (size_t)snprintf(ranks + at, sizeof(ranks) - at, "%s%u",
					       m++ ? ", " : "", r);
	if (named && nmissing)
		rdzv_fail(rj, ZC_ETIMEDOUT,
			  "node%s %s did not join within %d ms (%u of %u nodes joined; no node has "
			  "rank%s %s)",
			  nmissing > 1 ? "s" : "", nodes, rdzv_join_timeout_ms(rj), joined, n,
			  strchr(ranks, ',') ? "s" : "", ranks[0] ? ranks : "-");
	else
		rdzv_fail(rj, ZC_ETIMEDOUT,
			  "%u of %u nodes did not join within %d ms (no node has rank%s %s)",
			  n - joined, n, rdzv_join_timeout_ms(rj), strchr(ranks, ',') ? "s" : "",
			  ranks[0] ? ranks : "-");
	free(has_idx);
	free(has_rank);
}

/* A Join that cannot be one of the job's nodes next to those here already:
 * it brings a rank this node (the host) or a node that joined has, or the
 * node index another claimed. Only that joiner is refused: the job waits on
 * for its real node. 0, or a code with msg. */
static int join_conflict(struct rdzv_job *rj, struct rnet_conn *c, const Zerod__V1__RdzvJoin *jn,
			 char *msg, size_t len)
{

	if (jn->world_size != rdzv_world(rj))
		return 0; /* told when forming, naming both nodes */
	for (size_t i = 0; i < jn->n_ranks; i++) {
		uint32_t r = jn->ranks[i];
		if (rdzv_rank_here(rj, r)) {
			snprintf(msg, len, "rank %u is on node %u (the rendezvous) already", r,
				 rj->has_node_rank ? rj->node_rank : 0);
			return ZC_EDUPRANK;
		}
		for (struct rnet_conn *o = rnet_conns(rj->rd->net); o; o = o->next) {
			if (o == c || RJ(o) != rj || !JR(o) || o->dead)
				continue;
			for (uint32_t q = 0; q < JR(o)->nranks; q++)
				if (JR(o)->ranks[q] == r) {
					snprintf(msg, len, "rank %u is on %s already", r, o->peer);
					return ZC_EDUPRANK;
				}
		}
	}
	if (!jn->has_node_rank)
		return 0;
	if (rj->has_node_rank && rj->node_rank == jn->node_rank) {
		snprintf(msg, len, "node %u is the rendezvous's own", jn->node_rank);
		return ZC_EWORLD;
	}
	for (struct rnet_conn *o = rnet_conns(rj->rd->net); o; o = o->next)
		if (o != c && RJ(o) == rj && JR(o) && !o->dead && JR(o)->has_idx &&
		    JR(o)->idx == jn->node_rank) {
			snprintf(msg, len, "node %u is %s already", jn->node_rank, o->peer);
			return ZC_EWORLD;
		}
	return 0;
}

void rdzv_on_join(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	const Zerod__V1__RdzvJoin *jn = m->join;
	struct rdzv_job *rj = RJ(c);
	struct joiner *jr;
	uint32_t joined = 0;
	char err[192], msg[256];
	bool *seen;
	int code;

	if (JR(c) || rj->formed) {
		snprintf(msg, sizeof(msg), "job %s has formed already with its %u nodes", rj->sc.id,
			 rj->nnodes);
		rnet_refuse(c, ZC_EJOBFAILED, msg);
		return;
	}
	for (struct rnet_conn *o = rnet_conns(rj->rd->net); o; o = o->next)
		joined += RJ(o) == rj && JR(o) && !o->dead;
	if (joined >= rj->nnodes - 1) {
		snprintf(msg, sizeof(msg), "job %s has all its %u nodes", rj->sc.id, rj->nnodes);
		rnet_peer_log(c->rn, "job %s: rendezvous: refused %s: %s", rj->sc.id, c->peer, msg);
		rnet_refuse(c, ZC_EWORLD, msg);
		return;
	}
	if (jn->world_size == 0 || jn->world_size > RDZV_MAX_WORLD || jn->n_ranks == 0 ||
	    jn->n_ranks > jn->world_size || jn->nnodes == 0 || jn->nnodes > RDZV_MAX_WORLD ||
	    (jn->has_node_rank && jn->node_rank >= jn->nnodes)) {
		rnet_refuse(c, ZC_EPROTO, "a Join with impossible ranks or nodes");
		return;
	}
	seen = calloc(jn->world_size, sizeof(*seen));
	if (!seen) {
		rnet_refuse(c, ZC_ELIMIT, "out of memory");
		return;
	}
	for (size_t i = 0; i < jn->n_ranks; i++) {
		if (jn->ranks[i] >= jn->world_size || seen[jn->ranks[i]]) {
			free(seen);
			rnet_refuse(c, ZC_EPROTO, "a Join with impossible ranks or nodes");
			return;
		}
		seen[jn->ranks[i]] = true;
	}
	free(seen);
	code = join_conflict(rj, c, jn, msg, sizeof(msg));
	if (code) {
		rnet_peer_log(c->rn, "job %s: rendezvous: refused %s: %s", rj->sc.id, c->peer, msg);
		rnet_refuse(c, code, msg);
		return;
	}
	jr = calloc(1, sizeof(*jr));
	if (!jr) {
		rnet_refuse(c, ZC_ELIMIT, "out of memory");
		return;
	}
	/* a world or node count that differs is reported when forming (it names
	 * the nodes), so a Join may carry no plan the host can read */
	if (jn->world_size == rdzv_world(rj) && jn->nnodes == rj->nnodes &&
	    plan_from_pb(jn->plan, &jr->plan, err, sizeof(err)) < 0) {
		snprintf(msg, sizeof(msg), "invalid plan: %s", err);
		rdzv_joiner_free(jr);
		rnet_refuse(c, ZC_EPLANINVAL, msg);
		return;
	}
	jr->ranks = malloc(jn->n_ranks * sizeof(*jr->ranks));
	if (!jr->ranks) {
		rdzv_joiner_free(jr);
		rnet_refuse(c, ZC_ELIMIT, "out of memory");
		return;
	}
	memcpy(jr->ranks, jn->ranks, jn->n_ranks * sizeof(*jr->ranks));
	jr->nranks = (uint32_t)jn->n_ranks;
	jr->world = jn->world_size;
	jr->nnodes = jn->nnodes;
	jr->has_idx = jn->has_node_rank;
	jr->idx = jn->node_rank;
	c->priv = jr; /* joined */
	log_info("job %s: rendezvous: %s joined with %u ranks (%u of %u nodes)", rj->sc.id, c->peer,
		 jr->nranks, joined + 2, rj->nnodes);
	rdzv_maybe_form(rj);
}
