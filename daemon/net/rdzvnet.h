/*
 * rdzvnet.h — the daemon-to-daemon transport of the rendezvous (rdzvnet.c),
 * its key-value store server (rdzvkv.c) and its resolver thread
 * (resolve.c). It knows nothing of jobs: a connection belongs to a scope
 * (the id and secret its handshake proves, the store it may use), and what
 * a message means for the scope's owner is the owner's, told through the
 * table of callbacks it registers (struct rnet_ops), as nng's transports
 * report to their sockets.
 *
 * Everything here runs on the loop thread and never blocks, except the
 * resolver's own threads (getaddrinfo may block).
 */
#ifndef ZEROD_RDZVNET_H
#define ZEROD_RDZVNET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "zerod.pb-c.h"
#include "net/rdzvwire.h"

#define RNET_NAME_LEN 64

struct loop;
struct tls_ident;
struct ssl_st;
struct rnet;
struct rnet_listener;
struct rnet_kv;

/* What connections belong to: the owner (a job over several nodes) embeds
 * it and fills it; the transport reads it, and keeps its store. */
struct rnet_scope {
	const char *id;        /* what the Hello's proofs bind (the job id) */
	const uint8_t *secret; /* the secret both sides prove they know */
	size_t secret_len;
	uint8_t psk_id[32], psk_key[32]; /* rnet_scope_keys(): the job's TLS PSK */
	const char *endpoint; /* a node: the host's address, as the owner names it */
	bool store_open;      /* the store serves keys (once the job formed) */
	const char *prefix;   /* the keys it serves start with this */
	struct rnet_kv *kv;   /* the store (rdzvkv.c) */
	unsigned nkv;
	size_t kv_bytes;
	void *owner;
};

enum rnet_conn_state {
	CS_CONNECTING, /* a node's connect() is in progress */
	CS_TLS,        /* the TLS handshake (net/tls.h) */
	CS_HELLO,      /* host: waits for Hello; node: for Welcome */
	CS_OPEN,       /* bound to its job */
	CS_CLOSING,    /* sends what is queued, then closes */
};

/* One connection. The owner reads these fields and writes only priv (its
 * per-connection data, freed by its ops->freed) and, inside ops->gone, sc. */
struct rnet_conn {
	struct rnet *rn;
	struct rnet_conn *next;
	int fd;
	bool server;               /* accepted by a listener (else a node's join) */
	struct rnet_listener *lst; /* server: where */
	struct rnet_scope *sc;     /* its scope (server: once its Hello named one) */
	enum rnet_conn_state st;
	unsigned kind; /* ZEROD__V1__RDZV_KIND__RDZV_JOIN or _STORE */
	bool unauth;   /* counts against RDZV_MAX_UNAUTH */
	bool psk_unknown; /* host: its PSK matched no job served here */
	bool dead;     /* freed at the next chance, never inside a call that walks conns */
	char err[160]; /* why it died, where a write knew (ops->gone hears it) */
	bool want_out;
	int64_t deadline; /* handshake, or CS_CLOSING's flush */
	char peer[RNET_NAME_LEN];
	struct ssl_st *ssl; /* its TLS (net/tls.h) */
	uint8_t psk_id[32]; /* host, PSK: the identity its handshake matched */
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off;
	void *priv; /* the owner's */
};

/* How the transport reports up; every member is called on the loop thread,
 * with the ctx given to rnet_new(). */
struct rnet_ops {
	/* A PSK handshake on ls offers identity id: the scope whose
	 * rnet_scope_keys() gave that identity, or NULL. */
	const struct rnet_scope *(*psk)(void *ctx, const struct rnet_listener *ls,
					const uint8_t id[32]);
	/* A Hello on ls names scope id: the scope whose secret the peer must
	 * prove, or NULL with a reason in msg (for the log: the peer gets
	 * the one refusal every unproven peer gets). */
	struct rnet_scope *(*hello)(void *ctx, const struct rnet_listener *ls, const char *id,
				    int *ret_code, char *msg, size_t len);
	/* A message that is the owner's (Join, Fail, Formed, NodeLost), on c
	 * (c->sc set), in the role, state and kind the protocol allows it. */
	void (*message)(void *ctx, struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m);
	/* A node's connection c passed its handshake: the host is open. */
	void (*open)(void *ctx, struct rnet_conn *c);
	/* A node's handshake with the host failed for good (a wrong key or
	 * secret): code and msg name it; c goes (ops->gone follows). */
	void (*refused)(void *ctx, struct rnet_conn *c, int code, const char *msg);
	/* c (c->sc set) is gone: closed, broken, refused. The owner may set
	 * c->sc to NULL early; the transport does after. */
	void (*gone)(void *ctx, struct rnet_conn *c, const char *why);
	/* c (c->sc set) is freed now: forget it, free c->priv. */
	void (*freed)(void *ctx, struct rnet_conn *c);
};

