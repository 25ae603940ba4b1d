/*
 * resolve.c — the rendezvous's resolver (rdzvnet.h): getaddrinfo may block,
 * and the loop must not, so each name is resolved on a thread of its own,
 * which posts to an eventfd the loop watches; the loop thread joins it and
 * calls its asker back. Owns those threads and their list (under rn->mu,
 * the one thing the threads and the loop share).
 */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/loop.h"
#include "net/rnet_int.h"

struct rnet_resolve {
	struct rnet_resolve *next;
	struct rnet *rn;
	rnet_resolved_fn *done_fn; /* NULL once the asker went (loop thread only) */
	void *arg;
	pthread_t thread;
	bool done; /* under rn->mu */
	char host[RDZV_ENDPOINT_MAX + 1], port[8];
	int err;
	char why[160];
	struct sockaddr_storage addr;
	socklen_t addrlen;
};

static void *resolve_main(void *arg)
{
	struct rnet_resolve *res = arg;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	uint64_t one = 1;
	int r = getaddrinfo(res->host, res->port, &hints, &ai);

	if (r != 0) {
		res->err = r == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
		snprintf(res->why, sizeof(res->why), "cannot resolve %.64s: %s", res->host,
			 gai_strerror(r));
	} else {
		/* IPv4 first: what a plain host:port usually means */
		struct addrinfo *pick = ai;
		for (struct addrinfo *p = ai; p; p = p->ai_next)
			if (p->ai_family == AF_INET) {
				pick = p;
				break;
			}
		memcpy(&res->addr, pick->ai_addr, pick->ai_addrlen);
		res->addrlen = pick->ai_addrlen;
		freeaddrinfo(ai);
	}
	pthread_mutex_lock(&res->rn->mu);
	res->done = true;
	pthread_mutex_unlock(&res->rn->mu);
	(void)!write(res->rn->efd, &one, sizeof(one));
	return NULL;
}

static void on_resolved(struct loop *l, void *userdata)
{
	struct rnet *rn = userdata;
	uint64_t n;

	(void)l;
	(void)!read(rn->efd, &n, sizeof(n));
	for (;;) {
		struct rnet_resolve *res = NULL, **pp;
		pthread_mutex_lock(&rn->mu);
		for (pp = &rn->resolving; *pp; pp = &(*pp)->next)
			if ((*pp)->done) {
				res = *pp;
				*pp = res->next;
				break;
			}
		pthread_mutex_unlock(&rn->mu);
		if (!res)
			return;
		pthread_join(res->thread, NULL);
		if (res->done_fn)
			res->done_fn(res->arg, res->err, res->why, &res->addr, res->addrlen);
		free(res);
	}
}

int rnet_resolve(struct rnet *rn, const char *host, const char *port, rnet_resolved_fn *done,
		 void *arg, struct rnet_resolve **ret)
{
	struct rnet_resolve *res = calloc(1, sizeof(*res));

	if (!res)
		return -ENOMEM;
	res->rn = rn;
	res->done_fn = done;
	res->arg = arg;
	snprintf(res->host, sizeof(res->host), "%s", host);
	snprintf(res->port, sizeof(res->port), "%s", port);
	pthread_mutex_lock(&rn->mu);
	if (pthread_create(&res->thread, NULL, resolve_main, res) != 0) {
		pthread_mutex_unlock(&rn->mu);
		free(res);
		return -EAGAIN;
	}
	res->next = rn->resolving;
	rn->resolving = res;
	pthread_mutex_unlock(&rn->mu);
	*ret = res;
	return 0;
}

void rnet_resolve_cancel(struct rnet_resolve *res)
{
	if (res)
		res->done_fn = NULL;
}

int rnet_resolver_init(struct rnet *rn)
{
	int r;

	pthread_mutex_init(&rn->mu, NULL);
	rn->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rn->efd < 0) {
		r = -errno;
		pthread_mutex_destroy(&rn->mu);
		return r;
	}
	r = loop_add_fd(rn->loop, rn->efd, on_resolved, rn);
	if (r < 0) {
		close(rn->efd);
		pthread_mutex_destroy(&rn->mu);
		return r;
	}
	return 0;
}

void rnet_resolver_fini(struct rnet *rn)
{
	pthread_mutex_lock(&rn->mu);
	while (rn->resolving) {
		struct rnet_resolve *res = rn->resolving;
		rn->resolving = res->next;
		pthread_mutex_unlock(&rn->mu);
		pthread_join(res->thread, NULL);
		free(res);
		pthread_mutex_lock(&rn->mu);
	}
	pthread_mutex_unlock(&rn->mu);
	loop_remove_fd(rn->loop, rn->efd);
	close(rn->efd);
	pthread_mutex_destroy(&rn->mu);
}
