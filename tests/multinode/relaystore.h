/*
 * relaystore.h — a struct coll_store for test "nodes" (processes of one
 * machine) that puts a TCP relay between them and the addresses they
 * publish: every value read is rewritten to point at a relay thread of the
 * reading process ("127.0.0.1:PORT", the sealed mesh's, or a sockaddr_in of
 * 127.0.0.1 inside gloo's bytes), which forwards to the real port, appends
 * every byte both ways to DIR/relay.PID.PORT.rec, and can change or repeat
 * one frame that the connecting side sends on the first connection it
 * relays: a TLS record of application data of at least RELAY_DATA_RECORD
 * bytes (the mesh's data; the handshake's records are smaller), counted
 * from 1.
 */
#ifndef ZEROD_TEST_RELAYSTORE_H
#define ZEROD_TEST_RELAYSTORE_H

#include "coll/coll.h"

#define RELAY_DATA_RECORD 1024

enum relay_mode {
	RELAY_PLAIN,  /* forward and record only */
	RELAY_FLIP,   /* the last byte of frame `frame` flipped */
	RELAY_REPLAY, /* frame `frame` sent twice */
};

/* A store over filestore_new(dir) whose values are read through relays.
 * Free with relaystore_free() once nothing uses it (its relays run until
 * the process ends). Aborts on ENOMEM. */
struct coll_store relaystore_new(const char *dir, enum relay_mode mode, int frame);
void relaystore_free(struct coll_store *s);

#endif
