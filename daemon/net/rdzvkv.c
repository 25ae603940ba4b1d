/*
 * rdzvkv.c — the key-value store node 0 serves each job over several nodes
 * (rdzvnet.h), for the gloo groups its executors open (their store client
 * is core/rdzvstore.c). One store a scope, kept in the scope; keys under
 * the scope's prefix only, RDZV_KV_KEYS keys and RDZV_KV_BYTES at most; a
 * request out of bounds is refused and the connection closed. Runs on the
 * loop thread.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "zeroclient.h"
#include "net/rdzvnet.h"

#define RDZV_KV_KEYS  1024
#define RDZV_KV_BYTES (16u << 20)

struct rnet_kv {
	struct rnet_kv *next;
	char *key;
	void *value;
	size_t len;
};

static struct rnet_kv *kv_find(struct rnet_scope *sc, const char *key)
{
	for (struct rnet_kv *e = sc->kv; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

static bool key_ok(const struct rnet_scope *sc, const char *key)
{
	size_t n = strlen(sc->prefix);

	if (strlen(key) > RDZV_KEY_MAX || strncmp(key, sc->prefix, n) != 0)
		return false;
	for (const char *k = key; *k; k++)
		if (*k < 0x21 || *k > 0x7e)
			return false;
	return true;
}

void rnet_kv_set(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__StoreReply rep = ZEROD__V1__STORE_REPLY__INIT;
	struct rnet_scope *sc = c->sc;
	const Zerod__V1__StoreSet *s = m->store_set;
	struct rnet_kv *e;
	void *v;

	if (!sc->store_open || !key_ok(sc, s->key) || s->value.len > RDZV_VALUE_MAX) {
		rnet_refuse(c, ZC_EPROTO, "store: that key or value is not this job's to set");
		return;
	}
	e = kv_find(sc, s->key);
	if ((!e && sc->nkv >= RDZV_KV_KEYS) ||
	    sc->kv_bytes - (e ? e->len : 0) + s->value.len > RDZV_KV_BYTES) {
		rnet_refuse(c, ZC_ELIMIT, "store: full");
		return;
	}
	v = malloc(s->value.len ? s->value.len : 1);
	if (!v || (!e && !(e = calloc(1, sizeof(*e))))) {
		free(v);
		rnet_refuse(c, ZC_ELIMIT, "store: out of memory");
		return;
	}
	if (!e->key) {
		e->key = strdup(s->key);
		if (!e->key) {
			free(e);
			free(v);
			rnet_refuse(c, ZC_ELIMIT, "store: out of memory");
			return;
		}
		e->next = sc->kv;
		sc->kv = e;
		sc->nkv++;
	}
	sc->kv_bytes += s->value.len - e->len;
	free(e->value);
	memcpy(v, s->value.data, s->value.len);
	e->value = v;
	e->len = s->value.len;
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_REPLY;
	env.store_reply = &rep;
	rnet_send(c, &env);
}

void rnet_kv_get(struct rnet_conn *c, const Zerod__V1__RdzvEnvelope *m)
{
	Zerod__V1__RdzvEnvelope env = ZEROD__V1__RDZV_ENVELOPE__INIT;
	Zerod__V1__StoreReply rep = ZEROD__V1__STORE_REPLY__INIT;
	struct rnet_scope *sc = c->sc;
	struct rnet_kv *e;

	if (!sc->store_open || !key_ok(sc, m->store_get->key)) {
		rnet_refuse(c, ZC_EPROTO, "store: that key is not this job's");
		return;
	}
	e = kv_find(sc, m->store_get->key);
	if (e) {
		rep.has_value = 1;
		rep.value = (ProtobufCBinaryData){e->len, e->value};
	}
	env.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_STORE_REPLY;
	env.store_reply = &rep;
	rnet_send(c, &env);
}

void rnet_kv_clear(struct rnet_scope *sc)
{
	while (sc->kv) {
		struct rnet_kv *e = sc->kv;
		sc->kv = e->next;
		free(e->key);
		free(e->value);
		free(e);
	}
	sc->nkv = 0;
	sc->kv_bytes = 0;
}
