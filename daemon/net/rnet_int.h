/*
 * rnet_int.h — what rdzvnet.c, rdzvkv.c and resolve.c share inside net/:
 * the transport's state, its listeners, the resolver's. Nothing above net/
 * includes it.
 */
#ifndef ZEROD_RNET_INT_H
#define ZEROD_RNET_INT_H

#include <pthread.h>

#include <openssl/ssl.h>

#include "net/rdzvnet.h"

struct rnet_listener {
	struct rnet *rn;
	struct rnet_listener *next;
	int fd;
	uint16_t port;
	unsigned refs; /* scopes hosting on it */
	char name[RNET_NAME_LEN];
	struct sockaddr_storage addr; /* bound; where this host's own store client connects */
	socklen_t addrlen;
};

struct rnet {
	struct loop *loop;
	const int *hello_timeout_ms;
	const struct rnet_ops *ops;
	void *ctx;
	struct rnet_listener *listeners;
	struct rnet_conn *conns;
	unsigned nunauth;
	int efd; /* a resolver finished */
	pthread_mutex_t mu;
	struct rnet_resolve *resolving;
	int64_t log_window;
	unsigned log_count, log_dropped;
	struct tls_ident *ident;    /* TLS identity (NULL: the jobs' PSKs) */
	SSL_CTX *srv, *cli;         /* with ident */
	SSL_CTX *psk_srv, *psk_cli; /* without */
};

/* resolve.c: the eventfd and list of rn's resolvers (rnet_new(), rnet_free()). */
int rnet_resolver_init(struct rnet *rn);
void rnet_resolver_fini(struct rnet *rn);

#endif
