/*
 * testkeys.h — TLS identities for tests between daemons: an Ed25519 key and
 * a self-signed certificate made with OpenSSL as `zeroctl keygen` makes
 * them, written as the files zerod reads (--tls-key, --tls-cert,
 * --tls-peers) and loaded by net/tls.h.
 */
#ifndef ZEROD_TEST_TESTKEYS_H
#define ZEROD_TEST_TESTKEYS_H

#include "net/tls.h"

/* A fresh identity: DIR/NAME.key (mode 0600) and DIR/NAME.crt; its
 * certificate's SHA-256 fingerprint in fp. 0 or -errno. */
int testkeys_make(const char *dir, const char *name, char fp[TLS_FP_HEX + 1]);

/* Write DIR/NAME.peers with the n fingerprints given. 0 or -errno. */
int testkeys_peers(const char *dir, const char *name, const char *const *trust, int n);

/* The identity DIR/NAME trusting the n fingerprints given (written to
 * DIR/NAME.peers); NULL (with why on stdout) if it does not load. */
struct tls_ident *testkeys_load(const char *dir, const char *name, const char *const *trust, int n);

#endif