/* The transport: 0 or -errno. hello_timeout_ms is read at each use (the
 * config may change it). */
int rnet_new(struct loop *l, const int *hello_timeout_ms, const struct rnet_ops *ops, void *ctx,
	     struct rnet **ret);
/* Closes every connection, listener and resolver. Accepts NULL. */
void rnet_free(struct rnet *rn);
/* Certificates from now on (id owned by the transport): ZC_... / -ENOMEM
 * with why. Without, every connection is under its job's PSK. */
int rnet_tls_use(struct rnet *rn, struct tls_ident *id, char *why, size_t len);
const struct tls_ident *rnet_tls(const struct rnet *rn);
/* Fill sc's PSK from its id and secret (once they are set). */
void rnet_scope_keys(struct rnet_scope *sc);
/* Every connection, newest first (read only). */
struct rnet_conn *rnet_conns(const struct rnet *rn);
/* The nearest connection deadline, and what is due. */
int64_t rnet_next_deadline(const struct rnet *rn);
void rnet_tick(struct rnet *rn, int64_t now);

/* Listen on the port of addr (its address, or every address when addr is
 * not this machine's), or share the listener there: one reference, given
 * back with rnet_listener_put(). ZC_E... with err filled. */
int rnet_listen(struct rnet *rn, const struct sockaddr_storage *addr, socklen_t addrlen,
		const char *endpoint, struct rnet_listener **ret, char *err, size_t errlen);
void rnet_listener_put(struct rnet_listener *ls);
const char *rnet_listener_name(const struct rnet_listener *ls);
/* Where this host's own store client connects to ls. */
const struct sockaddr *rnet_listener_addr(const struct rnet_listener *ls, socklen_t *ret_len);
/* The names of the listeners, at most max, valid until the loop goes on. */
size_t rnet_serving(const struct rnet *rn, const char **names, size_t max);

/* A node's connection to the host at addr for scope sc, its handshake
 * queued; -errno with why filled when it cannot start. */
int rnet_connect(struct rnet *rn, struct rnet_scope *sc, const struct sockaddr_storage *addr,
		 socklen_t addrlen, const char *peer, struct rnet_conn **ret, char *why,
		 size_t whylen);
/* Queue one message and write what can be (once the TLS handshake is done).
 * Never frees c: one that cannot take it is marked dead. */
void rnet_send(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *env);
void rnet_send_fail(struct rnet_conn *c, int code, const char *msg, uint64_t iteration, bool quiet);
void rnet_send_reform(struct rnet_conn *c, uint32_t rank, uint64_t iteration, bool undo,
		      const char *msg);
/* Send a last word, then close once it is out. */
void rnet_refuse(struct rnet_conn *c, int code, const char *msg);
/* Close and free c now (ops->freed runs, not ops->gone): its owner went. */
void rnet_conn_free(struct rnet_conn *c);
/* c is gone: marks it dead and tells its owner (ops->gone). */
void rnet_gone(struct rnet_conn *c, const char *why);
/* Lines a remote peer causes: at most RDZV_LOG_PER_SEC a second. */
__attribute__((format(printf, 2, 3))) void rnet_peer_log(struct rnet *rn, const char *fmt, ...);
/* The local address (no port) fd's connection leaves from. */
void rnet_local_name(int fd, char *buf, size_t len);

/* rdzvkv.c: the store server, on the host's store connections. */
void rnet_kv_set(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m);
void rnet_kv_get(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m);
/* Free sc's store. */
void rnet_kv_clear(struct rnet_scope *sc);

/* resolve.c: resolve host:port on a thread of its own; done runs on the
 * loop thread with 0 and the address, or -errno and why. */
typedef void rnet_resolved_fn(void *arg, int err, const char *why,
			      const struct sockaddr_storage *addr, socklen_t addrlen);
struct rnet_resolve;
int rnet_resolve(struct rnet *rn, const char *host, const char *port, rnet_resolved_fn *done,
		 void *arg, struct rnet_resolve **ret);
/* done will not run (the asker went). */
void rnet_resolve_cancel(struct rnet_resolve *res);

#endif
