/*
 * rdzvstore.h — the key-value store a job's gloo group opens through
 * (struct coll_store), as a client of the rendezvous on node 0 (rdzv.c
 * serves it). Blocking: called by the executor's start, never by the loop.
 */
#ifndef ZEROD_RDZVSTORE_H
#define ZEROD_RDZVSTORE_H

#include <stddef.h>
#include <sys/socket.h>

#include "coll/coll.h"

struct rdzv_store;

struct tls_ident;

/* A store client of job `job` at addr, proving `secret`; it connects on
 * first use, over TLS: with the daemon's certificates when tls is not NULL
 * (it must outlive the client), else under the job's PSK. Every wait is bounded by timeout_ms.
 * Copies its other arguments. */
int rdzv_store_new(const struct sockaddr *addr, socklen_t addrlen, const char *job,
		   const void *secret, size_t secret_len, const struct tls_ident *tls,
		   int timeout_ms, struct rdzv_store **ret);
/* The coll_store calling it (valid while s lives). */
struct coll_store rdzv_store_ops(struct rdzv_store *s);
/* The gets of the next executor wait again after an earlier one's stop
 * cancelled them (coll_store.cancel). Loop thread, no executor opening. */
void rdzv_store_resume(struct rdzv_store *s);
/* Closes its connection. Accepts NULL. Nothing may be calling it. */
void rdzv_store_free(struct rdzv_store *s);

#endif
